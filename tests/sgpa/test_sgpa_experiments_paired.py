"""Paired per-seed comparison: differences, sign test and paired t against hand computations."""

import csv
import math

import pytest

from experiments.sgpa.paired import main, paired_differences, sign_test


def test_sign_test_is_the_exact_binomial_tail():
    assert sign_test([0.1, 0.2, 0.3]) == pytest.approx(2 * 0.5**3)  # 3/3: p = 0.25 two-sided
    assert sign_test([0.1, -0.2, 0.3]) == pytest.approx(1.0)
    assert sign_test([1.0] * 5) == pytest.approx(2 / 32)
    assert sign_test([0.0, 0.0]) == 1.0
    assert math.isnan(sign_test([math.nan, 0.1]))  # undefined (was p = 1 or 0.5 with NaN counted as "not >")


def test_paired_differences_and_cli(tmp_path, capsys):
    a = [{"seed": s, "method": "x", "nll": v} for s, v in enumerate([1.0, 2.0, 3.0])]
    b = [{"seed": s, "method": "y", "nll": v} for s, v in enumerate([1.5, 2.1, 3.4])]
    (result,) = paired_differences(a, b, ["nll"])
    diffs = [0.5, 0.1, 0.4]
    assert result["differences"] == pytest.approx(diffs)
    mean = sum(diffs) / 3
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 2)
    t = mean / (sd / math.sqrt(3))
    # two-sided p of Student's t with 2 degrees of freedom: 1 - t / sqrt(t² + 2)
    assert result["t_p"] == pytest.approx(1 - t / math.sqrt(t * t + 2), rel=1e-6)
    assert result["sign_p"] == pytest.approx(0.25)
    path = tmp_path / "r.csv"
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["seed", "method", "nll"])
        writer.writeheader()
        writer.writerows(a + b)
    main([f"{path}:x", f"{path}:y", "--metrics", "nll"])
    assert "| nll | +0.5000, +0.1000, +0.4000 | +0.3333 | 3/3 |" in capsys.readouterr().out
    with pytest.raises(ValueError, match="no rows"):
        main([f"{path}:x", f"{path}:z"])
    with pytest.raises(ValueError, match="share no seed"):
        paired_differences(a, [{"seed": 9, "nll": 1.0}], ["nll"])
