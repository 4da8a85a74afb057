"""The TMY3 irradiance data (gpytorch_hippo.data.solar): the global horizontal irradiance against pvlib's own
reader, and the plane-of-array objective of streaming Bayesian optimisation against the physics it encodes."""

import os

import numpy as np
import pvlib
import pytest

from gpytorch_hippo.data import IrradianceObjective, load_solar_ghi


def test_daily_ghi_equals_pvlib_daily_means():
    frame, _ = pvlib.iotools.read_tmy3(os.path.join(os.path.dirname(pvlib.__file__), "data", "723170TYA.CSV"), map_variables=True)
    hourly = frame["ghi"].to_numpy(dtype=float)
    times, daily = load_solar_ghi("daily")
    assert times.shape == daily.shape == (365,)
    np.testing.assert_allclose(daily.numpy(), hourly.reshape(365, 24).mean(axis=1), rtol=1e-12)
    _, raw = load_solar_ghi("hourly")
    np.testing.assert_array_equal(raw.numpy(), hourly)


@pytest.fixture(scope="module")
def objective():
    return IrradianceObjective()


def test_best_panel_faces_the_sun_in_clear_hours(objective):
    # Under a clear sky (beam >> diffuse) the plane-of-array irradiance is largest when the panel
    # is normal to the beam: tilt = solar zenith, azimuth = solar azimuth, and the value is at
    # least the direct normal irradiance.
    clear = [
        h for h in objective.hours[:400] if objective.dni[h] > 700 and 100 < objective.sun_azimuth[h] < 260 and objective.zenith[h] < 85
    ]
    assert len(clear) > 20
    for hour in clear[:: max(1, len(clear) // 10)]:
        values = objective(objective.grid, hour)
        tilt, azimuth = objective.grid[values.argmax()]
        assert abs(90 * tilt - objective.zenith[hour]) < 6, hour
        assert abs(90 + 180 * azimuth - objective.sun_azimuth[hour]) < 10, hour
        assert values.max() >= objective.dni[hour] / 1000 - 1e-9
