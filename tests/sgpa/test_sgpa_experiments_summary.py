"""Summary statistics of the calibration runner (mean +- 2 s.e., thesis ch. 3) and argument checks."""

import math

import numpy as np
import pytest

from experiments.sgpa.calibration import (
    CSV_COLUMNS,
    METRIC_COLUMNS,
    format_table,
    parse_seeds,
    run,
    summarize,
)


def _row(method, seed, value):
    row = {"dataset": "d", "method": method, "seed": seed}
    row.update({column: value + i for i, column in enumerate(METRIC_COLUMNS)})
    return row


def test_csv_columns_are_the_issue_contract():
    assert ",".join(CSV_COLUMNS) == (
        "dataset,method,seed,accuracy,nll,ece,mce,auroc,aupr,train_s_per_epoch,infer_s_per_batch,"
        "selected_epoch,kl_init,kl_final,world_size,ece_all,mce_all"
    )  # the original columns, then the added ones (none renamed)


def test_summary_mean_and_two_standard_errors():
    values = [0.2, 0.5, 0.9]
    rows = [_row("a", s, v) for s, v in enumerate(values)] + [_row("b", 0, 1.0)]
    summary = summarize(rows)
    a, b = summary
    mean, two_se = a["nll"]
    assert mean == pytest.approx(np.mean(values) + 1)
    assert two_se == pytest.approx(2 * np.std(values, ddof=1) / math.sqrt(3))
    assert a["n"] == 3 and b["n"] == 1 and math.isnan(b["accuracy"][1])
    table = format_table(summary)
    assert f"{np.mean(values):.4f} ± {2 * np.std(values, ddof=1) / math.sqrt(3):.4f}" in table
    assert "| d | b | 1 | 1.0000 |" in table


def test_seed_parsing_and_bad_arguments():
    assert parse_seeds("3") == [0, 1, 2]
    assert parse_seeds("4,7") == [4, 7]
    with pytest.raises(ValueError, match="--seeds"):
        parse_seeds("x")
    with pytest.raises(ValueError, match="methods"):
        run("digits", ["mle", "sgpa"], [0], None)
    with pytest.raises(ValueError, match="dataset"):
        run("cifar10", ["sgpa"], [0], None)
