"""Online time-series regression: OHSGPR vs OSGPR over sequential tasks (thesis §4.5, fig.
``time_series_regression``), on the daily solar irradiance series bundled with pvlib.

The training points are split chronologically into ``--tasks`` equal tasks seen one at a time;
after each task every method predicts the held-out test points of all tasks seen so far (RMSE and
NLPD).  Kernel hyperparameters (RBF, noise) are trained on the first task only and then fixed,
the thesis's main setting; later tasks use no optimisation at all (``num_iter=0``).

* ``ohsgpr``: HiPPO-LegS inducing variables, quadrature backend, advanced to each task's end;
* ``ohsgpr-rec``: the same with the thesis's recurrence + ``--num-rff`` random Fourier features
  (10,000 by default: with the thesis's 1000 the RFF ``Kuu`` is inconsistent enough with the
  exact ``Kuf`` to give negative predictive variances here, see ``docs/results.md``);
* ``ohsgpr-rff``: the recurrence with the thesis's 1000 features used for ``Kuf`` too
  (``kuf="rff"``), which keeps ``Kuf`` and ``Kuu`` consistent;
* ``osgpr``: ``M`` inducing points re-drawn for each task from the old points and the new inputs
  (the thesis's OSGPR initialisation), then fixed.

    python -m gpytorch_hippo.experiments.online_time_series --out out/online --seeds 3
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import time
from typing import Dict, List

import gpytorch
import torch
from tqdm.auto import tqdm

from ..data import load_solar_ghi
from ..inducing import HiPPOInducingVariables, InducingPoints
from ..online import OnlineSGPR

METHODS = ("ohsgpr", "ohsgpr-rec", "ohsgpr-rff", "osgpr")
COLUMNS = ("dataset", "method", "seed", "task", "num_inducing", "rmse", "nlpd", "seconds")


def split_tasks(times: torch.Tensor, y: torch.Tensor, num_tasks: int, test_fraction: float, generator: torch.Generator):
    """Random train/test split, then ``num_tasks`` chronological tasks with equal numbers of training points."""
    is_test = torch.rand(times.shape[0], generator=generator, dtype=torch.float64) < test_fraction
    train_idx = torch.nonzero(~is_test).squeeze(-1)
    chunks = torch.tensor_split(train_idx, num_tasks)
    # a task ends halfway to the next task's first input; the last one at the end of the series
    ends = [float(times[a[-1]] + times[b[0]]) / 2 for a, b in zip(chunks[:-1], chunks[1:])] + [float(times[-1])]
    return chunks, ends, torch.nonzero(is_test).squeeze(-1)


def make_model(method: str, num_inducing: int, t_end: float, x_first: torch.Tensor, generator: torch.Generator,
               num_rff: int = 10_000) -> OnlineSGPR:
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())
    kernel.base_kernel.lengthscale = 10.0
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    likelihood.noise = 0.5
    if method == "ohsgpr":
        inducing = HiPPOInducingVariables(num_inducing, "legs", t=t_end)
    elif method == "ohsgpr-rec":
        inducing = HiPPOInducingVariables(num_inducing, "legs", t=t_end, method="recurrence", dt=0.25, num_rff=num_rff,
                                          kuf="ode")  # the thesis: ODE Kuf, random-feature Kuu
    elif method == "ohsgpr-rff":
        inducing = HiPPOInducingVariables(num_inducing, "legs", t=t_end, method="recurrence", dt=0.25, num_rff=1000,
                                          kuf="rff")
    elif method == "osgpr":
        pick = torch.randperm(x_first.shape[0], generator=generator)[:num_inducing]
        inducing = InducingPoints(x_first[pick].reshape(-1, 1), learn=False)
    else:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    return OnlineSGPR(inducing, kernel, likelihood).double()


def next_inducing(model: OnlineSGPR, method: str, t_end: float, x_new: torch.Tensor, generator: torch.Generator) -> None:
    """Move the inducing variables to the next task (in place for HiPPO; re-drawn points for OSGPR)."""
    if method.startswith("ohsgpr"):
        model.inducing_variables.advance(t_end)
        return
    old = model.inducing_variables.points.detach().reshape(-1)
    pool = torch.cat([old, x_new.reshape(-1)])
    pick = torch.randperm(pool.shape[0], generator=generator)[: old.shape[0]]
    model.inducing_variables = InducingPoints(pool[pick].reshape(-1, 1), learn=False).double()


def evaluate(model: OnlineSGPR, x: torch.Tensor, y: torch.Tensor) -> Dict[str, float]:
    model.eval()
    with torch.no_grad():
        predictive = model.likelihood(model(x))
        mean, var = predictive.mean, predictive.variance
    model.train()
    rmse = (mean - y).pow(2).mean().sqrt().item()
    nlpd = (0.5 * torch.log(2 * math.pi * var) + 0.5 * (y - mean) ** 2 / var).mean().item()
    return {"rmse": rmse, "nlpd": nlpd}


def run(methods=METHODS, seeds=(0,), num_tasks=10, num_inducing=50, first_iters=100, lr=0.05,
        test_fraction=0.2, num_rff=10_000, progress=True) -> List[dict]:
    """Rows of ``COLUMNS``: metrics on the test points of all tasks seen so far, after every task."""
    times, ghi = load_solar_ghi("daily")
    y = (ghi - ghi.mean()) / ghi.std()
    rows = []
    jobs = [(seed, method) for seed in seeds for method in methods]
    for seed, method in tqdm(jobs, desc="online regression", disable=not progress):
        generator = torch.Generator().manual_seed(seed)
        chunks, ends, test_idx = split_tasks(times, y, num_tasks, test_fraction, generator)
        model = None
        for task, (chunk, t_end) in enumerate(zip(chunks, ends)):
            x_task, y_task = times[chunk], y[chunk]
            start = time.perf_counter()
            if model is None:
                model = make_model(method, num_inducing, t_end, x_task, generator, num_rff)
                model.update(x_task, y_task, num_iter=first_iters, lr=lr)
            else:
                next_inducing(model, method, t_end, x_task, generator)
                model.update(x_task, y_task, num_iter=0)
            seconds = time.perf_counter() - start
            seen = test_idx[times[test_idx] <= t_end]
            metrics = evaluate(model, times[seen], y[seen])
            rows.append(dict(dataset="solar_daily", method=method, seed=seed, task=task + 1,
                             num_inducing=num_inducing, seconds=seconds, **metrics))
    return rows


def write_outputs(rows: List[dict], out: str) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.csv"), "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for i, method in enumerate(dict.fromkeys(r["method"] for r in rows)):
        for ax, metric in zip(axes, ("nlpd", "rmse")):
            tasks = sorted({r["task"] for r in rows if r["method"] == method})
            values = [torch.tensor([r[metric] for r in rows if r["method"] == method and r["task"] == k]) for k in tasks]
            mean = torch.stack([v.mean() for v in values])
            ax.plot(tasks, mean, "o-", color=f"C{i}", label=method)
            ax.set(xlabel="number of learned tasks", ylabel=f"test {metric.upper()} over learned tasks")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "online_regression.png"), dpi=120)
    plt.close(fig)


def print_table(rows: List[dict]) -> None:
    """Final-task metrics per method: mean ± 2 standard errors over seeds."""
    last = max(r["task"] for r in rows)
    print(f"after task {last} (test points of all tasks):   RMSE             NLPD      seconds/task")
    for method in dict.fromkeys(r["method"] for r in rows):
        final = [r for r in rows if r["method"] == method and r["task"] == last]
        cells = []
        for metric in ("rmse", "nlpd"):
            values = torch.tensor([r[metric] for r in final], dtype=torch.float64)
            if len(values) > 1:
                cells.append(f"{values.mean():.3f} ± {2 * values.std() / math.sqrt(len(values)):.3f}")
            else:
                cells.append(f"{values.item():.3f}")
        per_task = sum(r["seconds"] for r in rows if r["method"] == method) / sum(1 for r in rows if r["method"] == method)
        print(f"  {method:12s}                          {cells[0]:>15s}  {cells[1]:>15s}  {per_task:8.3f}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--num-inducing", type=int, default=50)
    parser.add_argument("--num-rff", type=int, default=10_000,
                        help="random features of ohsgpr-rec (the thesis uses 1000; see docs/results.md)")
    parser.add_argument("--out", default="out/online")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    for method in methods:
        if method not in METHODS:
            parser.error(f"--methods: unknown method {method!r}; choose from {', '.join(METHODS)}")
    rows = run(methods, range(args.seeds), args.tasks, args.num_inducing, num_rff=args.num_rff, progress=not args.quiet)
    write_outputs(rows, args.out)
    print_table(rows)
    print(f"wrote {args.out}/results.csv and {args.out}/online_regression.png")


if __name__ == "__main__":
    main()
