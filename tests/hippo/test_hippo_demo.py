"""The main demo's data and output, against pvlib's own reader and a direct quadrature projection."""
import os

import numpy as np
import pvlib
import torch

from gpytorch_hippo.__main__ import main
from gpytorch_hippo.data import load_solar_ghi
from gpytorch_hippo.hippo import HiPPO


def test_daily_ghi_equals_pvlib_daily_means():
    frame, _ = pvlib.iotools.read_tmy3(
        os.path.join(os.path.dirname(pvlib.__file__), "data", "723170TYA.CSV"), map_variables=True
    )
    hourly = frame["ghi"].to_numpy(dtype=float)
    times, daily = load_solar_ghi("daily")
    assert times.shape == daily.shape == (365,)
    np.testing.assert_allclose(daily.numpy(), hourly.reshape(365, 24).mean(axis=1), rtol=1e-12)
    _, raw = load_solar_ghi("hourly")
    np.testing.assert_array_equal(raw.numpy(), hourly)


def test_demo_writes_figure_and_legs_state_matches_projection(tmp_path, capsys):
    main(["--out", str(tmp_path), "--M", "8", "--no-online"])  # part 2 is tested in test_online_experiment.py
    assert (tmp_path / "hippo_memory.png").stat().st_size > 10_000
    out = capsys.readouterr().out
    assert all(measure in out for measure in ("legs", "legt", "lagt", "fout"))
    # the streamed LegS state equals the exact projection (eq. hippo_coef) of the series' linear
    # interpolant up to the bilinear scheme's O(h^2) error; the reference integrates each day
    # exactly with 5-point Gauss-Legendre (the integrand is a polynomial of degree <= 8 there)
    times, ghi = load_solar_ghi("daily")
    values = (ghi - ghi.mean()) / ghi.std()
    memory = HiPPO("legs", 8)
    state = memory.final_state(values, times)
    z, w = np.polynomial.legendre.leggauss(5)
    nodes = torch.from_numpy((times[:-1, None].numpy() + (z + 1) / 2).ravel())
    weights = torch.from_numpy(np.tile(w / 2, 364)) / 364.0
    interp = torch.from_numpy(np.interp(nodes.numpy(), times.numpy(), values.numpy()))
    exact = (interp * weights) @ memory.basis(nodes, 364.0)
    assert (state - exact).abs().max() < 1e-3
