r"""How much of the prior each task keeps in a HiPPO memory of ``M`` variables.

Usage::

    python -m experiments.hippo.captured_variance --dataset sunspots-monthly \
        --num-inducing 50,150,250 --seeds 3

For each seed the series is split as in :mod:`experiments.hippo.online` (same tasks, same random test points), the
RBF hyperparameters are fitted on task 1 as there (:func:`gpytorch_hippo.hyperparameters.fit_exact_hyperparameters`), and the
HiPPO inducing variables (LegS unless ``--measure``) at the end of the stream,
``HiPPOInducingVariables(M, measure, t=t_end)``, report
:meth:`~gpytorch_hippo.InducingVariables.captured_variance` at each task's test inputs: the fraction
:math:`[K_{fu} K_{uu}^{-1} K_{uf}]_{nn} / k(x_n, x_n)` of the prior variance that OHSGPR's sparse prior keeps
there after the last task (1: the full GP's prior). Where it is low the online posterior
cannot hold what that task taught it, whatever the online algebra does. Prints :math:`t/\ell` and a
Markdown row per ``(seed, M)``; ``--csv`` also writes them
(``dataset,seed,num_inducing,t_over_lengthscale,task,captured``).
"""

from __future__ import annotations

import argparse
import csv
from typing import Any

import torch

from gpytorch_hippo.data import split_tasks
from gpytorch_hippo.hippo import MEASURES
from gpytorch_hippo.hyperparameters import fit_exact_hyperparameters
from gpytorch_hippo.inducing import HiPPOInducingVariables

from .datasets import DATASETS, load_dataset
from .online import make_kernel

__all__ = ["captured_by_task", "main"]


def captured_by_task(
    dataset: str, num_inducing: list[int], seed: int, num_tasks: int = 10, measure: str = "legs", first_iters: int = 100, lr: float = 0.05
) -> tuple[float, dict]:
    r"""``(t/ℓ, {M: [captured fraction at task k's test inputs, k = 1..num_tasks]})`` for one seed, the fraction being
    :math:`[K_{fu} K_{uu}^{-1} K_{uf}]_{nn} / k(x_n, x_n)` averaged over the task's test inputs (module docstring).

    :param dataset: a Gaussian time series of :data:`~.datasets.DATASETS`.
    :param num_inducing: the values of ``M`` to report.
    :param seed: seeds the task split and the fit.
    :param num_tasks: the number of tasks (default 10).
    :param measure: the HiPPO measure (default ``"legs"``; others get a window of one task's length).
    :param first_iters: Adam steps of the first task's exact-GP fit (default 100).
    :param lr: their learning rate (default 0.05).
    """
    data = load_dataset(dataset)
    if not data.is_series or data.likelihood != "gaussian":
        raise ValueError(f"dataset must be a Gaussian time series, got {dataset!r}")
    tasks = split_tasks(data, num_tasks, seed)
    torch.manual_seed(seed)
    start, end = float(data.x.min()), float(data.x.max())
    kernel = make_kernel("ohsgpr", end - start)
    fit_exact_hyperparameters(kernel, tasks[0].train_x, tasks[0].train_y, first_iters, lr)
    kernel.requires_grad_(False)
    options: dict[str, Any] = {"theta": (end - start) / num_tasks} if measure != "legs" else {}
    out = {}
    for m in num_inducing:
        variables = HiPPOInducingVariables(m, measure, t=end, start=start, **options).double()
        out[m] = [float(variables.captured_variance(kernel, task.test_x)) for task in tasks]
    return (end - start) / float(kernel.base_kernel.lengthscale), out


def main(argv=None):
    """The command line (module docstring): print the table (and write the CSV with ``--csv``).

    :param argv: the arguments; ``None`` (default): ``sys.argv[1:]``. ``--help`` lists them.
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", required=True, choices=sorted(DATASETS))
    parser.add_argument("--num-inducing", default="50,150", help="comma-separated M values")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--measure", default="legs", choices=MEASURES)
    parser.add_argument("--csv", default=None, help="also write the rows to this CSV file")
    args = parser.parse_args(argv)
    try:
        sizes = [int(m) for m in args.num_inducing.split(",")]
    except ValueError:
        parser.error(f"--num-inducing must be comma-separated integers, got {args.num_inducing!r}")
    if min(sizes) < 1 or args.seeds < 1 or args.tasks < 1 or args.first_seed < 0:
        parser.error("--num-inducing, --seeds and --tasks must be positive and --first-seed non-negative")
    rows = []
    print("| seed | t/ℓ | M | " + " | ".join(f"task {k + 1}" for k in range(args.tasks)) + " | mean |")
    print("| --- " * (args.tasks + 4) + "|")
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        ratio, captured = captured_by_task(args.dataset, sizes, seed, args.tasks, args.measure)
        for m, values in captured.items():
            print(f"| {seed} | {ratio:.0f} | {m} | " + " | ".join(f"{v:.3f}" for v in values) + f" | {sum(values) / len(values):.3f} |")
            rows += [
                dict(dataset=args.dataset, seed=seed, num_inducing=m, t_over_lengthscale=ratio, task=k + 1, captured=v)
                for k, v in enumerate(values)
            ]
    if args.csv:
        with open(args.csv, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        print(f"wrote {args.csv}")


if __name__ == "__main__":
    main()
