"""StreamFleet's engines and checkpoints, printed as ratios measured in one run.

1. The Ray engine on 2 shards (one actor each, a local Ray instance with 2 CPUs) against the local engine
   on 2 shards (one process), the same fleet and tasks: tasks per second and the largest difference of the
   predictions (the same arithmetic on both: 0 expected).
2. The cost of durability: the local engine with ``checkpoint_dir`` (every shard writes its state after
   every task) against the same without, per task, and the checkpoint's size.

Each stream is its own noisy sine, OSGPR-fixed with ``M`` points spread over the horizon; every task
gives each stream ``--size`` points, a tenth of the streams skipping each task (ragged shards). Times are
wall times of ``update`` per task after the first (one torch thread per process); Ray's start and the actors'
creation are reported apart.

    python benchmarks/fleet_engines.py                       # S = 400 streams, 20 tasks of 50 points, M = 32
    python benchmarks/fleet_engines.py --streams 2000 --tasks 10
    python benchmarks/fleet_engines.py --no-ray              # checkpoint cost only (no Ray installed)
    python benchmarks/fleet_engines.py --no-ray --device cuda --streams 10000
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import gpytorch
import torch

from gpytorch_hippo import InducingPoints, OnlineSGPR
from gpytorch_hippo.fleet import StreamFleet

DT = torch.float64


class PointsFactory:
    """``num_streams`` streams of OSGPR-fixed: ``M`` points on ``[0, horizon]``, one length scale and noise."""

    def __init__(self, num_inducing: int, horizon: float, device: str = "cpu"):
        self.num_inducing, self.horizon, self.device = num_inducing, horizon, device

    def __call__(self, num_streams: int) -> OnlineSGPR:
        batch = torch.Size([num_streams])
        kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=1.5, batch_shape=batch), batch_shape=batch).double()
        kernel.base_kernel.lengthscale = 0.5
        likelihood = gpytorch.likelihoods.GaussianLikelihood(batch_shape=batch).double()
        likelihood.noise = 0.05
        points = torch.linspace(0, self.horizon, self.num_inducing, dtype=DT).expand(num_streams, -1).unsqueeze(-1).clone()
        model = OnlineSGPR(InducingPoints(points, learn=False), kernel, likelihood, captured_variance_warning=None)
        return model.to(self.device)


def fleet_tasks(streams: int, tasks: int, size: int, seed: int = 0) -> list[dict]:
    """Task ``k``: ``{stream: (x on [k, k + 1], sin(ω_s x + φ_s) + noise)}``, a tenth of the streams absent."""
    generator = torch.Generator().manual_seed(seed)
    omega = 1 + 2 * torch.rand(streams, generator=generator, dtype=DT)
    phase = 6.28 * torch.rand(streams, generator=generator, dtype=DT)
    out = []
    for k in range(tasks):
        x = k + torch.rand(streams, size, generator=generator, dtype=DT)
        y = torch.sin(omega[:, None] * x + phase[:, None]) + 0.2 * torch.randn(streams, size, generator=generator, dtype=DT)
        present = torch.rand(streams, generator=generator) > 0.1
        out.append({f"stream-{s}": (x[s], y[s]) for s in range(streams) if present[s]})
    return out


def timed_run(fleet: StreamFleet, task_list: list[dict], test_x: torch.Tensor) -> tuple[float, torch.Tensor]:
    """Seconds per task after the first (which builds the shards' models and warms up) and the predictive means."""
    fleet.update(0, task_list[0])
    start = time.perf_counter()
    for k, data in enumerate(task_list[1:], start=1):
        fleet.update(k, data)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / (len(task_list) - 1)
    return seconds, fleet.predict(sorted(fleet.stream_ids), test_x)[0]


def checkpointed_run(factory, task_list, test_x) -> tuple[float, torch.Tensor, int]:
    """:func:`timed_run` with a checkpoint directory, and the bytes of one set of checkpoints."""
    with tempfile.TemporaryDirectory() as directory:
        seconds, mean = timed_run(StreamFleet(factory, num_shards=2, checkpoint_dir=directory), task_list, test_x)
        size = sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory) if f.startswith("shard-"))
    return seconds, mean, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=400)
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--size", type=int, default=50)
    parser.add_argument("--inducing", type=int, default=32)
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray engine")
    parser.add_argument("--device", default="cpu", help="where the shards' models live (local engine; e.g. cuda)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    factory = PointsFactory(args.inducing, float(args.tasks), args.device)
    task_list = fleet_tasks(args.streams, args.tasks, args.size)
    test_x = torch.linspace(0, args.tasks, 20, dtype=DT)
    print(f"S = {args.streams} streams, {args.tasks} tasks of {args.size} points, M = {args.inducing}, 2 shards, models on {args.device}")

    local_runs, saved_runs = [], []
    for _ in range(2):  # alternated, the faster of two: the machine may be busy with other work
        local_runs.append(timed_run(StreamFleet(factory, num_shards=2), task_list, test_x))
        saved_runs.append(checkpointed_run(factory, task_list, test_x))
    local_s, local_mean = min(local_runs, key=lambda run: run[0])
    saved_s, saved_mean, size = min(saved_runs, key=lambda run: run[0])
    print(f"{'engine':<26}{'s/task':>10}{'tasks/s':>10}{'ratio':>8}{'max |Δ mean|':>14}")
    print(f"{'local':<26}{local_s:>10.4f}{1 / local_s:>10.2f}{1:>8.2f}{0:>14.1e}")
    print(
        f"{'local + checkpoints':<26}{saved_s:>10.4f}{1 / saved_s:>10.2f}{local_s / saved_s:>8.2f}"
        f"{float((saved_mean - local_mean).abs().max()):>14.1e}"
    )
    print(
        f"checkpoint cost: {1e3 * (saved_s - local_s):.1f} ms per task ({100 * (saved_s - local_s) / local_s:.0f} % of an "
        f"update), {size / 2**20:.2f} MiB written per task ({size / args.streams / 1024:.1f} KiB per stream)"
    )
    if args.no_ray:
        return
    import ray

    start = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    fleet = StreamFleet(factory, engine="ray", num_shards=2)
    ray.get([actor.pid.remote() for actor in fleet._engine.actors])  # the actors are up
    started = time.perf_counter() - start
    ray_s, ray_mean = timed_run(fleet, task_list, test_x)
    print(
        f"{'ray (2 actors)':<26}{ray_s:>10.4f}{1 / ray_s:>10.2f}{local_s / ray_s:>8.2f}{float((ray_mean - local_mean).abs().max()):>14.1e}"
    )
    print(f"ray: start and actors {started:.1f} s (not in the times above)")
    fleet.close()
    ray.shutdown()


if __name__ == "__main__":
    main()
