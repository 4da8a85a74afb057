"""The main demo's output, against a direct quadrature projection (its data: test_data_solar.py);
its online part: the runner's CSV schema, the printed table, and what it shows (OSGPR forgets task 1,
OHSGPR does not)."""

import csv

import numpy as np
import pytest
import torch

import gpytorch_hippo.__main__ as demo
from experiments.hippo.online import COLUMNS
from gpytorch_hippo.__main__ import main, plot_forgetting
from gpytorch_hippo.data import load_solar_ghi
from gpytorch_hippo.hippo import HiPPO


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


def test_demo_online_part_shows_forgetting(tmp_path, capsys, monkeypatch):
    """``--quick`` is the demo's own setting (M = 20, 10 tasks, 100 OSGPR steps per task) with seed 0 only."""
    figures, online_runs = _record_figures_and_online_runs(monkeypatch)
    main(["--out", str(tmp_path), "--M", "8", "--quick"])
    captured = capsys.readouterr()
    out = captured.out
    # progress: each part says what it starts, with counts, before its minutes of work; bars on stderr
    assert out.startswith("1. streaming the series through 4 HiPPO memories (legs, legt, lagt, fout) ...\n")
    announce = out.index("2. training 4 online sparse GPs (OHSGPR, OSGPR, OVC, OVFF) on 10 tasks with 1 seed(s): 4 runs ...")
    assert announce < out.index("task-1 RMSE after task")
    assert "ohsgpr seed 0" in captured.err and "irradiance M=20 seed 0" in captured.err
    # the figures: titles inside the figure and apart, complete legends (with several seeds the
    # panels' titles grew and overlapped)
    (rows, finals), (memory_figure, forgetting_figure) = online_runs[0], figures
    two_seeds = rows + [dict(r, seed=1) for r in rows]
    forgetting_figure_2 = plot_forgetting(two_seeds, finals, tmp_path / "two_seeds.png") and figures[-1]
    for figure in (memory_figure, forgetting_figure, forgetting_figure_2):
        _assert_titles_readable(figure)
    labels = forgetting_figure.legends[0].get_texts()
    assert {t.get_text() for t in labels} >= {"task 1", "data", "OHSGPR", "OSGPR", "OVC", "OSGPR inducing points"}
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
    assert "python -m experiments.hippo.online" in out and "±" not in out

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


def _record_figures_and_online_runs(monkeypatch):
    """The figures the demo saves and the (rows, finals) of its online part, as it makes them."""
    from matplotlib.figure import Figure

    figures, runs, savefig, run_online = [], [], Figure.savefig, demo.run_online

    def recording_savefig(figure, *args, **kwargs):
        figures.append(figure)
        return savefig(figure, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", recording_savefig)
    monkeypatch.setattr(demo, "run_online", lambda *args, **kwargs: runs.append(run_online(*args, **kwargs)) or runs[-1])
    return figures, runs


def _assert_titles_readable(figure):
    """Every title and legend lies inside the figure, and no two titles overlap."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(figure)  # the demo closed the figure
    canvas.draw()
    renderer = canvas.get_renderer()
    inside = figure.bbox
    titles = [ax.title for ax in figure.axes if ax.get_title()] + ([figure._suptitle] if figure._suptitle else [])
    boxes = [t.get_window_extent(renderer) for t in titles]
    boxes += [legend.get_window_extent(renderer) for legend in figure.legends]
    boxes += [ax.get_legend().get_window_extent(renderer) for ax in figure.axes if ax.get_legend()]
    for box in boxes:
        assert inside.x0 - 1 <= box.x0 and box.x1 <= inside.x1 + 1 and inside.y0 - 1 <= box.y0 and box.y1 <= inside.y1 + 1, box
    for i, a in enumerate(boxes[: len(titles)]):
        for b in boxes[i + 1 : len(titles)]:
            assert not a.overlaps(b), ([t.get_text() for t in titles], a, b)


def test_demo_quiet_hides_the_progress_bars(tmp_path, monkeypatch):
    progress = []

    def stop(*args, **kwargs):
        progress.append(kwargs["progress"])
        raise KeyboardInterrupt

    monkeypatch.setattr(demo, "run_online", stop)
    for argv, shown in (([], True), (["--quiet"], False)):
        with pytest.raises(KeyboardInterrupt):
            main(["--out", str(tmp_path), "--M", "8", "--quick", *argv])
        assert progress[-1] is shown
