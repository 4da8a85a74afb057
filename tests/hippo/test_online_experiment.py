"""The online time-series runner: metrics against scipy, task bookkeeping, CSV columns."""
import csv

import numpy as np
import scipy.stats
import torch

from gpytorch_hippo.experiments import online_time_series as experiment


def test_split_is_chronological_and_complete():
    times = torch.arange(100, dtype=torch.float64)
    chunks, ends, test = experiment.split_tasks(times, times, 4, 0.2, torch.Generator().manual_seed(0))
    train = torch.cat(chunks)
    assert sorted(torch.cat([train, test]).tolist()) == list(range(100))
    assert all(times[a[-1]] < end < times[b[0]] for a, b, end in zip(chunks[:-1], chunks[1:], ends))
    assert ends[-1] == 99.0


def test_rows_match_scipy_metrics_and_csv_has_the_columns(tmp_path):
    rows = experiment.run(methods=["osgpr"], seeds=[0], num_tasks=2, num_inducing=10, first_iters=2, progress=False)
    assert [r["task"] for r in rows] == [1, 2]
    # recompute the last row's NLPD and RMSE independently from the model's predictive moments
    times, ghi = experiment.load_solar_ghi("daily")
    y = (ghi - ghi.mean()) / ghi.std()
    generator = torch.Generator().manual_seed(0)
    chunks, ends, test = experiment.split_tasks(times, y, 2, 0.2, generator)
    model = experiment.make_model("osgpr", 10, ends[0], times[chunks[0]], generator)
    model.update(times[chunks[0]], y[chunks[0]], num_iter=2, lr=0.05)
    experiment.next_inducing(model, "osgpr", ends[1], times[chunks[1]], generator)
    model.update(times[chunks[1]], y[chunks[1]])
    model.eval()
    with torch.no_grad():
        predictive = model.likelihood(model(times[test]))
    mean, sd = predictive.mean.numpy(), predictive.variance.sqrt().numpy()
    nlpd = -scipy.stats.norm.logpdf(y[test].numpy(), mean, sd).mean()
    rmse = np.sqrt(((y[test].numpy() - mean) ** 2).mean())
    assert abs(rows[-1]["nlpd"] - nlpd) < 1e-8 and abs(rows[-1]["rmse"] - rmse) < 1e-8
    experiment.write_outputs(rows, str(tmp_path))
    with open(tmp_path / "results.csv") as handle:
        header = next(csv.reader(handle))
    assert tuple(header) == experiment.COLUMNS
    assert (tmp_path / "online_regression.png").exists()
