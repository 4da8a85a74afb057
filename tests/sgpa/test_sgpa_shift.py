"""``--shift`` of the calibration runner on the seconds-sized digits task."""

import csv
from dataclasses import replace

import pytest
import torch

from experiments.sgpa import calibration
from experiments.sgpa.calibration import QUICK_CONFIG, SHIFT_COLUMNS, _Runner, load_task, main
from gpytorch_sgpa.data import CORRUPTIONS, SEVERITIES, corrupt


def test_shift_csv_rows_and_an_independent_recomputation(tmp_path):
    main(
        [
            "--dataset",
            "digits",
            "--quick",
            "--methods",
            "mle-kernel,sgpa",
            "--seeds",
            "1",
            "--shift",  # one seed: 0
            "--test-size",
            "48",
            "--val-size",
            "32",
            "--train-size",
            "128",
            "--no-progress",
            "--out",
            str(tmp_path),
        ]
    )
    with open(tmp_path / "shift.csv") as handle:
        reader = csv.DictReader(handle)
        assert tuple(reader.fieldnames) == SHIFT_COLUMNS
        rows = list(reader)
    keys = {(r["method"], r["seed"], r["corruption"], r["severity"]) for r in rows}
    expected = {
        (m, str(seed), c, str(s))
        for m in ("mle-kernel", "sgpa")
        for seed in (0,)
        for c, s in [("none", 0)] + [(c, s) for c in CORRUPTIONS for s in SEVERITIES]
    }
    assert keys == expected and len(rows) == len(expected)
    assert (tmp_path / "shift.png").stat().st_size > 0
    with open(tmp_path / "results.csv") as handle:
        clean = {(r["method"], r["seed"]): r for r in csv.DictReader(handle)}
    for row in rows:
        if row["corruption"] == "none":
            assert row["ece"] == clean[(row["method"], row["seed"])]["ece"]
    # the deterministic MLE network's accuracy on one corrupted set, recomputed here from scratch
    config = replace(QUICK_CONFIG, shift=True, test_size=48, val_size=32, train_size=128)
    runner = _Runner(load_task("digits", config, seed=0), config, progress=False, seed=0)
    model, _ = runner.network("mle-kernel", 0, 0)
    images = corrupt(runner.task.test.features, "rotation", 4, seed=0)
    with torch.no_grad():
        accuracy = float((model.eval()(images)[0].argmax(-1) == runner.task.test.labels).double().mean())
    (row,) = [r for r in rows if (r["method"], r["seed"], r["corruption"], r["severity"]) == ("mle-kernel", "0", "rotation", "4")]
    assert abs(float(row["accuracy"]) - accuracy) < 1e-6


def test_shift_needs_an_image_dataset():
    with pytest.raises(ValueError, match="image dataset"):
        calibration.run("vader", ["mle-kernel"], [0], replace(QUICK_CONFIG, shift=True))
