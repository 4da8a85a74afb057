"""Training throughput of SGPA with 1 process vs ``torchrun --nproc-per-node 2`` (gloo, CPU).

Each measurement is a fresh run of this script as a worker (1 process, or 2 under torchrun) that
trains the calibration runner's Fashion-MNIST-sized ``SGPAViT`` (28 x 28 images, patch
``--patch-size``, 2 layers, d = 64, 32 global keys) on random images with the runner's
``train_classifier``: one warm-up epoch, then one timed epoch of ``--steps`` global batches of
``--batch-size``.  The two set-ups alternate ``--repeats`` times (machine load hits both alike) and
the medians of the examples per second and their ratio are printed.  Every worker process uses one
thread, so 2 processes use 2 cores.

    python benchmarks/sgpa_ddp_throughput.py [--repeats 3 --steps 10 --batch-size 100]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch


def worker(args) -> None:
    from gpytorch_sgpa import SGPAELBO, SGPAViT
    from gpytorch_sgpa.experiments import distributed
    from gpytorch_sgpa.experiments.training import Split, train_classifier

    torch.set_num_threads(1)
    distributed.init_from_environment()
    torch.manual_seed(0)
    size = args.steps * args.batch_size
    data = Split(torch.rand(size, 1, 28, 28), torch.randint(0, 10, (size,)))
    model = SGPAViT(image_size=28, patch_size=args.patch_size, in_channels=1, num_classes=10, d_model=64,
                    num_heads=4, num_layers=2, attention="sgpa", dropout=0.1,
                    attention_kwargs={"num_global": 32, "sampler": args.sampler})
    elbo = SGPAELBO(model, num_data=size)
    train_classifier(model, data, epochs=1, batch_size=args.batch_size, lr=1e-3, elbo=elbo, progress=False)
    start = time.perf_counter()
    train_classifier(model, data, epochs=1, batch_size=args.batch_size, lr=1e-3, elbo=elbo, progress=False)
    seconds = time.perf_counter() - start
    if distributed.is_main():
        print(f"RESULT {size / seconds:.3f}")
    distributed.shutdown()


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
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    options = ["--worker", "--steps", str(args.steps), "--batch-size", str(args.batch_size),
               "--patch-size", str(args.patch_size), "--sampler", args.sampler]
    single = [sys.executable, __file__, *options]
    double = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", __file__, *options]
    rates = {"1 process": [], "2 processes (torchrun, gloo)": []}
    for _ in range(args.repeats):
        rates["1 process"].append(_measure(single))
        rates["2 processes (torchrun, gloo)"].append(_measure(double))
    medians = {name: statistics.median(values) for name, values in rates.items()}
    for name, values in rates.items():
        print(f"{name:30s} median {medians[name]:8.1f} examples/s   runs: {', '.join(f'{v:.1f}' for v in values)}")
    ratio = medians["2 processes (torchrun, gloo)"] / medians["1 process"]
    print(f"speed-up 2 vs 1 process: {ratio:.2f}x (ideal 2.00x)")


if __name__ == "__main__":
    main()
