"""The main demo's data and output, against pvlib's own reader and a direct quadrature projection;
its online part: the runner's CSV schema, the printed table, and what it shows (OSGPR forgets task 1,
OHSGPR does not)."""

import csv
import os

import numpy as np
import pvlib
import torch

from gpytorch_hippo.__main__ import main
from gpytorch_hippo.data import load_solar_ghi
from gpytorch_hippo.experiments.online import COLUMNS
from gpytorch_hippo.hippo import HiPPO


def test_daily_ghi_equals_pvlib_daily_means():
    frame, _ = pvlib.iotools.read_tmy3(os.path.join(os.path.dirname(pvlib.__file__), "data", "723170TYA.CSV"), map_variables=True)
    hourly = frame["ghi"].to_numpy(dtype=float)
    times, daily = load_solar_ghi("daily")
    assert times.shape == daily.shape == (365,)
    np.testing.assert_allclose(daily.numpy(), hourly.reshape(365, 24).mean(axis=1), rtol=1e-12)
    _, raw = load_solar_ghi("hourly")
    np.testing.assert_array_equal(raw.numpy(), hourly)


def test_demo_writes_figure_and_legs_state_matches_projection(tmp_path, capsys):
    main(["--out", str(tmp_path), "--M", "8", "--no-online"])  # part 2: test_demo_online_part_shows_forgetting
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


def test_demo_online_part_shows_forgetting(tmp_path, capsys):
    """``--quick`` is the demo's own setting (M = 20, 10 tasks, 100 OSGPR steps per task) with seed 0 only."""
    main(["--out", str(tmp_path), "--M", "8", "--quick"])
    out = capsys.readouterr().out
    with open(tmp_path / "results.csv", newline="") as handle:
        reader = csv.DictReader(handle)
        assert tuple(reader.fieldnames) == COLUMNS
        rows = list(reader)
    methods = ("ohsgpr", "osgpr", "ovc", "ovff")
    assert {r["method"] for r in rows} == set(methods)
    assert {r["seed"] for r in rows} == {"0"} and {r["num_inducing"] for r in rows} == {"20"}
    assert len(rows) == len(methods) * sum(range(1, 11))  # after task k: the test points of tasks 1..k
    assert (tmp_path / "online_forgetting.png").stat().st_size > 10_000
    # the printed table: task-1 RMSE and NLPD rows and a time row per method, one column per task
    lines = out.splitlines()
    for header in ("task-1 RMSE after task", "task-1 NLPD after task", "time per task (s)"):
        start = next(i for i, line in enumerate(lines) if line.strip().startswith(header))
        block = [line.split() for line in lines[start + 1 : start + 5]]
        assert [cells[0] for cells in block] == ["OHSGPR", "OSGPR", "OVC", "OVFF"]
        assert all(len(cells) == (11 if "task-1" in header else 5) for cells in block)  # one seed: no min-max
    assert "python -m gpytorch_hippo.experiments.online" in out and "±" not in out

    def task1_rmse(method):
        per_task = {int(r["task_trained"]): float(r["rmse"]) for r in rows if r["method"] == method and r["task_eval"] == "1"}
        return per_task[1], per_task[10]

    # measured (seed 0): OHSGPR 0.49 -> 0.48, OVC the same, OSGPR 0.49 -> 1.15
    first, last = task1_rmse("ohsgpr")
    assert abs(last - first) < 0.05
    first, last = task1_rmse("ovc")
    assert abs(last - first) < 0.05
    first, last = task1_rmse("osgpr")
    assert last > first + 0.3
