"""The continual SVGPVAE runner on the weather data (CSV schema, held-out split, plots). Uses the
pvlib TMY3 source, always installed."""

import csv

import pytest
import torch

from experiments.hippo import gpvae as runner
from gpytorch_hippo.data.weather import standardise

DT = torch.float64


def test_make_tasks_partitions_the_observed_entries():
    generator = torch.Generator().manual_seed(0)
    values = torch.randn(100, 4, generator=generator, dtype=DT)
    values[5:9, 2] = float("nan")
    tasks = runner.make_tasks(values, num_tasks=4, task_hours=20, test_fraction=0.25, generator=torch.Generator().manual_seed(1))
    assert len(tasks) == 4
    z = standardise(values[:80])
    for k, (times, observed, test) in enumerate(tasks):
        assert torch.allclose(times, torch.arange(20 * k, 20 * (k + 1), dtype=DT) / 24)
        both = ~torch.isnan(observed) & ~torch.isnan(test)
        assert not both.any()  # an entry is for training or for testing, never both
        merged = torch.where(torch.isnan(observed), test, observed)
        expected = z[20 * k : 20 * (k + 1)]
        assert torch.equal(torch.isnan(merged), torch.isnan(expected))
        assert torch.equal(merged[~torch.isnan(merged)], expected[~torch.isnan(expected)])
    held_out = sum((~torch.isnan(t)).sum() for _, _, t in tasks).item()
    assert 0.15 * 316 < held_out < 0.35 * 316  # 316 finite entries, 25% held out
    with pytest.raises(ValueError, match="exceeds"):
        runner.make_tasks(values, num_tasks=6, task_hours=20, test_fraction=0.1, generator=generator)


def test_runner_writes_the_online_csv_schema_and_plots(tmp_path, capsys):
    runner.main(
        [
            "--dataset",
            "weather",
            "--source",
            "tmy3",
            "--methods",
            "ohsvgp,ovc",
            "--num-inducing",
            "4",
            "--seeds",
            "1",
            "--num-tasks",
            "3",
            "--task-hours",
            "12",
            "--num-iter",
            "2",
            "--latent-dim",
            "2",
            "--hidden-dim",
            "4",
            "--num-samples",
            "5",
            "--out",
            str(tmp_path),
            "--quiet",
        ]
    )
    with open(tmp_path / "gpvae.csv") as handle:
        reader = csv.DictReader(handle)
        assert tuple(reader.fieldnames) == (
            "dataset",
            "method",
            "num_inducing",
            "seed",
            "task_trained",
            "task_eval",
            "nlpd",
            "rmse",
            "ece",
            "cum_time_s",
        )
        rows = list(reader)
    assert len(rows) == 2 * (1 + 2 + 3)
    for method in ("ohsvgp", "ovc"):
        mine = [r for r in rows if r["method"] == method]
        assert {(int(r["task_trained"]), int(r["task_eval"])) for r in mine} == {(k, i) for k in (1, 2, 3) for i in range(1, k + 1)}
        times = [float(r["cum_time_s"]) for r in mine]
        assert times == sorted(times) and times[0] > 0
        assert all(r["dataset"] == "weather" and r["num_inducing"] == "4" for r in mine)
    assert all(0 <= float(r["ece"]) <= 0.5 and float(r["rmse"]) > 0 for r in rows)
    for metric in ("nlpd", "rmse"):
        assert (tmp_path / f"gpvae_{metric}_M4.png").stat().st_size > 0
    assert "ohsvgp" in capsys.readouterr().out


def test_parse_args_quick_and_bad_flags():
    args = runner.parse_args(["--quick", "--num-inducing", "30"])
    assert (args.num_tasks, args.task_hours, args.num_inducing) == (3, 48, [10])
    with pytest.raises(SystemExit):
        runner.parse_args(["--methods", "ohsvgp,svgp"])
    with pytest.raises(SystemExit):
        runner.parse_args(["--test-fraction", "1.5"])
    with pytest.raises(SystemExit):
        runner.parse_args(["--dataset", "era5"])
