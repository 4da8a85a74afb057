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
    python benchmarks/fleet.py --variables hippo --threads 1 2              # the batched model on one and on both cores
    python benchmarks/fleet.py --variables hippo --device cuda              # the batched model on a GPU, the loop on the CPU
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
    streams: int,
    tasks: int,
    size: int,
    num_inducing: int,
    loop: bool = True,
    kind: str = "points",
    shared: bool = False,
    threads: tuple[int, ...] = (1,),
    device: str = "cpu",
) -> dict:
    """One fleet: the batched model on ``device``, once per torch thread count in ``threads``; the loop on the CPU
    with one thread (its tiny operations are fastest there)."""
    x, y, lengthscales, noises = fleet_data(streams, tasks, size)
    if shared:
        lengthscales = lengthscales.median().expand(streams).clone()
    points = torch.linspace(0, tasks, num_inducing, dtype=DT).expand(streams, num_inducing).unsqueeze(-1).clone()
    result = {"streams": streams, "M": num_inducing, "batched_s": {}}
    for count in threads:
        batched = batched_model(points, lengthscales, noises, kind, shared).to(device)
        x_device, y_device = x.to(device), y.to(device)
        torch.set_num_threads(count)
        _synchronize(device)
        start = time.perf_counter()
        for k in range(tasks):
            if kind == "hippo" and k > 0:
                batched.inducing_variables.advance(float(k + 1))
            batched.update(x_device[k], y_device[k])
        _synchronize(device)
        result["batched_s"][count] = time.perf_counter() - start
        torch.set_num_threads(1)
    fastest = min(result["batched_s"].values())
    result["per_task_per_stream_us"] = 1e6 * fastest / (tasks * streams)
    result["bytes_per_stream"] = sum(t.numel() * t.element_size() for t in batched._stored_task()[2:]) / streams
    if loop:
        singles = [single_model(points[s], lengthscales[s], noises[s], kind) for s in range(streams)]
        start = time.perf_counter()
        for k in range(tasks):
            for s, model in enumerate(singles):
                if kind == "hippo" and k > 0:
                    model.inducing_variables.advance(float(k + 1))
                model.update(x[k, s], y[k, s])
        result["loop_s"] = time.perf_counter() - start
        result["speedup"] = {count: result["loop_s"] / seconds for count, seconds in result["batched_s"].items()}
        test = torch.linspace(0, tasks, 20, dtype=DT)
        batched.eval()
        with torch.no_grad():
            joint = batched(test.expand(streams, -1).unsqueeze(-1).to(device)).mean.cpu()
            result["max_mean_gap"] = max(float((joint[s] - singles[s].eval()(test).mean).abs().max()) for s in range(0, streams, 97))
    return result


def _synchronize(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


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
    parser.add_argument(
        "--threads", type=int, nargs="+", default=[1], help="torch thread counts of the batched model, each timed (the loop runs on one)"
    )
    parser.add_argument("--device", default="cpu", help="where the batched model runs, e.g. cuda (the loop runs on the CPU)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", RuntimeWarning)
    threads = tuple(args.threads)
    rows = []
    if args.scaling:
        print("| S | M | batched (s) | per task per stream (µs) | summary bytes per stream |")
        print("| --- | --- | --- | --- | --- |")
        for streams in (100, 1000, 10000):
            row = run(streams, args.tasks, args.size, 32, False, args.variables, args.shared, threads, args.device)
            rows.append(row)
            seconds = min(row["batched_s"].values())
            print(f"| {streams:,} | 32 | {seconds:.2f} | {row['per_task_per_stream_us']:.1f} | {row['bytes_per_stream']:.0f} |")
        return rows
    hyperparameters = "one shared kernel" if args.shared else "a kernel per stream"
    print(
        f"S = {args.streams:,} streams, {args.tasks} tasks of {args.size} points, {args.variables}, {hyperparameters}; "
        f"the batched model on {args.device} with n torch threads, the loop over S models on the CPU with one"
    )
    batched_columns = " | ".join(f"batched, {n} thread{'s' * (n > 1)} (s) | loop / batched" for n in threads)
    print(f"| M | loop over S models (s) | {batched_columns} | summary bytes per stream | max |mean gap| |")
    print("| --- " * (4 + 2 * len(threads)) + "|")
    for num_inducing in args.num_inducing:
        row = run(args.streams, args.tasks, args.size, num_inducing, True, args.variables, args.shared, threads, args.device)
        rows.append(row)
        cells = " | ".join(f"{row['batched_s'][n]:.2f} | {row['speedup'][n]:.1f}x" for n in threads)
        print(f"| {num_inducing} | {row['loop_s']:.1f} | {cells} | {row['bytes_per_stream']:.0f} | {row['max_mean_gap']:.1e} |")
    return rows


if __name__ == "__main__":
    main()
