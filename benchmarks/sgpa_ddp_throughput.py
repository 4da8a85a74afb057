"""Training throughput of SGPA with 1 process vs ``torchrun --nproc-per-node 2`` (gloo on CPU, NCCL on CUDA).

Each measurement is a fresh run of this script as a worker (1 process, or 2 under torchrun) that
trains the calibration runner's Fashion-MNIST-sized ``SGPAViT`` (28 x 28 images, patch
``--patch-size``, 2 layers, d = 64, 32 global keys) on random images with the runner's
``train_classifier``: one warm-up epoch, then one timed epoch of ``--steps`` global batches of
``--batch-size``.  The two set-ups alternate ``--repeats`` times (machine load hits both alike) and
the medians of the examples per second and their ratio are printed.  Every worker process uses one
thread, so 2 processes use 2 cores.  ``--device cuda`` puts each process on its own GPU
(``cuda:LOCAL_RANK``, NCCL), so it needs at least 2 GPUs.

    python benchmarks/sgpa_ddp_throughput.py [--repeats 3 --steps 10 --batch-size 100]
    python benchmarks/sgpa_ddp_throughput.py --device cuda
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch
from devices import add_device_argument, device_from_args, synchronize

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root: the experiments/ tree


def worker(args) -> None:
    from experiments.sgpa import distributed
    from experiments.sgpa.training import Split, train_classifier
    from gpytorch_sgpa import SGPAELBO, SGPAViT

    torch.set_num_threads(1)
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    joined = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if joined:  # the backend of the device asked for (init_from_environment picks NCCL whenever CUDA exists)
        torch.distributed.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    distributed.init_from_environment()
    torch.manual_seed(0)
    size = args.steps * args.batch_size
    data = Split(torch.rand(size, 1, 28, 28).to(device), torch.randint(0, 10, (size,)).to(device))
    model = SGPAViT(
        image_size=28,
        patch_size=args.patch_size,
        in_channels=1,
        num_classes=10,
        d_model=64,
        num_heads=4,
        num_layers=2,
        attention="sgpa",
        dropout=0.1,
        attention_kwargs={"num_global": 32, "sampler": args.sampler},
    ).to(device)
    elbo = SGPAELBO(model, num_data=size).to(device)
    train_classifier(model, data, epochs=1, batch_size=args.batch_size, lr=1e-3, elbo=elbo, progress=False)
    synchronize(device)
    start = time.perf_counter()
    train_classifier(model, data, epochs=1, batch_size=args.batch_size, lr=1e-3, elbo=elbo, progress=False)
    synchronize(device)
    seconds = time.perf_counter() - start
    if distributed.is_main():
        print(f"RESULT {size / seconds:.3f}")
    if joined:
        torch.distributed.destroy_process_group()


def _measure(command: list[str]) -> float:
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    output = subprocess.run(command, env=environment, capture_output=True, text=True, check=True).stdout
    return float(next(line for line in output.splitlines() if line.startswith("RESULT")).split()[1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--patch-size", type=int, default=7, help="7 -> 16 tokens (the calibration runs); 4 -> 49")
    parser.add_argument("--sampler", default="diagonal")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    add_device_argument(parser)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    if device_from_args(parser, args).type == "cuda" and torch.cuda.device_count() < 2:
        parser.error(f"--device cuda: the 2-process run needs 2 GPUs (one per process), found {torch.cuda.device_count()}")
    options = [
        "--worker",
        "--steps",
        str(args.steps),
        "--batch-size",
        str(args.batch_size),
        "--patch-size",
        str(args.patch_size),
        "--sampler",
        args.sampler,
        "--device",
        args.device,
    ]
    single = [sys.executable, __file__, *options]
    double = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", __file__, *options]
    double_name = f"2 processes (torchrun, {'nccl' if args.device == 'cuda' else 'gloo'})"
    rates = {"1 process": [], double_name: []}
    for _ in range(args.repeats):
        rates["1 process"].append(_measure(single))
        rates[double_name].append(_measure(double))
    medians = {name: statistics.median(values) for name, values in rates.items()}
    for name, values in rates.items():
        print(f"{name:30s} median {medians[name]:8.1f} examples/s   runs: {', '.join(f'{v:.1f}' for v in values)}")
    ratio = medians[double_name] / medians["1 process"]
    print(f"speed-up 2 vs 1 process: {ratio:.2f}x (ideal 2.00x)")


if __name__ == "__main__":
    main()
