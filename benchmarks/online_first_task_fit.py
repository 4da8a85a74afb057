"""How far the online runner's task-1 hyperparameter fit gets (docs/results.md).

For each series, the exact GP of :func:`gpytorch_hippo.hyperparameters.fit_exact_hyperparameters` on
task 1 of seed 0, started from the runner's ``ℓ = span / 50`` with its 100 Adam steps (lr 0.05),
with 1000 steps, from ``ℓ = 2`` with 100 steps, and from the runner's grid start (since the fix)
with 100 steps; printed: the fitted length scale, noise and
the exact log marginal likelihood per training point (higher is a better fit).

    nice -n 19 python benchmarks/online_first_task_fit.py [--series speech,sunspots-monthly]
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: the experiments/ tree

from experiments.hippo import online  # noqa: E402
from experiments.hippo.datasets import load_dataset  # noqa: E402
from gpytorch_hippo.data import split_tasks  # noqa: E402
from gpytorch_hippo.hyperparameters import fit_exact_hyperparameters  # noqa: E402


def mll_per_point(kernel, likelihood, x, y) -> float:
    with torch.no_grad():
        covariance = kernel(x).to_dense() + likelihood.noise * torch.eye(len(x), dtype=x.dtype)
        return torch.distributions.MultivariateNormal(torch.zeros_like(y), covariance).log_prob(y).item() / len(y)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--series", default="speech,sunspots-monthly,irradiance,sunspots,irradiance-hourly")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    for name in args.series.split(","):
        data = load_dataset(name)
        task = split_tasks(data, 10, 0)[0]
        span = float(data.x.max() - data.x.min())
        cells = []
        for init, steps in ((span / 50, 100), (span / 50, 1000), (2.0, 100)):
            torch.manual_seed(0)
            kernel = online.make_kernel("ohsgpr", span)
            kernel.base_kernel.lengthscale = torch.tensor(init, dtype=torch.float64)
            likelihood = fit_exact_hyperparameters(kernel, task.train_x, task.train_y, steps, 0.05, start="given")
            cells.append(
                f"ℓ0 = {init:.1f}, {steps} steps: ℓ = {kernel.base_kernel.lengthscale.item():.2f}, "
                f"noise = {likelihood.noise.item():.3f}, "
                f"log ML/n = {mll_per_point(kernel, likelihood, task.train_x, task.train_y):.3f}"
            )
        kernel = online.make_kernel("ohsgpr", span)
        likelihood = fit_exact_hyperparameters(kernel, task.train_x, task.train_y, 100, 0.05)  # the runner's grid start
        cells.append(
            f"grid start, 100 steps: ℓ = {kernel.base_kernel.lengthscale.item():.2f}, "
            f"noise = {likelihood.noise.item():.3f}, "
            f"log ML/n = {mll_per_point(kernel, likelihood, task.train_x, task.train_y):.3f}"
        )
        print(f"{name} (task 1: {len(task.train_y)} points): " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
