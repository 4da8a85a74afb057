"""Seasonal forecasting side by side: OHSGPR with a trend + season kernel against an exact GP and classical methods.

Two real seasonal series that ship with PyPI packages are streamed in tasks; at three forecast origins every method
forecasts the next ``horizon`` readings from the data up to the origin:

* Mauna Loa CO2, weekly 1958-2001 (``statsmodels.datasets.co2``, 59 weeks missing), tasks of 26 weeks, 26 weeks ahead;
* Greensboro NC global horizontal irradiance, hourly (pvlib's TMY3 file, :func:`gpytorch_hippo.data.load_solar_series`),
  tasks of one day, 24 hours ahead.

Methods (fixed settings, the same for both series; ``s`` is the season in rows, 52 weeks or 24 hours):

* **OHSGPR**: ``OnlineSGPR`` with ``HiPPOInducingVariables(M, "legs", method="lyapunov")`` and the kernel
  ``ScaleKernel(MaternKernel(nu=2.5)) + ScaleKernel(PeriodicKernel())`` (period fixed at the season: 365.25/7 weeks,
  24 hours; the trend's length scale kept above one season with ``GreaterThan``, starting at two), a ``LinearMean``
  fitted on the first task and then fixed, noise starting at 0.1; the refit policy ``refit_every=4, refit_iter=50``
  (L-BFGS on the task's online bound; ``--refit-every 0``: the first task's fit only, every later task closed-form);
  gaps left out (``missing="drop"``); targets standardised by the first task's mean and standard deviation.  Forecasts
  are ``gpytorch_hippo.forecast.forecast`` (intervals with the noise).  Streamed: every task is absorbed, and its time
  (advance + update) is recorded.
  ``--kernel quasi-periodic`` replaces the season by one whose shape drifts from cycle to cycle,
  ``ScaleKernel(PeriodicKernel() * MaternKernel(nu=2.5))`` added to the same trend (exact under ``method="lyapunov"``):
  the period fixed at the season as above, the periodic length scale kept above 0.05 as above, and the Matérn factor's
  length scale fixed at three seasons (chosen before any run: CO2's seasonal amplitude drifts over years, irradiance's
  daily amplitude with the weather over days; fixed, so that its reach ``48 ℓ / √5``, about 64 seasons, bounds the cost
  per task: flat from day 64 of irradiance on, still growing at the end of the 44 years of CO2).  The exact GP uses the
  same kernel.
* **exact GP**: GPyTorch ``ExactGP`` with the same kernel, mean and initial values, refitted on all data up to each
  origin (``torch.optim.LBFGS``, 50 iterations) while that is at most ``EXACT_GP_MAX_POINTS`` readings; beyond, ``n/a``.
* **ETS**: statsmodels ``ETSModel`` (additive error, damped additive trend, additive season ``s``) on the last
  ``10 s`` readings, gaps linearly interpolated, its 95 % prediction interval.
* **SARIMAX**: statsmodels ``SARIMAX`` ARIMA(1,1,1) with ``K = 4`` Fourier pairs of the season as regressors
  (dynamic harmonic regression; a seasonal ARIMA with ``s = 52`` takes ~20 s per fit), same window and gaps.
* **seasonal naive**: the reading one season earlier (interpolated over gaps); interval
  ``± 1.96 σ sqrt(ceil(h/s))``, ``σ`` the standard deviation of the seasonal differences.

The origins are the task boundaries a quarter of the way, half-way and at the end of the stream.  The table gives,
per series and method, RMSE and NLPD (Gaussian, per reading) and the 95 % interval coverage over the horizons, as
mean ± standard deviation over the origins where the method ran (the exact GP: only where it fits its budget), and
the seconds per task: OHSGPR's median time of the closed-form tasks in the first and last quarter of the stream (flat
cost: the two agree) and of its refit tasks; the others' time per fit at an origin (what each would spend per task to
forecast after every task).

    python benchmarks/forecasting.py                       # both series, a few minutes on one core
    python benchmarks/forecasting.py --quick               # seconds: short stretches of both series
    python benchmarks/forecasting.py --figure docs/figures/forecasting/co2_forecast.png
    python benchmarks/forecasting.py --refit-every 0          # OHSGPR's hyperparameters fitted on the first task only
    python benchmarks/forecasting.py --kernel quasi-periodic --refit-every 0   # the season's shape drifting
"""

from __future__ import annotations

import argparse
import math
import time
import warnings
from dataclasses import dataclass

import gpytorch
import numpy as np
import pandas as pd
import torch

from gpytorch_hippo import CapturedVarianceWarning, HiPPOInducingVariables, OnlineSGPR, RefitWarning, TimeAxis
from gpytorch_hippo.forecast import forecast

#: the exact GP is refitted on all data up to an origin while there are at most this many readings
EXACT_GP_MAX_POINTS = 1200
#: inducing variables of OHSGPR
NUM_INDUCING = 96
#: L-BFGS iterations of each refit
REFIT_ITER = 50
#: the targets
RMSE_RATIO_TARGET, COVERAGE_TARGET = 1.2, (0.90, 0.98)
Z95 = 1.959963984540054


@dataclass
class Setting:
    """A series and how it is streamed: tasks of ``task`` rows after a first task of ``first`` rows, ``horizon`` ahead."""

    name: str
    unit: str
    period: float  # the season in the time unit
    season: int  # the season in rows
    first: int
    task: int
    horizon: int
    rows: int  # rows of the series used


def load_co2() -> pd.Series:
    import statsmodels.datasets.co2 as co2

    return co2.load_pandas().data["co2"]


def load_solar() -> pd.Series:
    from gpytorch_hippo.data import load_solar_series

    return load_solar_series("hourly") / 100.0  # W/m^2 / 100


SETTINGS = {
    False: [
        (Setting("co2 (weekly, ppm)", "W", 365.25 / 7, 52, 520, 26, 26, 2284), load_co2),
        (Setting("solar ghi (hourly, 100 W/m2)", "h", 24.0, 24, 14 * 24, 24, 24, 120 * 24), load_solar),
    ],
    True: [
        (Setting("co2 (weekly, ppm)", "W", 365.25 / 7, 52, 156, 26, 13, 312), load_co2),
        (Setting("solar ghi (hourly, 100 W/m2)", "h", 24.0, 24, 4 * 24, 24, 24, 9 * 24), load_solar),
    ],
}


#: the ``--kernel`` choices: the season periodic (``additive``) or periodic times a Matérn factor (``quasi-periodic``)
KERNELS = ("additive", "quasi-periodic")
#: the quasi-periodic season's Matérn factor: its length scale in seasons (fixed)
DRIFT_SEASONS = 3.0


def seasonal_kernel(setting: Setting, kind: str = "additive") -> gpytorch.kernels.Kernel:
    """Trend (Matérn-5/2 from two seasons, kept longer than one season) plus season (periodic, fixed period, length scale
    kept above 0.05; ``quasi-periodic``: times a Matérn-5/2 factor of length scale :data:`DRIFT_SEASONS` seasons, fixed),
    both scaled."""
    slower_than_a_season = gpytorch.constraints.GreaterThan(setting.period)
    trend = gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=2.5, lengthscale_constraint=slower_than_a_season))
    trend.base_kernel.lengthscale = 2 * setting.period
    # the periodic length scale kept from collapsing (a refit's line search can reach 1e-40, whose spectral lines cannot be summed)
    periodic = gpytorch.kernels.PeriodicKernel(lengthscale_constraint=gpytorch.constraints.GreaterThan(0.05))
    periodic.period_length = setting.period
    periodic.raw_period_length.requires_grad_(False)
    if kind == "quasi-periodic":
        drift = gpytorch.kernels.MaternKernel(nu=2.5)
        drift.lengthscale = DRIFT_SEASONS * setting.period
        drift.raw_lengthscale.requires_grad_(False)
        season = gpytorch.kernels.ScaleKernel(periodic * drift)
    elif kind == "additive":
        season = gpytorch.kernels.ScaleKernel(periodic)
    else:
        raise ValueError(f"kernel {kind!r}: pass one of {KERNELS}")
    return (trend + season).double()


def zero_linear_mean() -> gpytorch.means.LinearMean:
    """A linear mean that starts at zero: GPyTorch draws ``LinearMean``'s start at random, which would make every run differ."""
    mean = gpytorch.means.LinearMean(1)
    mean.initialize(weights=0.0, bias=0.0)
    return mean


def gaussian_metrics(y: np.ndarray, mean: np.ndarray, std: np.ndarray) -> tuple[float, float, float]:
    """RMSE, NLPD and 95 % coverage over the observed readings."""
    seen = ~np.isnan(y)
    y, mean, std = y[seen], mean[seen], std[seen]
    rmse = float(np.sqrt(np.mean((y - mean) ** 2)))
    nlpd = float(np.mean(0.5 * np.log(2 * np.pi * std**2) + 0.5 * ((y - mean) / std) ** 2))
    coverage = float(np.mean(np.abs(y - mean) <= Z95 * std))
    return rmse, nlpd, coverage


class OHSGPRStream:
    """OHSGPR absorbing the series task by task, forecasting at the origins."""

    def __init__(self, setting: Setting, series: pd.Series, kernel: str = "additive", refit_every: int = 4):
        self.setting, self.series, self.refit_every = setting, series, refit_every
        first = series.iloc[: setting.first]
        self.offset, self.scale = float(first.mean()), float(first.std())
        axis = TimeAxis(setting.unit, origin=series.index[0])
        likelihood = gpytorch.likelihoods.GaussianLikelihood()
        likelihood.noise = 0.1
        self.model = OnlineSGPR(
            HiPPOInducingVariables(NUM_INDUCING, "legs", t=axis(series.index[setting.first - 1]).item() + 1.0, method="lyapunov"),
            seasonal_kernel(setting, kernel),
            likelihood,
            mean_module=zero_linear_mean(),
            time_axis=axis,
            refit_every=refit_every or None,
            refit_iter=REFIT_ITER,
        ).double()
        self.times: list[tuple[float, bool]] = []  # (seconds, refit) per task

    def absorb(self, start: int, stop: int) -> None:
        task = self.series.iloc[start:stop]
        model = self.model
        began = time.perf_counter()
        if start:
            model.inducing_variables.advance(model.time_axis(task.index[-1:]).item() + 1.0)
        first_only = self.refit_every == 0 and not start  # --refit-every 0: fit the first task, as the policy does
        refit = first_only or (model.refit_every is not None and int(model.num_tasks) % model.refit_every == 0)
        fit = {"num_iter": REFIT_ITER, "optimizer": "lbfgs"} if first_only else {}
        model.update(task.index, (task - self.offset) / self.scale, missing="drop", **fit)
        self.times.append((time.perf_counter() - began, refit))

    def forecast(self, future: pd.DatetimeIndex) -> tuple[np.ndarray, np.ndarray]:
        table = forecast(self.model, future)
        return self.offset + self.scale * table["mean"].to_numpy(), self.scale * table["std"].to_numpy()


class ExactGP(gpytorch.models.ExactGP):
    def __init__(self, x, y, likelihood, kernel):
        super().__init__(x, y, likelihood)
        self.mean_module, self.covar_module = zero_linear_mean(), kernel

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def exact_gp(setting: Setting, history: pd.Series, future: pd.DatetimeIndex, offset: float, scale: float, kernel: str = "additive"):
    observed = history.dropna()
    axis = TimeAxis(setting.unit, origin=history.index[0])
    x = axis(observed.index)[:, None]
    y = torch.as_tensor((observed.to_numpy() - offset) / scale)
    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    likelihood.noise = 0.1
    model = ExactGP(x, y, likelihood, seasonal_kernel(setting, kernel)).double()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    model.train()
    optimizer = torch.optim.LBFGS([p for p in model.parameters() if p.requires_grad], max_iter=50, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = -mll(model(x), y)
        loss.backward()
        return loss

    with gpytorch.settings.max_cholesky_size(EXACT_GP_MAX_POINTS):  # exact Cholesky, not GPyTorch's iterative solves
        optimizer.step(closure)
    model.eval()
    with torch.no_grad(), gpytorch.settings.max_cholesky_size(EXACT_GP_MAX_POINTS):
        predictive = likelihood(model(axis(future)[:, None]))
    return offset + scale * predictive.mean.numpy(), scale * predictive.variance.clamp_min(0).sqrt().numpy()


def fourier_terms(rows: np.ndarray, season: float, pairs: int = 4) -> np.ndarray:
    angles = 2 * np.pi * np.outer(rows, np.arange(1, pairs + 1)) / season
    return np.concatenate([np.cos(angles), np.sin(angles)], axis=1)


def classical(method: str, setting: Setting, history: np.ndarray):
    """ETS, SARIMAX (harmonic regression) or seasonal naive on the interpolated history: (mean, std) ``horizon`` ahead."""
    s, horizon = setting.season, setting.horizon
    filled = pd.Series(history).interpolate(limit_direction="both").to_numpy()
    if method == "seasonal naive":
        steps = np.arange(1, horizon + 1)
        seasons = np.ceil(steps / s).astype(int)
        mean = filled[len(filled) - s * seasons + steps - 1]
        sigma = np.std(filled[s:] - filled[:-s])
        return mean, sigma * np.sqrt(seasons)
    window = filled[-10 * s :]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # statsmodels' convergence and frequency notes
        if method == "ETS":
            from statsmodels.tsa.exponential_smoothing.ets import ETSModel

            fit = ETSModel(pd.Series(window), error="add", trend="add", damped_trend=True, seasonal="add", seasonal_periods=s).fit(
                disp=False
            )
            frame = fit.get_prediction(start=len(window), end=len(window) + horizon - 1).summary_frame(alpha=0.05)
            lower, upper = frame["pi_lower"].to_numpy(), frame["pi_upper"].to_numpy()
        else:
            from statsmodels.tsa.statespace.sarimax import SARIMAX

            rows = np.arange(len(filled) - len(window), len(filled) + horizon)
            exog = fourier_terms(rows, setting.period if setting.unit == "h" else 365.25 / 7)
            fit = SARIMAX(window, exog=exog[: len(window)], order=(1, 1, 1)).fit(disp=False)
            frame = fit.get_forecast(horizon, exog=exog[len(window) :]).summary_frame(alpha=0.05)
            lower, upper = frame["mean_ci_lower"].to_numpy(), frame["mean_ci_upper"].to_numpy()
    return (lower + upper) / 2, (upper - lower) / (2 * Z95)


METHODS = ("OHSGPR", "exact GP", "ETS", "SARIMAX", "seasonal naive")


def run_series(
    setting: Setting, series: pd.Series, figure: str | None = None, kernel: str = "additive", refit_every: int = 4
) -> list[dict]:
    series = series.iloc[: setting.rows]
    bounds = list(range(setting.first, len(series) - setting.horizon + 1, setting.task))
    origins = {bounds[len(bounds) // 4], bounds[len(bounds) // 2], bounds[-1]}  # a quarter, half-way and the end
    stream = OHSGPRStream(setting, series, kernel, refit_every)
    results: dict[str, list[tuple[float, ...]]] = {method: [] for method in METHODS}
    seconds: dict[str, list[float]] = {method: [] for method in METHODS}
    captured = []
    start = 0
    for stop in [*bounds, len(series)]:
        if stop <= start:
            continue
        stream.absorb(start, stop)
        start = stop
        if stop not in origins:
            continue
        history, truth = series.iloc[:stop], series.iloc[stop : stop + setting.horizon]
        future = truth.index
        captured.append(stream.model.last_captured_variance)
        forecasts = {"OHSGPR": stream.forecast(future)}
        if history.notna().sum() <= EXACT_GP_MAX_POINTS:
            began = time.perf_counter()
            forecasts["exact GP"] = exact_gp(setting, history, future, stream.offset, stream.scale, kernel)
            seconds["exact GP"].append(time.perf_counter() - began)
        for method in ("ETS", "SARIMAX", "seasonal naive"):
            began = time.perf_counter()
            forecasts[method] = classical(method, setting, history.to_numpy())
            seconds[method].append(time.perf_counter() - began)
        for method, (mean, std) in forecasts.items():
            results[method].append(gaussian_metrics(truth.to_numpy(), mean, std))
        if figure is not None and stop == max(origins):
            draw(figure, setting, series, stop, future, forecasts["OHSGPR"], forecasts["ETS"])
    return [{**row, "kernel": kernel} for row in summarise(setting, results, seconds, stream.times, captured)]


def summarise(setting, results, seconds, task_times, captured) -> list[dict]:
    rows = []
    quarter = max(1, len(task_times) // 4)
    plain = [[s for s, refit in part if not refit] for part in (task_times[:quarter], task_times[-quarter:])]
    refits = [s for s, refit in task_times if refit]
    for method in METHODS:
        if not results[method]:
            rows.append({"series": setting.name, "method": method, "origins": 0})
            continue
        values = np.array(results[method])
        row = {"series": setting.name, "method": method, "origins": len(values)}
        for column, name in enumerate(("rmse", "nlpd", "coverage")):
            row[name], row[name + "_sd"] = float(values[:, column].mean()), float(values[:, column].std())
        if method == "OHSGPR":
            row["seconds"] = (
                " -> ".join(f"{np.median(part):.3f}" if part else "(refits only)" for part in plain) + f" (refits {np.median(refits):.2f})"
            )
            row["captured"] = float(np.nanmin([c for c in captured if c is not None] or [math.nan]))
        else:
            row["seconds"] = f"{np.median(seconds[method]):.3f}"
        rows.append(row)
    return rows


def draw(path: str, setting: Setting, series: pd.Series, stop: int, future, ours, ets) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = series.iloc[max(0, stop - 4 * setting.season) : stop + setting.horizon]
    fig, ax = plt.subplots(figsize=(8, 3.4))
    ax.plot(shown.index, shown.to_numpy(), ".", color="0.3", markersize=3, label="readings")
    ax.axvline(series.index[stop - 1], color="0.6", linewidth=0.8)
    for (mean, std), label, colour in ((ours, "OHSGPR", "C0"), (ets, "ETS", "C1")):
        ax.plot(future, mean, color=colour, label=f"{label} forecast")
        ax.fill_between(future, mean - Z95 * std, mean + Z95 * std, color=colour, alpha=0.2, label=f"{label} 95 % interval")
    ax.set_title(f"{setting.name}: {setting.horizon} steps ahead from the last origin")
    ax.legend(loc="upper left", fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def table(rows: list[dict]) -> str:
    lines = [f"{'series':30s} {'method':15s} {'origins':>7s} {'RMSE':>16s} {'NLPD':>16s} {'95% coverage':>14s}  seconds per task"]
    for row in rows:
        if not row["origins"]:
            lines.append(f"{row['series']:30s} {row['method']:15s} {0:7d}   n/a: over the exact-GP budget at every origin")
            continue
        lines.append(
            f"{row['series']:30s} {row['method']:15s} {row['origins']:7d} {row['rmse']:8.3f} ± {row['rmse_sd']:5.3f}"
            f" {row['nlpd']:8.3f} ± {row['nlpd_sd']:5.3f} {row['coverage']:6.2f} ± {row['coverage_sd']:4.2f}  {row['seconds']}"
        )
    for name in dict.fromkeys(row["series"] for row in rows):
        ours = next(row for row in rows if row["series"] == name and row["method"] == "OHSGPR")
        best = min(
            (row for row in rows if row["series"] == name and row["method"] in ("ETS", "SARIMAX", "seasonal naive")),
            key=lambda r: r["rmse"],
        )
        ratio = ours["rmse"] / best["rmse"]
        inside = COVERAGE_TARGET[0] <= ours["coverage"] <= COVERAGE_TARGET[1]
        lines.append(
            f"{name}: OHSGPR RMSE / best classical ({best['method']}) = {ratio:.2f} "
            f"(target <= {RMSE_RATIO_TARGET}: {'met' if ratio <= RMSE_RATIO_TARGET else 'missed'}); "
            f"coverage {ours['coverage']:.2f} "
            f"(target {COVERAGE_TARGET[0]}-{COVERAGE_TARGET[1]}: {'met' if inside else 'missed'}); "
            f"lowest captured variance {ours['captured']:.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short stretches of both series (seconds)")
    parser.add_argument("--figure", default=None, help="save the CO2 forecast at the last origin to this PNG")
    parser.add_argument(
        "--kernel", choices=KERNELS, default="additive", help="the season: periodic, or periodic x Matérn (default: %(default)s)"
    )
    parser.add_argument(
        "--refit-every", type=int, default=4, help="refit OHSGPR every this many tasks; 0: on the first task only (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    if args.refit_every < 0:
        parser.error(f"--refit-every must be 0 (the first task only) or a positive number of tasks, got {args.refit_every}")
    torch.set_num_threads(1)
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CapturedVarianceWarning)  # reported in the table instead
        warnings.simplefilter("ignore", RefitWarning)  # an undone refit keeps the previous hyperparameters
        for index, (setting, load) in enumerate(SETTINGS[args.quick]):
            rows += run_series(setting, load(), args.figure if index == 0 else None, args.kernel, args.refit_every)
    print(f"kernel: {args.kernel}, OHSGPR refits: {f'every {args.refit_every} tasks' if args.refit_every else 'the first task only'}")
    print(table(rows))
    return rows


if __name__ == "__main__":
    main()
