"""Demo of a fleet of streams (``python -m experiments.hippo.fleet_demo --out DIR``).

The 148 monthly US employment series (:func:`~gpytorch_hippo.data.load_us_employment`, standardised per
series, time in years) arrive in ``--tasks`` consecutive blocks of months, each seen once; most series
join the fleet in a later block (where their record starts). Each block gives every present series 80 %
of its months to learn from and holds out the rest. For every model variant a :class:`StreamFleet`
learns the series task by task; at the end each stream's *first-task memory* is measured: RMSE and NLPD
on the held-out months of the first task that stream had, right after that task and after the last task.
Then the batched fleet is timed against a Python loop over one single-stream ``OnlineSGPR`` per series
(same data, same hyperparameters), and their predictions compared.

Variants are model factories (:class:`EmploymentModelFactory`, picklable for the Ray engine): inducing
points fixed over the whole horizon (OSGPR-fixed) with ``M`` small and large, and LegS bases with a clock
per stream (OHSGPR). Writes
``OUT/fleet_memory.csv`` (one row per variant and stream) and ``OUT/fleet_memory.png``.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import tempfile
import time
from collections.abc import Callable

import gpytorch
import torch

from gpytorch_hippo.data import SeriesFleet, load_us_employment
from gpytorch_hippo.fleet import StreamFleet
from gpytorch_hippo.inducing.hippo_variables import HiPPOInducingVariables
from gpytorch_hippo.inducing.points import InducingPoints
from gpytorch_hippo.online import OnlineSGPR
from probseq._optional import require

__all__ = ["EmploymentModelFactory", "split_task", "first_task_memory", "loop_baseline", "run", "main", "COLUMNS"]

#: the columns of ``fleet_memory.csv``
COLUMNS = (
    "variant",
    "num_inducing",
    "stream_id",
    "title",
    "first_task",
    "first_task_rmse_after",
    "first_task_rmse_end",
    "first_task_nlpd_after",
    "first_task_nlpd_end",
)


class EmploymentModelFactory:
    r"""``factory(num_streams)``: a batched ``OnlineSGPR`` for standardised monthly series in years, Matérn-3/2
    (``ℓ = lengthscale``, outputscale 1), noise variance ``noise``, the same for every stream; ``inducing``
    ``"points"``: ``M`` inducing points fixed on ``[0, horizon]`` (OSGPR-fixed); ``"hippo"``: ``M`` LegS bases
    per stream, each with its own clock (OHSGPR, lyapunov backend), moved to the latest month a stream has
    seen by ``before_update``.

    :attr:`before_update` is the fleet's hook (``StreamFleet(before_update=...)``) for inducing variables that
    move with each stream's clock; fixed points need none (``None``).

    :param num_inducing: the number ``M`` of inducing points or LegS bases per stream.
    :param horizon: the end of the time span in years (the points are spread on ``[0, horizon]``).
    :param inducing: ``"points"`` (default) or ``"hippo"``.
    :param lengthscale: the Matérn-3/2 length scale :math:`\ell` in years (default 1.5).
    :param noise: the Gaussian noise variance, in standardised units (default 0.01).
    """

    #: ``before_update(model, X, mask)`` before each batched update, or ``None``
    before_update: Callable[[OnlineSGPR, torch.Tensor, torch.Tensor], None] | None = None

    def __init__(self, num_inducing: int, horizon: float, inducing: str = "points", lengthscale: float = 1.5, noise: float = 0.01):
        if inducing not in ("points", "hippo"):
            raise ValueError(f"inducing must be 'points' or 'hippo', got {inducing!r}")
        self.num_inducing, self.horizon, self.inducing = num_inducing, horizon, inducing
        self.lengthscale, self.noise = lengthscale, noise
        if inducing == "hippo":
            self.before_update = self.advance_clocks

    @property
    def name(self) -> str:
        return f"{'OHSGPR' if self.inducing == 'hippo' else 'OSGPR-fixed'} M={self.num_inducing}"

    def kernel_and_likelihood(self, batch: torch.Size):
        """The float64 scaled Matérn-3/2 kernel and Gaussian likelihood of the factory's settings.

        :param batch: their batch shape, ``(num_streams,)``.
        """
        kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=1.5, batch_shape=batch), batch_shape=batch).double()
        kernel.base_kernel.lengthscale = self.lengthscale
        likelihood = gpytorch.likelihoods.GaussianLikelihood(batch_shape=batch).double()
        likelihood.noise = self.noise
        return kernel, likelihood

    def __call__(self, num_streams: int) -> OnlineSGPR:
        batch = torch.Size([num_streams])
        kernel, likelihood = self.kernel_and_likelihood(batch)
        if self.inducing == "hippo":  # the clocks start at the first month and follow each stream's data
            variables = HiPPOInducingVariables(self.num_inducing, "legs", t=1 / 12, method="lyapunov", batch_shape=batch)
        else:
            points = torch.linspace(0, self.horizon, self.num_inducing, dtype=torch.float64).expand(num_streams, -1).unsqueeze(-1)
            variables = InducingPoints(points.clone(), learn=False)
        return OnlineSGPR(variables, kernel, likelihood, captured_variance_warning=None)

    @staticmethod
    def advance_clocks(model: OnlineSGPR, X: torch.Tensor, mask: torch.Tensor) -> None:
        """Move each stream's LegS bases to its latest observed time (a stream without points stays).

        :param model: the batched model, with batched HiPPO inducing variables.
        :param X: the task's padded inputs ``(S, n, 1)`` (times in years).
        :param mask: ``(S, n)``, ``True`` at real points, ``False`` at padding.
        """
        latest = torch.where(mask, X[..., 0], torch.tensor(-math.inf, dtype=X.dtype)).amax(-1)
        clocks = model.inducing_variables.t.to(X)
        model.inducing_variables.advance(torch.maximum(clocks, latest))


def split_task(task: dict, seed: int, test_fraction: float = 0.2) -> tuple[dict, dict]:
    """``(train, test)``: a random ``test_fraction`` of each stream's points held out (at least one, and at
    least one left to learn from).

    :param task: a mapping stream id -> ``(t, y)``, as :meth:`~gpytorch_hippo.data.SeriesFleet.tasks` returns.
    :param seed: seed of the random split.
    :param test_fraction: the fraction of each stream's points to hold out (default 0.2).
    """
    generator = torch.Generator().manual_seed(seed)
    train, test = {}, {}
    for stream, (t, y) in task.items():
        order = torch.randperm(t.shape[0], generator=generator)
        held = min(max(1, round(test_fraction * t.shape[0])), t.shape[0] - 1)
        train[stream] = (t[order[held:]], y[order[held:]])
        if held:
            test[stream] = (t[order[:held]], y[order[:held]])
    return train, test


def _scores(fleet: StreamFleet, test: dict, noise: float) -> dict:
    """``{stream: (rmse, nlpd)}`` of the predictive ``N(mean, var + noise)`` on each stream's test points."""
    scores = {}
    for stream, (t, y) in test.items():
        mean, variance = fleet.predict([stream], t)
        variance = variance[0] + noise
        nlpd = 0.5 * (torch.log(2 * math.pi * variance) + (y - mean[0]).square() / variance).mean()
        scores[stream] = (float((y - mean[0]).square().mean().sqrt()), float(nlpd))
    return scores


def first_task_memory(
    factory, tasks: list[tuple[dict, dict]], engine: str = "local", num_shards: int = 2, checkpoint_dir=None
) -> tuple[StreamFleet, dict, float]:
    """Learn ``tasks`` (``(train, test)`` pairs) with a fleet; each stream's first task scored right after it
    and at the end: ``{stream: (first_task, rmse_after, nlpd_after, rmse_end, nlpd_end)}``; seconds of updates.

    :param factory: the model factory (an :class:`EmploymentModelFactory`: it also gives ``before_update`` and ``noise``).
    :param tasks: the ``(train, test)`` mappings of :func:`split_task`, in order.
    :param engine: the fleet's engine, ``"local"`` (default) or ``"ray"``.
    :param num_shards: the fleet's number of shards (default 2).
    :param checkpoint_dir: the fleet's checkpoint directory; ``None`` (default): none.
    :return: the fleet (still open), the scores and the seconds spent in updates.
    """
    fleet = StreamFleet(factory, engine=engine, num_shards=num_shards, checkpoint_dir=checkpoint_dir, before_update=factory.before_update)
    first, after, seconds = {}, {}, 0.0
    for k, (train, test) in enumerate(tasks):
        start = time.perf_counter()
        fleet.update(k, train)
        seconds += time.perf_counter() - start
        joined = {s: pair for s, pair in test.items() if s not in first}
        first.update({s: k for s in joined})
        after.update(_scores(fleet, joined, factory.noise))
    end = _scores(fleet, {s: tasks[k][1][s] for s, k in first.items()}, factory.noise)
    return fleet, {s: (first[s], *after[s], *end[s]) for s in first}, seconds


def loop_baseline(factory: EmploymentModelFactory, tasks: list[tuple[dict, dict]]) -> tuple[dict, float]:
    """One single-stream model (``factory(1)``) per series through the same tasks, in a Python loop; the models
    and seconds of updates.

    :param factory: the model factory.
    :param tasks: the ``(train, test)`` mappings of :func:`split_task`, in order (only ``train`` is used).
    """
    models, seconds = {}, 0.0
    for train, _ in tasks:
        start = time.perf_counter()
        for stream, (t, y) in train.items():
            if stream not in models:
                models[stream] = factory(1)
            x, mask = t.view(1, -1, 1), torch.ones(1, t.shape[0], dtype=torch.bool)
            if factory.before_update is not None:
                factory.before_update(models[stream], x, mask)
            models[stream].update(x, y.view(1, -1))
        seconds += time.perf_counter() - start
    return models, seconds


def run(
    out: str,
    num_tasks: int = 8,
    variants: tuple[int, ...] = (24, 96),
    engine: str = "local",
    num_shards: int = 2,
    seed: int = 0,
    data: SeriesFleet | None = None,
    plot: bool = True,
    hippo: tuple[int, ...] = (96,),
) -> dict:
    """The demo: a fleet per variant, the per-stream first-task memory, the batched-vs-loop throughput; writes
    ``out/fleet_memory.csv`` (:data:`COLUMNS`) and ``out/fleet_memory.png``; returns the numbers it prints.

    :param out: output directory (created).
    :param num_tasks: the number of consecutive blocks of months (default 8).
    :param variants: ``M`` of each OSGPR-fixed variant (default ``(24, 96)``); the last is the one timed against the loop.
    :param engine: the fleets' engine, ``"local"`` (default) or ``"ray"``.
    :param num_shards: the fleets' number of shards (default 2).
    :param seed: seed of the train/test splits (task ``k`` uses ``seed + k``).
    :param data: the series; ``None`` (default): :func:`~gpytorch_hippo.data.load_us_employment`.
    :param plot: write the figure (default ``True``; needs matplotlib).
    :param hippo: ``M`` of each OHSGPR variant (default ``(96,)``).
    """
    if not variants:
        raise ValueError("variants needs at least one M: its last OSGPR-fixed variant is timed against the loop")
    os.makedirs(out, exist_ok=True)
    data = load_us_employment() if data is None else data
    horizon = float(data.times[-1])
    tasks = [split_task(task, seed + k) for k, task in enumerate(data.tasks(num_tasks))]
    titles = dict(zip(data.ids, data.titles))
    print(
        f"{data.name}: {data.num_streams} series, {data.times.shape[0]} months, {num_tasks} tasks; "
        f"streams per task {[len(train) for train, _ in tasks]}"
    )
    rows, summary, fleets = [], {}, {}
    grid = torch.linspace(0, horizon, 400, dtype=torch.float64)
    shown = [data.ids[0], data.ids[len(data.ids) // 2], data.ids[-1]]
    print(f"{'variant':<22}{'streams':>8}{'s/task':>9}{'RMSE after':>12}{'RMSE end':>10}{'NLPD after':>12}{'NLPD end':>10}")
    factories = [EmploymentModelFactory(m, horizon) for m in variants] + [EmploymentModelFactory(m, horizon, "hippo") for m in hippo]
    for factory in factories:
        num_inducing, name = factory.num_inducing, factory.name
        with tempfile.TemporaryDirectory() as directory:
            fleet, memory, seconds = first_task_memory(factory, tasks, engine, num_shards, checkpoint_dir=directory)
            curves = fleet.predict(shown, grid)[0]
            fleet.close()
        fleets[name] = (factory, curves, memory, seconds)
        values = torch.tensor([m[1:] for m in memory.values()])
        medians = values.median(0).values.tolist()
        summary[name] = {"seconds_per_task": seconds / num_tasks, "median": medians}
        print(
            f"{name:<22}{len(memory):>8}{seconds / num_tasks:>9.3f}{medians[0]:>12.3f}{medians[2]:>10.3f}"
            f"{medians[1]:>12.3f}{medians[3]:>10.3f}"
        )
        for stream, (k, rmse_after, nlpd_after, rmse_end, nlpd_end) in memory.items():
            rows.append((name, num_inducing, stream, titles[stream], k, rmse_after, rmse_end, nlpd_after, nlpd_end))
    print("(medians over streams of each stream's first task's held-out months: right after it and after the last task)")

    factory, _, _, fleet_seconds = fleets[factories[len(variants) - 1].name]
    local_fleet, _, fleet_seconds = first_task_memory(factory, tasks, "local", 1)
    models, loop_seconds = loop_baseline(factory, tasks)
    probe = torch.linspace(0, horizon, 50, dtype=torch.float64)
    streams = sorted(models)
    batched_mean, _ = local_fleet.predict(streams, probe)
    for model in models.values():
        model.eval()
    with torch.no_grad():
        loop_mean = torch.cat([models[s](probe.view(1, -1, 1)).mean for s in streams])
    difference = float((batched_mean - loop_mean).abs().max())
    summary["throughput"] = {
        "batched_s": fleet_seconds,
        "loop_s": loop_seconds,
        "speedup": loop_seconds / fleet_seconds,
        "max_abs_difference": difference,
    }
    print(
        f"batched fleet (1 shard) {fleet_seconds:.2f} s vs a loop over {len(models)} models {loop_seconds:.2f} s: "
        f"{loop_seconds / fleet_seconds:.1f}x (M = {variants[-1]}, {num_tasks} tasks; max |Δ mean| {difference:.1e})"
    )

    path = os.path.join(out, "fleet_memory.csv")
    with open(path, "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(COLUMNS)
        writer.writerows(rows)
    print(f"wrote {path}")
    if plot:
        figure_path = os.path.join(out, "fleet_memory.png")
        _figure(figure_path, data, fleets, shown, grid)
        print(f"wrote {figure_path}")
    return summary


def _figure(path: str, data: SeriesFleet, fleets: dict, shown: list[str], grid: torch.Tensor) -> None:
    """Three series with each variant's posterior mean (left), each stream's first-task RMSE after it vs at the end (right)."""
    plt = require("matplotlib.pyplot", "plots", "the fleet demo's figure", "matplotlib")
    figure, axes = plt.subplots(1, 2, figsize=(12, 4))
    for offset, stream in enumerate(shown):
        axes[0].plot(data.times + 1939, data.values[data.ids.index(stream)] + 4 * offset, color="0.6", lw=0.6)
        for color, name in enumerate(fleets):
            axes[0].plot(grid + 1939, fleets[name][1][offset] + 4 * offset, lw=1, color=f"C{color}", label=name if offset == 0 else None)
    axes[0].set(xlabel="year", ylabel="standardised employment (offset per series)", title="three series of the fleet")
    axes[0].legend()
    top = 0.0
    for color, name in enumerate(fleets):
        values = torch.tensor([m[1:] for m in fleets[name][2].values()])
        axes[1].scatter(values[:, 0], values[:, 2], s=8, color=f"C{color}", label=name)
        top = max(top, float(values[:, [0, 2]].max()))
    axes[1].plot([0, top], [0, top], color="k", lw=0.5)
    axes[1].set(
        xlabel="RMSE right after the stream's first task", ylabel="RMSE on it after the last task", title="first-task memory per stream"
    )
    axes[1].legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: list[str] | None = None) -> dict:
    """The command line: parse the arguments and :func:`run` the demo.

    :param argv: the arguments (``--out``, ``--tasks``, ``--inducing``, ``--hippo``, ``--engine``, ``--shards``,
        ``--seed``, ``--threads``); ``None`` (default): ``sys.argv[1:]``.
    """
    parser = argparse.ArgumentParser(
        prog="python -m experiments.hippo.fleet_demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="fleet_demo", help="output directory (CSV and figure)")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--inducing", type=int, nargs="+", default=[24, 96], help="M of each OSGPR-fixed variant")
    parser.add_argument("--hippo", type=int, nargs="*", default=[96], help="M of each OHSGPR variant (LegS, a clock per stream)")
    parser.add_argument("--engine", choices=("local", "ray"), default="local")
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (one: many small operations)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    return run(args.out, args.tasks, tuple(args.inducing), args.engine, args.shards, args.seed, hippo=tuple(args.hippo))


if __name__ == "__main__":
    main()
