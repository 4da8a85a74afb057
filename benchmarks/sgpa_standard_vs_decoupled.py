"""Cost of one SGPA layer against sequence length: standard against decoupled (thesis §3.2.2-3.3.2, Table 3.1).

Standard SGPA (thesis eq. (3.4)) uses the T amortised keys of a sequence as its inducing inputs, with an
input-dependent T x T covariance: a Cholesky of K_kk per sequence and head, O(T^3), and a
projection W_s with one column per position, so its parameters grow with T (``max_len``).  Decoupled
SGPA adds M global keys shared by every sequence: its covariance is M x M and its parameters do
not depend on T.  This script builds both layers (same width, heads and kernel; decoupled: orthogonal, M
global keys) for each T and times them side by side in one run, interleaved repeat by repeat:

* a training step: forward, ``output.square().mean() + kl``, backward;
* inference: one forward pass in eval mode without gradients.

It prints the median seconds, the ratio standard / decoupled and each layer's parameter count.

    python benchmarks/sgpa_standard_vs_decoupled.py --threads 1 [--lengths 16 64 256 512 --batch-size 8 --repeats 5]
"""

from __future__ import annotations

import argparse
import statistics

import torch
from devices import add_device_argument, describe, device_from_args, elapsed

from gpytorch_sgpa.attention import SGPA_SAMPLERS, SGPAttention


def make_layers(length: int, args: argparse.Namespace, device: torch.device) -> dict[str, SGPAttention]:
    """The standard layer (``max_len = length``) and the decoupled one, from the same seed."""
    common = dict(d_model=args.d_model, num_heads=args.num_heads, kernel=args.kernel, sampler=args.sampler)
    torch.manual_seed(0)
    standard = SGPAttention(mode="standard", max_len=length, **common)
    torch.manual_seed(0)
    decoupled = SGPAttention(mode="decoupled", variant="orthogonal", num_global=args.num_global, **common)
    return {"standard": standard.to(device), "decoupled": decoupled.to(device)}


def train_step(layer: SGPAttention, x: torch.Tensor) -> None:
    """Forward, a loss with the layer's KL, backward."""
    layer.zero_grad(set_to_none=True)
    output, kl = layer(x)
    (output.square().mean() + kl).backward()


def infer(layer: SGPAttention, x: torch.Tensor) -> None:
    """One forward pass without gradients."""
    with torch.no_grad():
        layer(x)


def measure(length: int, args: argparse.Namespace, device: torch.device) -> dict[str, dict[str, float]]:
    """Median seconds of a training step and of inference, and the parameter count, per layer at ``length`` tokens."""
    layers = make_layers(length, args, device)
    x = torch.randn(args.batch_size, length, args.d_model, generator=torch.Generator().manual_seed(1)).to(device)
    times: dict[str, dict[str, list[float]]] = {name: {"train": [], "infer": []} for name in layers}
    for phase, fn, training in (("train", train_step, True), ("infer", infer, False)):
        for layer in layers.values():
            layer.train(training)
            fn(layer, x)  # warm-up
        for _ in range(args.repeats):
            for name, layer in layers.items():
                seconds, _ = elapsed(lambda: fn(layer, x), device)
                times[name][phase].append(seconds)
    return {
        name: {
            "train": statistics.median(times[name]["train"]),
            "infer": statistics.median(times[name]["infer"]),
            "parameters": sum(p.numel() for p in layers[name].parameters()),
        }
        for name in layers
    }


def main(argv=None) -> dict[int, dict[str, dict[str, float]]]:
    """The command line (module docstring); returns, per T, each layer's medians and parameter count."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[16, 64, 256, 512], help="sequence lengths T")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--d-model", type=int, default=64, help="layer width (the calibration runner's)")
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--num-global", type=int, default=32, help="global keys M of the decoupled layer (the thesis's CIFAR10 value)")
    parser.add_argument("--kernel", default="rbf")
    parser.add_argument("--sampler", default="diagonal", choices=SGPA_SAMPLERS, help="both layers' sampler (default: the thesis's)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats per layer, interleaved")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (pass 1 on a shared CPU)")
    add_device_argument(parser)
    args = parser.parse_args(argv)
    if args.sampler == "decomposed":
        parser.error("--sampler decomposed is decoupled only; use diagonal or full")
    device = device_from_args(parser, args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    print(
        f"device {describe(device)}, {torch.get_num_threads()} threads, batch {args.batch_size}, d_model {args.d_model}, "
        f"{args.num_heads} heads, {args.kernel} kernel, sampler {args.sampler}, decoupled: orthogonal, "
        f"M = {args.num_global}; median of {args.repeats}"
    )
    print(
        "\n| T | training step, standard (s) | decoupled (s) | standard / decoupled | inference, standard (s) | "
        "decoupled (s) | standard / decoupled | parameters, standard | decoupled |\n|---|---|---|---|---|---|---|---|---|"
    )
    results = {}
    for length in args.lengths:
        row = results[length] = measure(length, args, device)
        s, d = row["standard"], row["decoupled"]
        print(
            f"| {length} | {s['train']:.4f} | {d['train']:.4f} | {s['train'] / d['train']:.2f} | {s['infer']:.4f} | "
            f"{d['infer']:.4f} | {s['infer'] / d['infer']:.2f} | {s['parameters']:,} | {d['parameters']:,} |",
            flush=True,
        )
    return results


if __name__ == "__main__":
    main()
