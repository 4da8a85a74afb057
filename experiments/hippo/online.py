"""Online regression of real series, task by task: OHSGPR against OSGPR, OVC and OVFF (thesis §4.6.1,
Figs. 4.3-4.5 and Table 4.1; Chen et al. (2025), OHSVGP).

Each series is cut into ``--tasks`` contiguous tasks with a random 20 % test split inside each task
(per seed). The kernel hyperparameters (RBF; Matérn-5/2 for OVFF, as in the thesis) and the noise
come from an exact GP fitted to the first task (the best point of a length-scale/noise grid, then
``--first-iters`` Adam steps; not timed, shared by all methods, as the thesis's "full GP model
trained over the initial task") and stay fixed
(``--train-kernel``: every task also trains them on the online bound, ``--first-iters`` steps,
thesis App. C.4.1). Methods with trainable inducing inputs also train them on task 1. After every
task each method is evaluated on the test points of every task seen so far. Methods (all
:class:`~gpytorch_hippo.online.OnlineSGPR`, differing only in the inducing variables,
:mod:`gpytorch_hippo.baselines`):

* ``ohsgpr``: HiPPO (``--measure``, default LegS) with the fastest exact backend that applies
  (``--hippo-backend``; default ``lyapunov`` for LegS, ``auto`` for the other measures);
  ``ohsgpr-rff``: the same HiPPO bases with ``Kuu = ZᵀZ`` **and** ``Kuf = Zᵀψ(x)`` from 1000 random Fourier
  features ``ψ`` carried by the HiPPO recurrence (``kuf="rff"``: a random-feature GP, not the thesis's pairing);
  ``ohsgpr-ode-rff``: the thesis's construction (§4.3.2): ``Kuf`` from the HiPPO ODE driven by the exact
  kernel, ``d/dt Kuf[n] = A(t) Kuf[n] + B(t) k(x_n, t)``, and ``Kuu = ZᵀZ`` from the 1000 features
  (``kuf="ode"``); the two can disagree, and a negative Nyström residual ``k(x, x) − Kfu Kuu⁻¹ Kuf`` is
  reported by an :class:`~gpytorch_hippo.inducing.InconsistentCovarianceWarning` at evaluation;
* ``osgpr``: points re-drawn from old points ∪ new inputs, then ``--osgpr-iters`` Adam steps on
  the online bound (the thesis: ~1000); ``osgpr-fixed``: re-drawn and kept fixed;
* ``ovc``: pivoted-Cholesky points, fixed; ``ovc-optz``: then optimised like OSGPR;
* ``ovff``: ``(M - 1) // 2`` Fourier frequencies (``M - 1`` or ``M`` features) on the whole
  series' time range.

Writes ``OUT/results.csv`` (columns :data:`COLUMNS`; ``cum_time_s`` is the training wall time
through ``task_trained``; rewritten after every method and seed, so an interrupted run keeps what
it finished), ``OUT/online_nlpd_rmse.png`` and ``OUT/online_final_fit.png``, and prints a summary
(mean ± 95 % CI over seeds; paired per-seed differences: :mod:`.online_paired`)::

    python -m experiments.hippo.online --dataset irradiance --methods ohsgpr,osgpr,ovc,ovff \\
        --num-inducing 50 --seeds 3 --out out/online
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import time
import warnings
from collections.abc import Sequence
from typing import Any

import gpytorch
import torch
from tqdm import tqdm

from gpytorch_hippo.baselines import FourierSchedule, HiPPOSchedule, PivotedCholeskySchedule, RandomPointsSchedule, learn_task
from gpytorch_hippo.data import split_tasks
from gpytorch_hippo.hippo import MEASURES
from gpytorch_hippo.hyperparameters import fit_exact_hyperparameters
from gpytorch_hippo.metrics import gaussian_nlpd, rmse
from gpytorch_hippo.online import OnlineSGPR
from probseq._optional import require

from .datasets import DATASETS, load_dataset
from .online_elbo import ELBO_METHODS, FIRST_TASK_KERNELS, PREPROCESSINGS, run_elbo_method

#: The methods the runner compares (``--methods``).
METHODS = ("ohsgpr", "ohsgpr-rff", "ohsgpr-ode-rff", "osgpr", "osgpr-fixed", "ovc", "ovc-optz", "ovff")
#: The HiPPO covariance backends of ``--hippo-backend``.
HIPPO_BACKENDS = ("auto", "spectral", "quadrature", "lyapunov")  # the exact ones; ohsgpr-rff, ohsgpr-ode-rff: the recurrence
#: The columns of the CSV the runner writes.
COLUMNS = ("dataset", "method", "num_inducing", "seed", "task_trained", "task_eval", "nlpd", "rmse", "ece", "cum_time_s")


def make_schedule(
    method: str,
    num_inducing: int,
    series_x: torch.Tensor,
    num_tasks: int,
    osgpr_iters: int,
    measure: str = "legs",
    hippo_backend: str | None = None,
):
    """The inducing-variable schedule of ``method`` (module docstring); ``hippo_backend`` is the
    exact backend of ``ohsgpr`` (:class:`~gpytorch_hippo.HiPPOInducingVariables`'s ``method``;
    ``None``: ``lyapunov`` for LegS, else ``auto``).

    :param method: one of :data:`METHODS`.
    :param num_inducing: the number ``M`` of inducing variables (OVFF: ``(M - 1) // 2`` frequencies).
    :param series_x: the whole series' times ``(N, 1)`` (its range and spacing place the bases and features).
    :param num_tasks: the number of tasks (sets the window ``theta`` of non-LegS measures: one task's length).
    :param osgpr_iters: Adam steps on the inducing inputs per later task of ``osgpr`` and ``ovc-optz``.
    :param measure: the HiPPO measure of ``ohsgpr`` (default ``"legs"``).
    :param hippo_backend: one of :data:`HIPPO_BACKENDS`, or ``None`` (default) as above.
    """
    if hippo_backend is None:
        hippo_backend = "lyapunov" if measure == "legs" else "auto"
    if hippo_backend not in HIPPO_BACKENDS:
        raise ValueError(f"hippo_backend must be one of {', '.join(HIPPO_BACKENDS)}, got {hippo_backend!r}")
    if hippo_backend == "lyapunov" and measure != "legs":
        raise ValueError(f"hippo_backend 'lyapunov' needs measure 'legs', got {measure!r}")
    span = float(series_x.max() - series_x.min())
    spacing = span / max(series_x.shape[0] - 1, 1)
    if method in ("ohsgpr", "ohsgpr-rff", "ohsgpr-ode-rff"):
        # a window of one task's length, plus the half gaps to its neighbours: every input of a task lies in it
        options: dict[str, Any] = {"theta": span / num_tasks + 2 * spacing} if measure != "legs" else {}
        options["method"] = hippo_backend
        if method != "ohsgpr":  # Kuu from 1000 features; Kuf from the same features or from the ODE (the thesis)
            options.update(method="recurrence", dt=spacing / 4, num_rff=1000, kuf="ode" if method == "ohsgpr-ode-rff" else "rff")
        return HiPPOSchedule(num_inducing, measure, start=float(series_x.min()), **options)
    if method in ("osgpr", "osgpr-fixed"):
        return RandomPointsSchedule(num_inducing, num_iter=osgpr_iters if method == "osgpr" else 0)
    if method in ("ovc", "ovc-optz"):
        return PivotedCholeskySchedule(num_inducing, num_iter=osgpr_iters if method == "ovc-optz" else 0)
    if method == "ovff":
        return FourierSchedule((num_inducing - 1) // 2, float(series_x.min()), float(series_x.max()))
    raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")


def make_kernel(method: str, span: float) -> gpytorch.kernels.Kernel:
    """RBF (Matérn-5/2 for OVFF), length scale initialised to ``span / 50``, trained on task 1.

    :param method: one of :data:`METHODS` (``"ovff"`` gets the Matérn-5/2 kernel).
    :param span: the series' time span (last minus first time).
    :return: a float64 ``ScaleKernel``.
    """
    base = gpytorch.kernels.MaternKernel(nu=2.5) if method == "ovff" else gpytorch.kernels.RBFKernel()
    kernel = gpytorch.kernels.ScaleKernel(base).double()
    kernel.base_kernel.lengthscale = torch.tensor(span / 50, dtype=torch.float64)
    return kernel


def evaluate(model: OnlineSGPR, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    r"""Test NLPD and RMSE of the Gaussian predictive (thesis §4.6 metrics):
    :math:`-\tfrac{1}{N} \sum_i \log \mathcal{N}(y_i; \mu_i, \sigma_i^2)` and :math:`\sqrt{\tfrac{1}{N} \sum_i (y_i - \mu_i)^2}`.

    :param model: the online model (left in train mode afterwards).
    :param x: test inputs ``(N, d)``.
    :param y: test targets ``(N,)``.
    :return: ``{"nlpd": ..., "rmse": ...}``.
    """
    model.eval()
    with torch.no_grad():
        predictive = model.likelihood(model(x))
    model.train()
    return {"nlpd": gaussian_nlpd(predictive.mean, predictive.variance, y), "rmse": rmse(predictive.mean, y)}


def run_method(
    dataset: str,
    method: str,
    num_inducing: int,
    seed: int,
    num_tasks: int = 10,
    first_iters: int = 100,
    osgpr_iters: int = 100,
    lr: float | None = None,
    train_kernel: bool = False,
    measure: str = "legs",
    progress: bool = False,
    split: str | None = None,
    svgp_iters: int = 200,
    first_fit: str = "grid",
    hippo_backend: str | None = None,
    dtype: torch.dtype = torch.float64,
    first_task_kernel: str = "exact-gp",
    preprocessing: str = "thesis",
):
    """Rows of :data:`COLUMNS` for one method and seed, the final model and the data (for plots).
    Counts and multidimensional data go to :func:`~.online_elbo.run_elbo_method` (``split``,
    ``svgp_iters``, ``first_task_kernel``, ``preprocessing``); Gaussian series use the collapsed :class:`OnlineSGPR` methods, in ``dtype``
    after the first task's float64 hyperparameter fit.

    :param dataset: one of :data:`~.datasets.DATASETS`.
    :param method: one of :data:`METHODS` (Gaussian series) or of :data:`~experiments.hippo.online_elbo.ELBO_METHODS` (the others).
    :param num_inducing: the number ``M`` of inducing variables.
    :param seed: seeds the task split, the random inducing points and the initialisation.
    :param num_tasks: the number of tasks (default 10).
    :param first_iters: Adam steps of the first task's exact-GP fit, and per task with ``train_kernel`` (default 100).
    :param osgpr_iters: Adam steps on the inducing inputs per later task of ``osgpr``/``ovc-optz`` (default 100).
    :param lr: Adam learning rate; ``None`` (default): 0.05 for the Gaussian-series methods, 0.01 for the ELBO methods.
    :param train_kernel: keep training the hyperparameters on every task's online bound (default ``False``).
    :param measure: the HiPPO measure of ``ohsgpr`` (default ``"legs"``).
    :param progress: show a progress bar over the tasks (default ``False``).
    :param split: task split of multidimensional data (ELBO methods), ``"first-dim"`` or ``"l2"``; ``None`` (default):
        :func:`~gpytorch_hippo.data.split_tasks`'s default.
    :param svgp_iters: Adam steps per task of the ELBO methods (default 200).
    :param first_fit: start of the first task's fit, ``"grid"`` (default) or ``"given"``.
    :param hippo_backend: exact backend of ``ohsgpr`` (:func:`make_schedule`); ``None`` (default): by measure.
    :param dtype: dtype of the online models after the float64 fit (default ``torch.float64``).
    :param first_task_kernel: of :func:`~.online_elbo.run_elbo_method`, ``"exact-gp"`` (default) or ``"elbo"``.
    :param preprocessing: of :func:`~.online_elbo.run_elbo_method`, ``"thesis"`` (default) or ``"standardise"``.
    :return: ``(rows, final model, data set)``.
    """
    data = load_dataset(dataset)
    if data.likelihood != "gaussian" or not data.is_series:
        rows, model, _ = run_elbo_method(
            data,
            method,
            num_inducing,
            seed,
            num_tasks,
            split,
            svgp_iters,
            lr=0.01 if lr is None else lr,
            first_fit=first_fit,
            first_task_kernel=first_task_kernel,
            preprocessing=preprocessing,
        )
        return rows, model, data
    lr = 0.05 if lr is None else lr
    if method not in METHODS:
        raise ValueError(f"method {method!r} does not apply to the Gaussian series {dataset}; choose from {', '.join(METHODS)}")
    tasks = split_tasks(data, num_tasks, seed)
    span = float(data.x.max() - data.x.min())
    schedule = make_schedule(method, num_inducing, data.x, num_tasks, osgpr_iters, measure, hippo_backend)
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    kernel = make_kernel(method, span)
    likelihood = fit_exact_hyperparameters(kernel, tasks[0].train_x, tasks[0].train_y, first_iters, lr, start=first_fit)
    if not train_kernel:
        kernel.requires_grad_(False)
        likelihood.requires_grad_(False)
    kernel.to(dtype), likelihood.to(dtype)
    rows, cum_time, model = [], 0.0, None
    for k, task in enumerate(tqdm(tasks, desc=f"{method} seed {seed}", disable=not progress, leave=False)):
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # captured-variance warnings: the M sweep reports them
            num_iter = first_iters if train_kernel and schedule.num_iter == 0 else schedule.num_iter
            train_x, train_y = task.train_x.to(dtype), task.train_y.to(dtype)
            if model is None:
                ivs = schedule.first(train_x, task.t_end, kernel, generator).to(dtype)
                model = OnlineSGPR(ivs, kernel, likelihood, refit_max_change=None)  # the thesis's protocol: Adam's steps kept
                model.update(train_x, train_y, num_iter=num_iter, lr=lr)
            else:
                learn_task(model, schedule, train_x, train_y, task.t_end, generator, num_iter=num_iter, lr=lr)
        cum_time += time.perf_counter() - start
        for j, seen in enumerate(tasks[: k + 1]):
            rows.append(
                dict(
                    dataset=dataset,
                    method=method,
                    num_inducing=num_inducing,
                    seed=seed,
                    task_trained=k + 1,
                    task_eval=j + 1,
                    ece="",
                    cum_time_s=cum_time,
                    **evaluate(model, seen.test_x.to(dtype), seen.test_y.to(dtype)),
                )
            )
    return rows, model, data


def run(
    dataset: str, methods: Sequence[str], num_inducing: int, seeds: Sequence[int], progress: bool = True, out: str | None = None, **options
):
    """All rows, and the final model of each method for the first seed. With ``out``,
    ``out/results.csv`` is rewritten after every (seed, method), so that an interrupted run keeps
    the rows of the methods it finished.

    :param dataset: one of :data:`~.datasets.DATASETS`.
    :param methods: the methods to run (see :func:`run_method`).
    :param num_inducing: the number ``M`` of inducing variables.
    :param seeds: the seeds (values, not a count).
    :param progress: show progress bars (default ``True``).
    :param out: output directory of ``results.csv``; ``None`` (default): nothing written.
    :param options: further keyword arguments of :func:`run_method`.
    :return: ``(rows, {method: (model, data)})``.
    """
    rows, finals = [], {}
    for seed in seeds:
        for method in tqdm(methods, desc=f"{dataset} M={num_inducing} seed {seed}", disable=not progress):
            method_rows, model, data = run_method(dataset, method, num_inducing, seed, progress=progress, **options)
            rows += method_rows
            if out is not None:
                write_csv(rows, out)
            if seed == seeds[0]:
                finals[method] = (model, data)
    return rows, finals


def write_csv(rows: list[dict], out: str) -> str:
    """Write ``out/results.csv`` (columns :data:`COLUMNS`) and return its path.

    :param rows: the rows, dicts with the keys :data:`COLUMNS`.
    :param out: the output directory (created).
    """
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "results.csv")
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    return path


def _over_seen_tasks(rows: list[dict], method: str, metric: str) -> dict[int, list[float]]:
    """``task_trained -> [mean over the seen tasks of metric, one per seed]``."""
    per: dict[tuple, list[float]] = {}
    for r in rows:
        if r["method"] == method:
            per.setdefault((r["task_trained"], r["seed"]), []).append(float(r[metric]))
    out: dict[int, list[float]] = {}
    for (task, _), values in sorted(per.items()):
        out.setdefault(task, []).append(sum(values) / len(values))
    return out


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """Mean and half-width of the 95 % Student-t interval over seeds (0 for one seed).

    :param values: one value per seed (at least one).
    """
    import scipy.stats

    samples = torch.tensor(values, dtype=torch.float64)
    if samples.numel() < 2:
        return samples.mean().item(), 0.0
    half = scipy.stats.t.ppf(0.975, samples.numel() - 1) * samples.std().item() / math.sqrt(samples.numel())
    return samples.mean().item(), half


def summary(rows: list[dict]) -> str:
    """After the last task: NLPD and RMSE over all tasks' test points and cumulative time, mean ± 95 % CI.

    :param rows: the rows of :func:`run`.
    :return: the table as text.
    """
    last = max(r["task_trained"] for r in rows)
    metrics = ("nlpd", "rmse", "ece") if any(r["ece"] != "" for r in rows) else ("nlpd", "rmse")
    header = "".join(f"{m.upper() + ' (all tasks)':>18s} " for m in metrics)
    lines = [f"{'method':12s} {header}{'NLPD task 1':>16s} {'time (s)':>14s} {'time / ohsgpr':>14s}"]

    def total_time(method):
        return [float(r["cum_time_s"]) for r in rows if r["method"] == method and r["task_trained"] == last and r["task_eval"] == 1]

    reference = total_time("ohsgpr") or total_time("ohsvgp")
    for method in dict.fromkeys(r["method"] for r in rows):
        cells = []
        for metric in metrics:
            cells.append("{:.3f} ± {:.3f}".format(*mean_ci(_over_seen_tasks(rows, method, metric)[last])))
        first = [float(r["nlpd"]) for r in rows if r["method"] == method and r["task_trained"] == last and r["task_eval"] == 1]
        cells.append("{:.3f} ± {:.3f}".format(*mean_ci(first)))
        times = total_time(method)
        cells.append("{:.2f} ± {:.2f}".format(*mean_ci(times)))
        ratio = f"{sum(times) / sum(reference):.1f}x" if reference else "-"
        lines.append(f"{method:12s} " + "".join(f"{c:>18s} " for c in cells[:-2]) + f"{cells[-2]:>16s} {cells[-1]:>14s} {ratio:>14s}")
    return "\n".join(lines)


def plot(rows: list[dict], finals: dict, out: str) -> list[str]:
    """NLPD/RMSE vs number of learned tasks (thesis figs. 4.3/4.4) and each method's final predictive
    mean ± 2 sd over the whole series with its inducing inputs marked (fig. 4.5).

    :param rows: the rows of :func:`run`.
    :param finals: ``{method: (model, data)}`` of :func:`run`; only :class:`OnlineSGPR` models get the second figure.
    :param out: the output directory (must exist).
    :return: the paths of the figures written.
    """
    matplotlib = require("matplotlib", "plots", "the figures")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = [os.path.join(out, "online_nlpd_rmse.png"), os.path.join(out, "online_final_fit.png")]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for i, method in enumerate(dict.fromkeys(r["method"] for r in rows)):
        for ax, metric in zip(axes, ("nlpd", "rmse")):
            series = _over_seen_tasks(rows, method, metric)
            tasks = sorted(series)
            stats = [mean_ci(series[t]) for t in tasks]
            mean = [s[0] for s in stats]
            half = [s[1] for s in stats]
            ax.errorbar(tasks, mean, yerr=half, fmt="o-", color=f"C{i}", label=method, capsize=2, ms=3)
            ax.set(xlabel="number of learned tasks", ylabel=f"test {metric.upper()} over learned tasks")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(paths[0], dpi=120)
    plt.close(fig)
    finals = {m: f for m, f in finals.items() if isinstance(f[0], OnlineSGPR)}  # Gaussian series: predictive bands
    if not finals:
        return paths[:1]
    fig, axes = plt.subplots(len(finals), 1, figsize=(10, 2.2 * len(finals)), squeeze=False, sharex=True)
    for ax, (method, (model, data)) in zip(axes[:, 0], finals.items()):
        model.eval()
        with torch.no_grad():
            predictive = model.likelihood(model(data.x))
        mean, sd = predictive.mean, predictive.variance.sqrt()
        x = data.x[:, 0]
        ax.plot(x, data.y, ".", color="0.6", ms=2)
        ax.plot(x, mean, color="C0", lw=1)
        ax.fill_between(x, mean - 2 * sd, mean + 2 * sd, color="C0", alpha=0.25)
        points = getattr(model.posterior_inducing_variables, "points", None)
        if points is not None:
            ax.plot(points[:, 0], torch.full_like(points[:, 0], float(data.y.min()) - 0.3), "k|", ms=8)
        marks = " (| inducing inputs)" if points is not None else ""
        ax.set_title(f"{method}: predictive mean ± 2 sd after the last task{marks}", fontsize=9)
    axes[-1, 0].set_xlabel("time index")
    fig.tight_layout()
    fig.savefig(paths[1], dpi=110)
    plt.close(fig)
    return paths


def main(argv=None):
    """The command line (module docstring): run, write the CSV and figures, print the summary.

    :param argv: the arguments; ``None`` (default): ``sys.argv[1:]``. ``--help`` lists them.
    """
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="irradiance", choices=DATASETS)
    parser.add_argument("--split", default=None, choices=("first-dim", "l2"), help="task split of multidimensional data (§4.6.2)")
    parser.add_argument("--svgp-iters", type=int, default=200, help="Adam steps per task of the OnlineELBO methods")
    parser.add_argument("--methods", default="ohsgpr,osgpr,ovc,ovff")
    parser.add_argument("--num-inducing", type=int, default=50)
    parser.add_argument(
        "--seeds", type=int, default=None, help="number of seeds, K, K+1, ..., K+N-1 with K = --first-seed (default 3; --quick: 1)"
    )
    parser.add_argument(
        "--first-seed",
        type=int,
        default=0,
        help="first seed K (default 0): --first-seed 3 --seeds 2 runs seeds 3 and 4, the same rows "
        "as seeds 3 and 4 of --seeds 5 (the seed value, not its position, drives split and init)",
    )
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--first-iters", type=int, default=100, help="Adam steps of the exact GP fitting the hyperparameters on task 1")
    parser.add_argument(
        "--first-fit",
        default="grid",
        choices=("grid", "given"),
        help="start of the task-1 fit: the best point of a length-scale/noise grid (default; "
        "counts: a grid on the collapsed sparse bound of the log counts, then a dispersion grid; "
        "multidimensional inputs: no effect, span/4 per dimension), or 'given': length scale "
        "span/50, noise 0.1 (counts: dispersion 1; the runner before the grid; tables measured "
        "before it in docs/results.md say so)",
    )
    parser.add_argument(
        "--first-task-kernel",
        default="exact-gp",
        choices=FIRST_TASK_KERNELS,
        help="multidimensional inputs: kernel and noise from an exact ARD GP fitted to task 1 with "
        "fit_gpytorch_mll and fixed, task 1 ordered with it (default, the thesis), or 'elbo': "
        "trained on task 1's online ELBO from span/4, task 1 ordered with the starting kernel",
    )
    parser.add_argument(
        "--preprocessing",
        default="thesis",
        choices=PREPROCESSINGS,
        help="multidimensional inputs: min-max to [-1, 1] and a global 10%% test split (default, "
        "Stanton et al.'s protocol) or 'standardise': standardised inputs, 20%% of each task held out",
    )
    parser.add_argument("--osgpr-iters", type=int, default=100, help="Adam steps on inducing inputs per later task (osgpr, ovc-optz)")
    parser.add_argument("--lr", type=float, default=None, help="Adam learning rate (default 0.05; 0.01 for the ELBO methods)")
    parser.add_argument("--train-kernel", action="store_true", help="keep training hyperparameters after task 1 (App. C.4.1)")
    parser.add_argument("--measure", default="legs", choices=MEASURES, help="HiPPO measure of ohsgpr (App. C.4.2)")
    parser.add_argument(
        "--hippo-backend",
        default=None,
        choices=HIPPO_BACKENDS,
        help="exact backend of ohsgpr's HiPPO covariances: default lyapunov for --measure legs (the "
        "fastest: a constant cost per task while the kernel is fixed), auto (spectral/banded, "
        "else quadrature) for the other measures",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument(
        "--dtype",
        default="float64",
        choices=("float64", "float32"),
        help="dtype of the online models (the first task's hyperparameter fit is float64)",
    )
    parser.add_argument("--quick", action="store_true", help="3 tasks, 1 seed, few iterations (for tests)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument("--out", default="out/online")
    args = parser.parse_args(argv)
    require("matplotlib", "plots", "the runner's figures")  # before hours of training, not after
    methods = [m for m in args.methods.split(",") if m]
    for method in methods:
        if method not in METHODS + ELBO_METHODS:
            parser.error(f"--methods: unknown method {method!r}; choose from {', '.join(METHODS + ELBO_METHODS)}")
    if args.num_inducing < 1:
        parser.error(f"--num-inducing must be >= 1, got {args.num_inducing}")
    if args.measure == "fout" and args.num_inducing % 2 == 0 and any(m.startswith("ohsgpr") for m in methods):
        parser.error("--measure fout needs an odd --num-inducing")
    if args.hippo_backend == "lyapunov" and args.measure != "legs":
        parser.error(f"--hippo-backend lyapunov needs --measure legs, got {args.measure}")
    if args.first_seed < 0:
        parser.error(f"--first-seed must be >= 0, got {args.first_seed}")
    torch.set_num_threads(args.threads)
    if args.quick:
        args.tasks, args.first_iters, args.osgpr_iters, args.svgp_iters = 3, 5, 5, 5
    if args.seeds is None:
        args.seeds = 1 if args.quick else 3
    if args.seeds < 1:
        parser.error(f"--seeds must be >= 1, got {args.seeds}")
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    rows, finals = run(
        args.dataset,
        methods,
        args.num_inducing,
        seeds,
        progress=not args.quiet,
        out=args.out,
        num_tasks=args.tasks,
        first_iters=args.first_iters,
        osgpr_iters=args.osgpr_iters,
        lr=args.lr,
        train_kernel=args.train_kernel,
        measure=args.measure,
        split=args.split,
        svgp_iters=args.svgp_iters,
        first_fit=args.first_fit,
        hippo_backend=args.hippo_backend,
        dtype=getattr(torch, args.dtype),
        first_task_kernel=args.first_task_kernel,
        preprocessing=args.preprocessing,
    )
    path = write_csv(rows, args.out)
    plots = plot(rows, finals, args.out)
    print(
        f"{args.dataset}, M = {args.num_inducing}, {args.tasks} tasks, {args.seeds} seed(s) ({seeds[0]}..{seeds[-1]}); "
        "after the last task (mean ± 95% CI):"
    )
    print(summary(rows))
    print(f"wrote {path}, {', '.join(plots)}")
    return rows


if __name__ == "__main__":
    main()
