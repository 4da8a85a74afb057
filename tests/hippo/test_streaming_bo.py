"""The streaming BO experiment: a tiny run end to end (its objective: test_data_solar.py)."""

import csv

import numpy as np
import pytest

from experiments.hippo import streaming_bo

# the OSGPR surrogate keeps its inducing points at the recent inputs, by design: it says where they do not reach
pytestmark = pytest.mark.filterwarnings("ignore::gpytorch_hippo.botorch.InducingApproximationWarning")


@pytest.mark.filterwarnings("ignore::gpytorch_hippo.inducing.CapturedVarianceWarning")  # a short run with the path memory
# BoTorch's optimize_acqf falls back to random starts where a tiny run's acquisition is zero everywhere
@pytest.mark.filterwarnings("ignore::botorch.exceptions.warnings.BadInitialCandidatesWarning")
def test_tiny_run_writes_csv_and_table(tmp_path, capsys):
    rows = streaming_bo.main(["--out", str(tmp_path), "--steps", "13", "--init", "10", "--threads", "1", "--no-progress"])
    assert {r["method"] for r in rows} == set(streaming_bo.METHODS)
    for row in rows:
        assert row["regret"] >= 0 and row["best_value"] >= row["value"] >= 0
        assert 0 <= row["tilt"] <= 90 and 90 <= row["azimuth"] <= 270
    with open(tmp_path / "streaming_bo.csv") as handle:
        written = list(csv.DictReader(handle))
    assert list(written[0]) == list(streaming_bo.COLUMNS) and len(written) == 4 * 3
    assert (tmp_path / "streaming_bo.png").exists()
    table = capsys.readouterr().out
    assert "| ohsgpr |" in table and "exact / method" in table
    summary = streaming_bo.summarise(rows, window=1)
    exact = next(s for s in summary if s["method"] == "exact")
    assert exact["exact_over_method"] == 1.0
    mine = [r for r in rows if r["method"] == "osgpr"]
    assert np.isclose(next(s for s in summary if s["method"] == "osgpr")["mean_regret"], np.mean([r["regret"] for r in mine]))


def test_bad_arguments():
    with pytest.raises(ValueError, match="steps"):
        streaming_bo.run(steps=5, init=10)
    with pytest.raises(ValueError, match="methods"):
        streaming_bo.run(steps=12, init=10, methods=("gp",))
    with pytest.raises(ValueError, match="acquisition"):
        streaming_bo.run(steps=12, init=10, acquisition="ei")


@pytest.mark.filterwarnings("ignore::gpytorch_hippo.inducing.CapturedVarianceWarning")  # few inducing variables, to be fast
@pytest.mark.parametrize("acquisition, methods", [("qkg", ("ohsgpr", "osgpr")), ("qjes", ("osgpr", "exact"))])
def test_look_ahead_and_entropy_search_steps_run_on_the_online_surrogates(acquisition, methods):
    rows = streaming_bo.run(steps=12, init=10, methods=methods, acquisition=acquisition, progress=False)
    assert len(rows) == 2 * len(methods)
    for row in rows:
        assert row["regret"] >= 0 and 0 <= row["tilt"] <= 90 and 90 <= row["azimuth"] <= 270
