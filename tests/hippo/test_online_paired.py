"""Per-seed paired summary of the online runner's CSV, against numbers computed by hand."""

import csv
import math

import pytest

from experiments.hippo import online, online_paired


def _rows():
    """Two methods, three seeds, two tasks; the values are chosen so that the sums are easy by hand."""
    rows = []
    nlpd_after_2 = {"ohsgpr": {0: (1.0, 3.0), 1: (2.0, 2.0), 2: (0.0, 4.0)}, "osgpr": {0: (2.0, 4.0), 1: (4.0, 2.0), 2: (1.0, 3.0)}}
    for method, per_seed in nlpd_after_2.items():
        for seed, (task1, task2) in per_seed.items():
            time = 1.0 if method == "ohsgpr" else 10.0 + seed
            # after task 1 (ignored: not the last task) and after task 2
            rows.append(
                dict(
                    dataset="toy",
                    method=method,
                    num_inducing=5,
                    seed=seed,
                    task_trained=1,
                    task_eval=1,
                    nlpd=99.0,
                    rmse=99.0,
                    ece="",
                    cum_time_s=0.5,
                )
            )
            for task_eval, value in ((1, task1), (2, task2)):
                rows.append(
                    dict(
                        dataset="toy",
                        method=method,
                        num_inducing=5,
                        seed=seed,
                        task_trained=2,
                        task_eval=task_eval,
                        nlpd=value,
                        rmse=value / 2,
                        ece="",
                        cum_time_s=time,
                    )
                )
    return rows


def test_per_seed_reduces_to_the_last_task():
    seeds = online_paired.per_seed(_rows())
    assert seeds["ohsgpr"][0] == pytest.approx({"nlpd": 2.0, "rmse": 1.0, "nlpd_task1": 1.0, "time": 1.0} | {"ece": math.nan}, nan_ok=True)
    assert seeds["osgpr"][2]["nlpd"] == 2.0 and seeds["osgpr"][2]["time"] == 12.0


def test_paired_differences_mean_se_and_sign_test_by_hand():
    seeds = online_paired.per_seed(_rows())
    d = online_paired.paired(seeds["ohsgpr"], seeds["osgpr"], "nlpd_task1")
    assert d["differences"] == [1.0, 2.0, 1.0]
    assert d["mean"] == pytest.approx(4 / 3)
    # sample sd of (1, 2, 1) is sqrt(1/3); s.e. = sd / sqrt(3) = 1/3
    assert d["se"] == pytest.approx(1 / 3)
    assert d["lower"] == 0
    assert d["sign_p"] == pytest.approx(2 * 0.5**3)  # all three of one sign, two-sided
    tie = online_paired.paired(seeds["ohsgpr"], seeds["osgpr"], "nlpd")  # 3-2, 3-2, 2-2: one zero dropped
    assert tie["differences"] == [1.0, 1.0, 0.0] and tie["sign_p"] == pytest.approx(2 * 0.5**2)
    with pytest.raises(ValueError, match="share no seed"):
        online_paired.paired(seeds["ohsgpr"], {7: seeds["osgpr"][0]}, "nlpd")


def test_cli_reads_the_runners_csv(tmp_path, capsys):
    path = online.write_csv(_rows(), str(tmp_path))
    text = online_paired.main([path])
    assert "| osgpr | +0.667 ± 0.333 (0/3, p=0.50) | " in text  # first column: the all-task NLPD
    assert "| ohsgpr | 3 | 2.000 ± 0.000 |" in text
    assert "ECE" not in text  # no ECE column when the runner left it empty
    assert text == capsys.readouterr().out.strip()
    with pytest.raises(ValueError, match="reference method"):
        online_paired.main([path, "--reference", "ovc"])
    empty = tmp_path / "empty.csv"
    with open(empty, "w", newline="") as handle:
        csv.writer(handle).writerow(online.COLUMNS)
    with pytest.raises(ValueError, match="no rows"):
        online_paired.main([str(empty)])
