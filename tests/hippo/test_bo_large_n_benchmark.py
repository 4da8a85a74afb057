"""``benchmarks/bo_large_n.py``: its smallest setting runs every loop with every model, writes their rows, and the
summary of the saved CSV prints the side-by-side tables."""

from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def bo_large_n(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return pytest.importorskip("bo_large_n")


def test_the_smoke_setting_gives_every_arm_its_rows_and_the_summary_prints(bo_large_n, tmp_path, capsys):
    out = tmp_path / "smoke.csv"
    rows = bo_large_n.main(["--smoke", "--out", str(out)])
    arms = {(row["loop"], row["model"]) for row in rows}
    assert arms == {(loop, model) for loop in bo_large_n.LOOPS for model in bo_large_n.MODELS}
    for loop, model in arms:
        arm = [row for row in rows if (row["loop"], row["model"]) == (loop, model)]
        assert [row["n"] for row in arm] == list(range(8, 25, 4))  # the 2 d = 8 initial points, then batches of 4
        bests = [row["best"] for row in arm]
        assert bests == sorted(bests) and all(row["fit_s"] >= 0 and row["acq_s"] >= 0 for row in arm)
        assert all(row["peak_mb"] > 0 for row in arm)
    capsys.readouterr()
    text = bo_large_n.main(["--summarise", str(out)])
    assert text in capsys.readouterr().out
    for loop in bo_large_n.LOOPS:
        assert f"### ackley4, {loop}" in text
    assert "SingleTaskGP / online stream" in text and "peak memory MB" in text
    assert len(bo_large_n.read_rows([out])) == len(rows)


def test_the_initial_design_is_the_same_for_every_model_of_a_seed(bo_large_n):
    settings = bo_large_n.replace(bo_large_n.Settings(**bo_large_n.SMOKE), max_n=8)
    first = [bo_large_n.run(bo_large_n.replace(settings, model=model))[0]["best"] for model in bo_large_n.MODELS]
    assert first[0] == first[1] == first[2]


def test_an_unknown_function_names_the_known_ones(bo_large_n):
    with pytest.raises(ValueError, match="ackley<d>"):
        bo_large_n.objective("branin")


def test_a_single_task_gp_probe_times_one_iteration_on_the_streams_data_and_leaves_the_stream_unchanged(bo_large_n):
    """--stgp-probe-at times one SingleTaskGP iteration (fit and acquisition) on the stream's data where its own arm
    stopped at the time budget: in the row whose batch crossed the n asked for, and without changing what the stream
    does (its random state and Sobol engine are restored), so its times stand side by side in one run."""
    settings = bo_large_n.replace(bo_large_n.Settings(**bo_large_n.SMOKE), model="stream")
    plain = bo_large_n.run(settings)
    probed = bo_large_n.run(bo_large_n.replace(settings, stgp_probe_at="14,20"))
    assert [row["best"] for row in probed] == [row["best"] for row in plain]
    assert [row["tr_length"] for row in probed] == [row["tr_length"] for row in plain]
    with_probe = [row["n"] for row in probed if row["stgp_probe_fit_s"] == row["stgp_probe_fit_s"]]  # not NaN
    assert with_probe == [16, 20]
    text = bo_large_n.summarise(probed + bo_large_n.run(bo_large_n.replace(settings, model="stgp")), checkpoints=(16, 24))
    assert "One SingleTaskGP iteration timed on the stream's data" in text and "n = 20:" in text
