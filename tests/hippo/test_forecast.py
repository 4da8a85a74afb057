"""forecast(model, future_times): a pandas table of the model's own predictive distribution, and its named errors."""

import gpytorch
import numpy as np
import pandas as pd
import pytest
import scipy.stats
import torch

from gpytorch_hippo import HiPPOInducingVariables, OnlineSGPR, TimeAxis
from gpytorch_hippo.forecast import forecast

DT = torch.float64


def hourly_model(zone=None):
    """Four days of hourly readings with a daily season, streamed in two tasks on a calendar axis."""
    hours = pd.date_range("2013-01-01", periods=96, freq="h", tz=zone)
    series = pd.Series(np.sin(2 * np.pi * np.arange(96) / 24) + 0.05 * np.cos(np.arange(96)), index=hours)
    periodic = gpytorch.kernels.ScaleKernel(gpytorch.kernels.PeriodicKernel())
    periodic.base_kernel.period_length = 24.0
    trend = gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=2.5))
    trend.base_kernel.lengthscale = 48.0
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    likelihood.noise = 0.01
    axis = TimeAxis("h", origin=hours[0])
    model = OnlineSGPR(
        HiPPOInducingVariables(32, "legs", t=axis(hours[47]).item(), method="lyapunov"),
        trend + periodic,
        likelihood,
        time_axis=axis,
        captured_variance_warning=None,
    ).double()
    model.update(series.index[:48], series.iloc[:48])
    model.inducing_variables.advance(model.time_axis(hours[-1]).item())
    model.update(series.index[48:], series.iloc[48:])
    return model, hours


def test_forecast_is_the_models_predictive_distribution_indexed_by_the_future_timestamps():
    model, hours = hourly_model()
    future = pd.date_range(hours[-1] + pd.Timedelta("1h"), periods=24, freq="h")
    table = forecast(model, future, level=0.9)
    assert list(table.columns) == ["mean", "std", "lower", "upper"]
    assert table.index.equals(future)
    model.eval()
    with torch.no_grad():
        latent = model(model.time_axis(future)[:, None])
    noise = model.likelihood.noise.item()
    np.testing.assert_allclose(table["mean"], latent.mean.numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(table["std"], np.sqrt(latent.variance.numpy() + noise), rtol=1e-12)  # noise included
    z = scipy.stats.norm.ppf(0.95)
    np.testing.assert_allclose(table["upper"] - table["mean"], z * table["std"], rtol=1e-12)
    np.testing.assert_allclose(table["mean"] - table["lower"], z * table["std"], rtol=1e-12)
    of_f = forecast(model, future, include_noise=False)
    np.testing.assert_allclose(of_f["std"], np.sqrt(latent.variance.numpy()), rtol=1e-12)
    model.train()
    forecast(model, future)
    assert model.training  # left in the mode it was in


def test_forecast_with_numbers_and_zones():
    model, hours = hourly_model(zone="Europe/London")
    future = pd.date_range(hours[-1], periods=3, freq="h")
    assert forecast(model, future).index.tz is not None
    numbers = forecast(model, np.array([96.0, 97.0]))
    assert isinstance(numbers.index, pd.Index) and not isinstance(numbers.index, pd.DatetimeIndex)
    np.testing.assert_allclose(numbers["mean"], forecast(model, future[1:3])["mean"], atol=1e-12)
    with pytest.raises(TypeError, match="tz_localize"):
        forecast(model, future.tz_localize(None))


def test_forecast_names_its_errors():
    model, hours = hourly_model()
    future = pd.date_range(hours[-1], periods=4, freq="h")
    with pytest.raises(ValueError, match="time order"):
        forecast(model, future[::-1])
    with pytest.raises(ValueError, match="NaN"):
        forecast(model, [97.0, float("nan")])
    with pytest.raises(ValueError, match="NaT"):
        forecast(model, pd.DatetimeIndex([future[0], pd.NaT]))
    with pytest.raises(ValueError, match="level"):
        forecast(model, future, level=95)
    empty = OnlineSGPR(HiPPOInducingVariables(8, t=1.0), gpytorch.kernels.RBFKernel(), gpytorch.likelihoods.GaussianLikelihood())
    with pytest.raises(ValueError, match="update"):
        forecast(empty, [2.0])
    empty.update(torch.linspace(0, 1, 5)[:, None], torch.zeros(5))
    with pytest.raises(TypeError, match="time_axis"):
        forecast(empty, future)


def test_the_loaders_keep_their_timestamps():
    """The pandas loaders carry the same values as the tensor loaders, on increasing calendar indexes."""
    pytest.importorskip("pvlib")
    from gpytorch_hippo.data import load_solar_ghi, load_solar_series, load_weather, load_weather_frame

    for resolution, step in (("hourly", "1h"), ("daily", "1D")):
        series = load_solar_series(resolution)
        assert isinstance(series.index, pd.DatetimeIndex) and series.index.tz is not None
        assert (series.index[1:] - series.index[:-1] == pd.Timedelta(step)).all()
        np.testing.assert_array_equal(series.to_numpy(), load_solar_ghi(resolution)[1].numpy())
    frame = load_weather_frame("tmy3")
    _, values, names = load_weather("tmy3")
    assert list(frame.columns) == names and frame.index.is_monotonic_increasing and len(frame.index) == 8760
    np.testing.assert_array_equal(frame.to_numpy(), values.numpy())


def test_the_forecasting_benchmark_runs_its_quick_setting(capsys):
    """benchmarks/forecasting.py --quick: every method on both series, metrics that are numbers, the targets stated."""
    pytest.importorskip("statsmodels")
    pytest.importorskip("pvlib")
    import runpy
    from pathlib import Path

    benchmark = runpy.run_path(str(Path(__file__).parents[2] / "benchmarks" / "forecasting.py"))
    rows = benchmark["main"](["--quick"])
    assert {row["method"] for row in rows} == set(benchmark["METHODS"]) and len(rows) == 2 * len(benchmark["METHODS"])
    for row in rows:
        assert row["origins"] == 3 and np.isfinite([row["rmse"], row["nlpd"]]).all() and 0 <= row["coverage"] <= 1
    printed = capsys.readouterr().out
    assert printed.count("OHSGPR RMSE / best classical") == 2 and "coverage" in printed


def test_the_forecasting_benchmarks_quasi_periodic_kernel_runs_on_a_short_stretch_of_co2():
    """benchmarks/forecasting.py --kernel quasi-periodic --refit-every 0, smallest setting: two years of weekly CO2, then
    half-years, forecast 13 weeks ahead at three origins; the season Matérn x periodic is taken by method='lyapunov', the
    hyperparameters fitted on the first task only; unknown choices are usage errors naming the choices."""
    pytest.importorskip("statsmodels")
    import runpy
    from pathlib import Path

    benchmark = runpy.run_path(str(Path(__file__).parents[2] / "benchmarks" / "forecasting.py"))
    setting = benchmark["Setting"]("co2 (weekly, ppm)", "W", 365.25 / 7, 52, 104, 26, 13, 182)
    series = benchmark["load_co2"]()
    season = benchmark["seasonal_kernel"](setting, "quasi-periodic").kernels[1]
    assert isinstance(season.base_kernel, gpytorch.kernels.ProductKernel)
    assert HiPPOInducingVariables(8, "legs", t=104.0, method="lyapunov").backend_for(season).name == "lyapunov"
    rows = benchmark["run_series"](setting, series, kernel="quasi-periodic", refit_every=0)
    assert [row["method"] for row in rows] == list(benchmark["METHODS"]) and {row["kernel"] for row in rows} == {"quasi-periodic"}
    for row in rows:
        assert row["origins"] == 3 and np.isfinite([row["rmse"], row["nlpd"]]).all() and 0 <= row["coverage"] <= 1
    assert rows[0]["seconds"].endswith(")") and "refits" in rows[0]["seconds"]  # the first task's fit, timed apart
    with pytest.raises(ValueError, match="additive"):
        benchmark["seasonal_kernel"](setting, "periodic")
    with pytest.raises(SystemExit):
        benchmark["main"](["--refit-every", "-1"])


@pytest.mark.slow
def test_the_guides_seasonal_recipe_runs_and_covers_the_next_half_year():
    """The code of the user guide's "Forecasting a seasonal series", run as written: 26 weeks of CO2 ahead."""
    pytest.importorskip("statsmodels")
    from pathlib import Path

    guide = (Path(__file__).parents[2] / "docs" / "guide" / "hippo.md").read_text()
    section = guide[guide.index("## Forecasting a seasonal series") :]
    code = section[section.index("```python") + len("```python") : section.index("```\n", section.index("```python") + 9)]
    namespace: dict = {}
    exec(compile(code, "hippo.md", "exec"), namespace)
    table, series = namespace["table"], namespace["series"]
    assert table.index.equals(series.index[1560:1586]) and list(table.columns) == ["mean", "std", "lower", "upper"]
    truth = series.iloc[1560:1586].dropna()
    inside = (truth >= table["lower"][truth.index]) & (truth <= table["upper"][truth.index])
    assert inside.mean() >= 0.8 and (table["mean"][truth.index] - truth).abs().mean() < 1.0  # ppm
