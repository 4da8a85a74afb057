"""Main demo: what a HiPPO memory keeps that moving inducing points forget (``python -m gpytorch_hippo``).

1. Streams a year of daily solar irradiance (pvlib's TMY3 file) through LegS, LegT, LagT and FouT
   memories, prints the reconstruction error at ``t = T/2`` and ``t = T`` over the whole history
   and over the last ``window`` days, and saves a figure like the thesis's HiPPO figure
   (Fig. 2.2: HiPPO-LegS of a toy series, Gu et al. (2020)): basis functions, memory state over time, reconstructions.
2. Learns the same series online in 10 tasks (each seen once) with OHSGPR (LegS inducing
   variables) against OSGPR (inducing points re-drawn from old points and new inputs, then trained),
   OVC (pivoted-Cholesky points) and OVFF (Fourier features), with ``M = 20`` inducing variables:
   about twice the number of length scales in the year (the kernel fitted on task 1 has
   ``ℓ`` ≈ 41 days, ``t/ℓ`` ≈ 9), enough for LegS to keep the whole past (``M = 1.6 t/ℓ`` keeps
   99.97 % of the prior variance) but fewer than the 292 training inputs, so points that follow the
   data to each new task leave the old ones.  Prints task 1's test NLPD and RMSE after every task
   and the time per task, writes ``OUT/results.csv`` (columns :data:`COLUMNS`) and
   ``OUT/online_forgetting.png``.  The full comparison (more methods, data sets and ``M``; OVC draws
   level with OHSGPR on this series) is the thesis's experiment runner, run from a checkout of the
   repository (``python -m experiments.hippo.online``).

One torch thread by default (``--threads``): these are many small operations, which extra threads
slow down on a machine that is busy with other work.
"""

from __future__ import annotations

import argparse
import csv
import os
import time
import warnings

import gpytorch
import torch
from tqdm import tqdm

from probseq._optional import require

from .baselines import FourierSchedule, HiPPOSchedule, PivotedCholeskySchedule, RandomPointsSchedule, learn_task
from .data import load_dataset, load_solar_ghi, split_tasks
from .hippo import MEASURES, HiPPO
from .hyperparameters import fit_exact_hyperparameters
from .metrics import gaussian_nlpd, rmse
from .online import OnlineSGPR


def build_memories(M: int, window: float):
    """One memory per measure; FouT needs odd ``M`` (a constant plus cos/sin pairs)."""
    return {measure: HiPPO(measure, M + (measure == "fout" and M % 2 == 0), theta=window) for measure in MEASURES}


def reconstruct_on_support(memory, state, x, t):
    """Reconstruction where the measure has mass; the series mean (0) where the memory holds nothing."""
    fit = memory.reconstruct(state, x, t)
    return torch.where(memory.measure_density(x, t) > 0, fit, torch.zeros_like(fit))


def reconstruction_errors(memories, times, values, window):
    """RMSE of the reconstruction at ``t = T/2`` and ``t = T``: whole history and last ``window``."""
    rows = {}
    for measure, memory in memories.items():
        states = memory.scan(values, times)
        row = []
        for k in (times.shape[0] // 2 - 1, times.shape[0] - 1):
            t = times[k]
            past, past_values = times[: k + 1], values[: k + 1]
            fit = reconstruct_on_support(memory, states[k], past, t)
            recent = past > t - window
            row.append((fit - past_values).pow(2).mean().sqrt().item())
            row.append((fit[recent] - past_values[recent]).pow(2).mean().sqrt().item())
        rows[measure] = (row, states)
    return rows


def plot(memories, rows, times, values, path):
    matplotlib = require("matplotlib", "plots", "the figures")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 7.5), layout="constrained")
    legs = memories["legs"]
    T = times[-1].item()
    for t, style in ((T / 2, "--"), (T, "-")):
        grid = torch.linspace(0, t, 300, dtype=times.dtype)
        basis = legs.basis(grid, t)
        for m in range(4):
            axes[0, 0].plot(grid, basis[:, m], style, color=f"C{m}", label=f"m={m}, t={t:.0f}" if m < 4 else None)
    axes[0, 0].set(title="(a) LegS basis $g_m^{(t)}(x)$ at t = T/2 (dashed) and T", xlabel="x (days)")
    axes[0, 0].legend(fontsize=7, ncol=2)
    states = rows["legs"][1]
    for m in range(6):
        axes[0, 1].plot(times, states[:, m], label=f"$c_{m}(t)$")
    axes[0, 1].set(title="(b) LegS memory state over time", xlabel="t (days)")
    axes[0, 1].legend(fontsize=7)
    for ax, k, label in ((axes[1, 0], times.shape[0] // 2 - 1, "(c) t = T/2"), (axes[1, 1], times.shape[0] - 1, "(d) t = T")):
        past = times[: k + 1]
        ax.plot(times, values, color="0.6", lw=1, label="data")
        for i, (measure, memory) in enumerate(memories.items()):
            fit = reconstruct_on_support(memory, rows[measure][1][k], past, times[k])
            ax.plot(past, fit, color=f"C{i}", lw=1.2, label=measure)
        ax.axvline(times[k].item(), color="k", lw=0.5)
        ax.set(
            title=f"{label}: reconstructions $\\hat y^{{(t)}}(x)$",
            xlabel="x (days)",
            ylim=(values.min().item() - 1, values.max().item() + 1),
        )
        ax.legend(fontsize=7, ncol=5)
    fig.savefig(path, dpi=120)
    plt.close(fig)


DATASET = "irradiance"
METHODS = ("ohsgpr", "osgpr", "ovc", "ovff")
NAMES = {"ohsgpr": "OHSGPR", "osgpr": "OSGPR", "ovc": "OVC", "ovff": "OVFF"}
NUM_INDUCING = 20
STYLES = {
    "ohsgpr": dict(marker="o", ls="-", lw=2.2, zorder=4),
    "osgpr": dict(marker="s", ls="-", lw=1.5, zorder=3),
    "ovc": dict(marker="^", ls="--", lw=1.5, zorder=5),
    "ovff": dict(marker="v", ls=":", lw=1.5, zorder=2),
}
NUM_TASKS = 10
FULL_COMPARISON = (
    "python -m experiments.hippo.online --dataset irradiance "
    "--methods ohsgpr,ohsgpr-rff,osgpr,osgpr-fixed,ovc,ovc-optz,ovff --num-inducing 50 --seeds 5"
)


#: The columns of ``OUT/results.csv``: one row per method, seed, task trained and task evaluated.
COLUMNS = ("dataset", "method", "num_inducing", "seed", "task_trained", "task_eval", "nlpd", "rmse", "ece", "cum_time_s")
FIRST_ITERS = 100  # Adam steps of the exact GP that fits the hyperparameters on task 1
OSGPR_ITERS = 100  # Adam steps on OSGPR's re-drawn inducing points per later task
LR = 0.05


def make_schedule(method: str, num_inducing: int, x: torch.Tensor):
    """How ``method`` places its ``num_inducing`` inducing variables on the series' times ``x`` ``(N, 1)``."""
    start, end = float(x.min()), float(x.max())
    if method == "ohsgpr":
        return HiPPOSchedule(num_inducing, "legs", start=start, method="lyapunov")
    if method == "osgpr":
        return RandomPointsSchedule(num_inducing, num_iter=OSGPR_ITERS)
    if method == "ovc":
        return PivotedCholeskySchedule(num_inducing)
    if method == "ovff":
        return FourierSchedule((num_inducing - 1) // 2, start, end)
    raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")


def run_method(method: str, num_inducing: int, seed: int, num_tasks: int = NUM_TASKS, progress: bool = False):
    """Learn the series' ``num_tasks`` tasks in turn with ``method``: hyperparameters fitted on task 1 by an
    exact GP and then fixed (RBF kernel; Matérn-5/2 for OVFF), each task absorbed once; after every task the
    test NLPD and RMSE of every task seen so far.  Returns the rows (:data:`COLUMNS`; ``cum_time_s``: training
    seconds so far), the final model and the data set."""
    data = load_dataset(DATASET)
    tasks = split_tasks(data, num_tasks, seed)
    schedule = make_schedule(method, num_inducing, data.x)
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    base = gpytorch.kernels.MaternKernel(nu=2.5) if method == "ovff" else gpytorch.kernels.RBFKernel()
    kernel = gpytorch.kernels.ScaleKernel(base).double()
    likelihood = fit_exact_hyperparameters(kernel, tasks[0].train_x, tasks[0].train_y, FIRST_ITERS, LR)
    kernel.requires_grad_(False)
    likelihood.requires_grad_(False)
    rows, seconds, model = [], 0.0, None
    for k, task in enumerate(tqdm(tasks, desc=f"{method} seed {seed}", disable=not progress, leave=False)):
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # captured-variance warnings of the small M
            if model is None:
                inducing = schedule.first(task.train_x, task.t_end, kernel, generator).to(task.train_x.dtype)
                model = OnlineSGPR(inducing, kernel, likelihood, refit_max_change=None)
                model.update(task.train_x, task.train_y, num_iter=schedule.num_iter, lr=LR)
            else:
                learn_task(model, schedule, task.train_x, task.train_y, task.t_end, generator, lr=LR)
        seconds += time.perf_counter() - start
        model.eval()
        for j, seen in enumerate(tasks[: k + 1]):
            with torch.no_grad():
                predictive = model.likelihood(model(seen.test_x))
            scores = {"nlpd": gaussian_nlpd(predictive.mean, predictive.variance, seen.test_y), "rmse": rmse(predictive.mean, seen.test_y)}
            rows.append(
                dict(
                    dataset=DATASET,
                    method=method,
                    num_inducing=num_inducing,
                    seed=seed,
                    task_trained=k + 1,
                    task_eval=j + 1,
                    ece="",
                    cum_time_s=seconds,
                    **scores,
                )
            )
        model.train()
    return rows, model, data


def run_online(seeds, methods=METHODS, num_inducing=NUM_INDUCING, num_tasks=NUM_TASKS, progress=False):
    """The rows of :func:`run_method` for every method and seed, and the first seed's final models and data
    (``{method: (model, data)}``); ``progress``: progress bars (on stderr)."""
    rows, finals = [], {}
    for seed in seeds:
        for method in tqdm(methods, desc=f"{DATASET} M={num_inducing} seed {seed}", disable=not progress):
            method_rows, model, data = run_method(method, num_inducing, seed, num_tasks, progress)
            rows += method_rows
            if seed == seeds[0]:
                finals[method] = (model, data)
    return rows, finals


def write_csv(rows: list[dict], out: str) -> str:
    """Write ``out/results.csv`` (columns :data:`COLUMNS`) and return its path."""
    path = os.path.join(out, "results.csv")
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    return path


def task1_curves(rows, method, metric):
    """``{seed: [metric on task 1's test points after task 1, 2, ...]}``."""
    curves = {}
    for r in sorted(rows, key=lambda r: r["task_trained"]):
        if r["method"] == method and r["task_eval"] == 1:
            curves.setdefault(r["seed"], []).append(float(r[metric]))
    return curves


def task_times(rows, method):
    """``{seed: [training seconds of task 1, 2, ...]}`` from the cumulative times."""
    cumulative = task1_curves(rows, method, "cum_time_s")
    return {seed: [b - a for a, b in zip([0.0] + c[:-1], c)] for seed, c in cumulative.items()}


def _mean(values):
    return sum(values) / len(values)


def forgetting_table(rows) -> str:
    """Task 1's test RMSE and NLPD after every task (mean over seeds; with several seeds the range
    after the last task) and the training time per task, one row per method."""
    methods = list(dict.fromkeys(r["method"] for r in rows))
    num_seeds = len({r["seed"] for r in rows})
    num_tasks = max(r["task_trained"] for r in rows)
    tasks = "".join(f"{k:>6d}" for k in range(1, num_tasks + 1))
    spread = f"  {'min-max at ' + str(num_tasks):>13s}" if num_seeds > 1 else ""
    lines = []
    for metric in ("rmse", "nlpd"):
        lines.append(f"  {'task-1 ' + metric.upper() + ' after task':22s}{tasks}{spread}")
        for method in methods:
            curves = list(task1_curves(rows, method, metric).values())
            cells = "".join(f"{_mean([c[k] for c in curves]):6.2f}" for k in range(num_tasks))
            last = [c[-1] for c in curves]
            extra = f"  {min(last):8.2f}-{max(last):.2f}" if num_seeds > 1 else ""
            lines.append(f"  {NAMES.get(method, method):22s}{cells}{extra}")
    lines.append(f"  time per task (s)      {'task 1':>8s} {'task 2':>8s} {'task ' + str(num_tasks):>8s} {'all tasks':>10s}")
    for method in methods:
        times = list(task_times(rows, method).values())
        first, second, last = (_mean([t[k] for t in times]) for k in (0, 1, num_tasks - 1))
        total = _mean([sum(t) for t in times])
        lines.append(f"  {NAMES.get(method, method):22s} {first:8.3f} {second:8.3f} {last:8.3f} {total:10.2f}")
    return "\n".join(lines)


def plot_forgetting(rows, finals, path):
    """Task 1's test NLPD and RMSE against the number of learned tasks (mean over seeds, the seeds'
    range shaded), and the first seed's predictive mean ± 2 sd over the year after the last task."""
    matplotlib = require("matplotlib", "plots", "the figures")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig = plt.figure(figsize=(11, 7), layout="constrained")
    grid = fig.add_gridspec(2, 2, height_ratios=(1, 1.1))
    for col, metric in enumerate(("nlpd", "rmse")):
        ax = fig.add_subplot(grid[0, col])
        for i, method in enumerate(methods):
            curves = list(task1_curves(rows, method, metric).values())
            tasks = list(range(1, len(curves[0]) + 1))
            style = STYLES.get(method, {})
            ax.plot(tasks, [_mean(v) for v in zip(*curves)], color=f"C{i}", ms=4, label=NAMES.get(method, method), **style)
            if len(curves) > 1:  # one thin line per seed
                for curve in curves:
                    ax.plot(tasks, curve, color=f"C{i}", lw=0.6, alpha=0.35, ls=style.get("ls", "-"))
        ax.set(xlabel="number of learned tasks", ylabel=f"test {metric.upper()} on task 1", xticks=tasks)
        ax.set_title(f"({'ab'[col]}) task-1 {metric.upper()}", fontsize=10)
    fig.axes[0].legend(fontsize=8)
    seeds = f" (thick: mean of {len(curves)} seeds; thin: each seed)" if len(curves) > 1 else ""
    fig.suptitle(f"Task 1's test error as the stream goes on{seeds}", fontsize=11)
    ax = fig.add_subplot(grid[1, :])
    model, data = next(iter(finals.values()))
    x = data.x[:, 0]
    span = (float(x.max()) - float(x.min())) / NUM_TASKS if len(finals) else 0
    ax.axvspan(float(x.min()), float(x.min()) + span, color="0.92", label="task 1")
    ax.plot(x, data.y, ".", color="0.5", ms=2, label="data")
    for i, method in enumerate(methods):
        if method not in ("ohsgpr", "osgpr", "ovc"):
            continue
        model, _ = finals[method]
        model.eval()
        with torch.no_grad():
            predictive = model.likelihood(model(data.x))
        mean, sd = predictive.mean, predictive.variance.sqrt()
        ax.plot(
            x, mean, color=f"C{i}", label=NAMES[method], ls=STYLES[method]["ls"], lw=STYLES[method]["lw"], zorder=STYLES[method]["zorder"]
        )
        if method != "ovc":
            ax.fill_between(x, mean - 2 * sd, mean + 2 * sd, color=f"C{i}", alpha=0.15)
        points = getattr(model.posterior_inducing_variables, "points", None)
        if points is not None:
            y_points = torch.full_like(points[:, 0], float(data.y.min()) - 0.4 - 0.3 * i)
            ax.plot(points[:, 0], y_points, "|", color=f"C{i}", ms=7, label=f"{NAMES[method]} inducing points")
    seed = rows[0]["seed"]
    ax.set(xlabel="day", ylabel="standardised GHI")
    ax.set_title(f"(c) after the last task, seed {seed}: predictive mean (± 2 sd for OHSGPR, OSGPR)", fontsize=10)
    fig.legend(*ax.get_legend_handles_labels(), fontsize=8, ncol=4, loc="outside lower center")  # (c)'s, off the data
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="out/demo", help="folder for the PNGs and results.csv")
    parser.add_argument("--M", type=int, default=32, help="memory size of part 1 (FouT uses M+1 if M is even)")
    parser.add_argument("--window", type=float, default=60.0, help="LegT/FouT window and LagT time scale, days")
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 of part 2 (task split and test points)")
    parser.add_argument("--quick", action="store_true", help="part 2 with one seed (seed 0)")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: the demo's many small operations gain nothing from more, and more slow it down on a busy machine)",
    )
    parser.add_argument("--no-online", action="store_true", help="skip part 2 (online sparse GPs)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars in part 2")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error(f"--seeds must be >= 1, got {args.seeds}")
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    require("matplotlib", "plots", "the demo's figures")
    torch.set_num_threads(args.threads)
    started = time.perf_counter()

    print(f"1. streaming the series through {len(MEASURES)} HiPPO memories ({', '.join(MEASURES)}) ...", flush=True)
    times, ghi = load_solar_ghi("daily")
    values = (ghi - ghi.mean()) / ghi.std()
    memories = build_memories(args.M, args.window)
    rows = reconstruction_errors(memories, times, values, args.window)

    print(
        f"   Daily solar irradiance (pvlib TMY3, Greensboro NC), T = {times.shape[0]} days, standardised; "
        f"M = {args.M}, window = {args.window:g} days, bilinear"
    )
    print("reconstruction RMSE (outside a measure's support the memory predicts the mean, 0)")
    print("                           t = T/2: history  last window |  t = T: history  last window")
    for measure, (row, _) in rows.items():
        print(f"  {measure:5s}                           {row[0]:7.3f}  {row[1]:11.3f} |          {row[2]:7.3f}  {row[3]:11.3f}")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "hippo_memory.png")
    plot(memories, rows, times, values, path)
    print(f"figure: {path}")
    if not args.no_online:
        seeds = [0] if args.quick else list(range(args.seeds))
        print(
            f"\n2. training {len(METHODS)} online sparse GPs ({', '.join(NAMES[m] for m in METHODS)}) on {NUM_TASKS} tasks "
            f"with {len(seeds)} seed(s): {len(METHODS) * len(seeds)} runs ...",
            flush=True,
        )
        rows, finals = run_online(seeds, progress=not args.quiet)
        lengthscale = float(finals["ohsgpr"][0].covar_module.base_kernel.lengthscale)
        span = float(finals["ohsgpr"][1].x.max() - finals["ohsgpr"][1].x.min())
        which = f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {seeds[0]}-{seeds[-1]}, mean over seeds"
        print(
            f"   Online regression of the same series: {NUM_TASKS} tasks of ~{span / NUM_TASKS:.0f} days, each seen once, "
            f"M = {NUM_INDUCING} inducing variables ({which})"
        )
        print(
            f"   kernel fitted on task 1 (seed {seeds[0]}): l = {lengthscale:.0f} days, so the year is t/l = "
            f"{span / lengthscale:.1f} length scales; LegS keeps the whole past with M ~ 2 t/l, "
            f"points re-drawn from old points and new inputs drift to the newest task"
        )
        print(forgetting_table(rows))
        csv_path = write_csv(rows, args.out)
        figure = plot_forgetting(rows, finals, os.path.join(args.out, "online_forgetting.png"))
        print(f"wrote {csv_path}, {figure}")
        print(
            f"The full comparison (7 methods, more seeds, other data sets and M; OVC draws level with OHSGPR on "
            f"this series): {FULL_COMPARISON} (results in docs/results.md)"
        )
    print(f"total {time.perf_counter() - started:.0f} s with {args.threads} torch thread(s)")


if __name__ == "__main__":
    main()
