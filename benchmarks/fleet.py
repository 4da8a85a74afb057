"""A fleet of online GPs: S independent streams as one batched ``OnlineSGPR`` against a Python loop over S
single-stream models, same data and hyperparameters, printed as a ratio measured in one run.

Each stream is its own draw (an RBF-GP sample through random Fourier features, its own length scale and
noise), learned in ``--tasks`` tasks of ``--size`` points with ``M`` inducing points spread over the
stream (OSGPR-fixed, batched as tensors), or with ``--variables hippo`` ``M`` LegS bases per stream, each
stream with its own clock (lyapunov backend: with the RBF kernels here, one batched Lyapunov step forms every
stream's covariances, :mod:`gpytorch_hippo.inducing.lyapunov_batched`). Times are the updates' wall time (one
torch thread); the batched model's per-stream memory is its stored summary. The last task's posterior mean at 20
points per stream is compared between the two.

    python benchmarks/fleet.py                          # S = 1,000, 50 tasks of 50 points, M = 32 and 64
    python benchmarks/fleet.py --streams 100 --tasks 10
    python benchmarks/fleet.py --scaling                # time per task per stream at S = 100, 1,000, 10,000 (M = 32)
    python benchmarks/fleet.py --variables hippo --streams 100 --tasks 10   # LegS bases, a clock per stream
    python benchmarks/fleet.py --variables hippo --shared                   # ... with one kernel for every stream
    python benchmarks/fleet.py --variables hippo --threads 2                # the batched model on both cores of a 2-core CPU
"""

from __future__ import annotations

import argparse
import time
import warnings

import gpytorch
import torch
from torch import Tensor

from gpytorch_hippo import HiPPOInducingVariables, InducingPoints, OnlineSGPR

DT = torch.float64


def fleet_data(streams: int, tasks: int, size: int, seed: int = 0):
    """``x`` ``(tasks, S, size, 1)`` on ``[k, k + 1]`` per task, ``y`` the streams' draws plus noise; per-stream
    length scales in [0.5, 2] and noise variances in [0.01, 0.05]."""
    generator = torch.Generator().manual_seed(seed)
    lengthscales = 0.5 + 1.5 * torch.rand(streams, generator=generator, dtype=DT)
    noises = 0.01 + 0.04 * torch.rand(streams, generator=generator, dtype=DT)
    omega = torch.randn(streams, 64, generator=generator, dtype=DT) / lengthscales[:, None]
    phase = 2 * torch.pi * torch.rand(streams, 64, generator=generator, dtype=DT)
    weight = torch.randn(streams, 64, generator=generator, dtype=DT) * (2 / 64) ** 0.5
    x = torch.arange(tasks, dtype=DT).view(tasks, 1, 1) + torch.rand(tasks, streams, size, generator=generator, dtype=DT)
    f = torch.stack([(torch.cos(x_k.unsqueeze(-1) * omega[:, None] + phase[:, None]) * weight[:, None]).sum(-1) for x_k in x])
    y = f + noises.sqrt()[:, None] * torch.randn(tasks, streams, size, generator=generator, dtype=DT)
    return x.unsqueeze(-1), y, lengthscales, noises


def variables(kind: str, points: Tensor, streams: int | None = None):
    """OSGPR-fixed points, or LegS bases on ``[0, 1]`` (``lyapunov`` backend) moved with the stream; batched
    when ``streams`` is given."""
    if kind == "points":
        return InducingPoints(points, learn=False)
    batch = None if streams is None else torch.Size([streams])
    return HiPPOInducingVariables(points.shape[-2], "legs", t=1.0, method="lyapunov", batch_shape=batch)


def batched_model(points, lengthscales, noises, kind="points", shared=False):
    batch = torch.Size([points.shape[0]])
    kernel_batch = torch.Size([]) if shared else batch  # shared: one kernel (the streams' median length scale)
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(batch_shape=kernel_batch), batch_shape=kernel_batch).double()
    kernel.base_kernel.lengthscale = lengthscales.median() if shared else lengthscales.view(-1, 1, 1)
    likelihood = gpytorch.likelihoods.GaussianLikelihood(batch_shape=batch).double()
    likelihood.noise = noises.view(-1, 1)
    return OnlineSGPR(variables(kind, points, points.shape[0]), kernel, likelihood, captured_variance_warning=None)


def single_model(points, lengthscale, noise, kind="points"):
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).double()
    kernel.base_kernel.lengthscale = lengthscale.clone()  # a float64 tensor (a Python float goes through float32)
    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    likelihood.noise = noise.clone()
    return OnlineSGPR(variables(kind, points), kernel, likelihood, captured_variance_warning=None)


def run(
    streams: int, tasks: int, size: int, num_inducing: int, loop: bool = True, kind: str = "points", shared: bool = False, threads: int = 1
) -> dict:
    """One fleet: the batched model with ``threads`` torch threads, the loop with one (its tiny operations are
    fastest on one thread)."""
    x, y, lengthscales, noises = fleet_data(streams, tasks, size)
    if shared:
        lengthscales = lengthscales.median().expand(streams).clone()
    points = torch.linspace(0, tasks, num_inducing, dtype=DT).expand(streams, num_inducing).unsqueeze(-1).clone()
    batched = batched_model(points, lengthscales, noises, kind, shared)
    torch.set_num_threads(threads)
    start = time.perf_counter()
    for k in range(tasks):
        if kind == "hippo" and k > 0:
            batched.inducing_variables.advance(float(k + 1))
        batched.update(x[k], y[k])
    batched_seconds = time.perf_counter() - start
    torch.set_num_threads(1)
    summary_bytes = sum(t.numel() * t.element_size() for t in batched._summary())
    result = {
        "streams": streams,
        "M": num_inducing,
        "batched_s": batched_seconds,
        "per_task_per_stream_us": 1e6 * batched_seconds / (tasks * streams),
        "bytes_per_stream": summary_bytes / streams,
    }
    if loop:
        singles = [single_model(points[s], lengthscales[s], noises[s], kind) for s in range(streams)]
        start = time.perf_counter()
        for k in range(tasks):
            for s, model in enumerate(singles):
                if kind == "hippo" and k > 0:
                    model.inducing_variables.advance(float(k + 1))
                model.update(x[k, s], y[k, s])
        result["loop_s"] = time.perf_counter() - start
        result["speedup"] = result["loop_s"] / batched_seconds
        test = torch.linspace(0, tasks, 20, dtype=DT)
        batched.eval()
        with torch.no_grad():
            joint = batched(test.expand(streams, -1).unsqueeze(-1)).mean
            result["max_mean_gap"] = max(float((joint[s] - singles[s].eval()(test).mean).abs().max()) for s in range(0, streams, 97))
    return result


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--tasks", type=int, default=50)
    parser.add_argument("--size", type=int, default=50)
    parser.add_argument("--num-inducing", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--scaling", action="store_true", help="S = 100, 1,000, 10,000 at M = 32, batched only")
    parser.add_argument(
        "--variables",
        choices=("points", "hippo"),
        default="points",
        help="OSGPR-fixed points (default) or LegS bases with a clock per stream (lyapunov backend)",
    )
    parser.add_argument("--shared", action="store_true", help="one kernel for every stream (no batch shape), not one per stream")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the batched model (the loop runs on one)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", RuntimeWarning)
    rows = []
    if args.scaling:
        print("| S | M | batched (s) | per task per stream (µs) | summary bytes per stream |")
        print("| --- | --- | --- | --- | --- |")
        for streams in (100, 1000, 10000):
            row = run(streams, args.tasks, args.size, 32, loop=False, kind=args.variables, shared=args.shared, threads=args.threads)
            rows.append(row)
            print(f"| {streams:,} | 32 | {row['batched_s']:.2f} | {row['per_task_per_stream_us']:.1f} | {row['bytes_per_stream']:.0f} |")
        return rows
    hyperparameters = "one shared kernel" if args.shared else "a kernel per stream"
    print(
        f"S = {args.streams:,} streams, {args.tasks} tasks of {args.size} points, {args.variables}, {hyperparameters}, "
        f"{args.threads} torch thread(s) for the batched model, one for the loop"
    )
    print("| M | batched (s) | loop over S models (s) | loop / batched | summary bytes per stream | max |mean gap| |")
    print("| --- | --- | --- | --- | --- | --- |")
    for num_inducing in args.num_inducing:
        row = run(args.streams, args.tasks, args.size, num_inducing, kind=args.variables, shared=args.shared, threads=args.threads)
        rows.append(row)
        print(
            f"| {num_inducing} | {row['batched_s']:.2f} | {row['loop_s']:.1f} | {row['speedup']:.0f}x | "
            f"{row['bytes_per_stream']:.0f} | {row['max_mean_gap']:.1e} |"
        )
    return rows


if __name__ == "__main__":
    main()
