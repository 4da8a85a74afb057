"""The online runner (experiments.online): CSV schema, bookkeeping, metrics against scipy, task splits."""

import csv
import math
from contextlib import nullcontext

import numpy as np
import pytest
import scipy.stats
import torch

from experiments.hippo import online
from gpytorch_hippo.baselines import learn_task
from gpytorch_hippo.data import Dataset, load_dataset, split_tasks
from gpytorch_hippo.inducing import HiPPOInducingVariables, InconsistentCovarianceWarning
from gpytorch_hippo.online import OnlineSGPR


def test_quick_run_writes_the_schema_and_evaluates_every_seen_task(tmp_path, capsys):
    rows = online.main(["--quick", "--quiet", "--methods", "ohsgpr,osgpr", "--num-inducing", "12", "--out", str(tmp_path)])
    with open(tmp_path / "results.csv") as handle:
        reader = csv.reader(handle)
        assert tuple(next(reader)) == online.COLUMNS
        written = list(reader)
    assert len(written) == len(rows) == 2 * (1 + 2 + 3)  # after task k: tasks 1..k
    for method in ("ohsgpr", "osgpr"):
        mine = [r for r in rows if r["method"] == method]
        assert [(r["task_trained"], r["task_eval"]) for r in mine] == [(1, 1), (2, 1), (2, 2), (3, 1), (3, 2), (3, 3)]
        times = [r["cum_time_s"] for r in mine]
        assert times == sorted(times) and times[0] > 0
        assert all(r["ece"] == "" and np.isfinite(r["nlpd"]) for r in mine)
    assert (tmp_path / "online_nlpd_rmse.png").stat().st_size > 10_000
    assert (tmp_path / "online_final_fit.png").stat().st_size > 10_000
    assert "ohsgpr" in capsys.readouterr().out


@pytest.mark.filterwarnings("ignore::gpytorch_hippo.inducing.CapturedVarianceWarning")  # 10 fixed points over a year, to be fast
def test_metrics_of_a_row_match_scipy_on_an_independently_driven_model():
    rows, _, _ = online.run_method("irradiance", "osgpr-fixed", 10, seed=2, num_tasks=3, first_iters=3)
    # drive the same model by hand with the public pieces and score it with scipy
    data = load_dataset("irradiance")
    tasks = split_tasks(data, 3, seed=2)
    kernel = online.make_kernel("osgpr-fixed", 364.0)
    generator = torch.Generator().manual_seed(2)
    torch.manual_seed(2)
    likelihood = online.fit_exact_hyperparameters(kernel, tasks[0].train_x, tasks[0].train_y, 3, 0.05)
    schedule = online.make_schedule("osgpr-fixed", 10, data.x, 3, 0)
    model = OnlineSGPR(schedule.first(tasks[0].train_x, tasks[0].t_end, kernel, generator).double(), kernel, likelihood)
    model.update(tasks[0].train_x, tasks[0].train_y)
    for task in tasks[1:]:
        learn_task(model, schedule, task.train_x, task.train_y, task.t_end, generator)
    model.eval()
    with torch.no_grad():
        predictive = model.likelihood(model(tasks[0].test_x))
    mean, sd, y = predictive.mean.numpy(), predictive.variance.sqrt().numpy(), tasks[0].test_y.numpy()
    row = [r for r in rows if r["task_trained"] == 3 and r["task_eval"] == 1][0]
    assert row["nlpd"] == pytest.approx(-scipy.stats.norm.logpdf(y, mean, sd).mean(), rel=1e-9)
    assert row["rmse"] == pytest.approx(np.sqrt(((y - mean) ** 2).mean()), rel=1e-9)


def test_split_tasks_partitions_by_the_key_with_a_test_set_per_task():
    x = torch.arange(100, dtype=torch.float64).unsqueeze(-1)
    data = Dataset("toy", x, torch.randn(100, dtype=torch.float64))
    tasks = split_tasks(data, 4, seed=0, test_fraction=0.2)
    seen = torch.cat([torch.cat([t.train_x, t.test_x]) for t in tasks])[:, 0]
    assert sorted(seen.tolist()) == list(range(100))
    for k, task in enumerate(tasks):
        assert len(task.test_y) == 5 and len(task.train_y) == 20
        inputs = torch.cat([task.train_x, task.test_x])[:, 0]
        assert inputs.min() >= 25 * k and inputs.max() <= task.t_end
    assert [t.t_end for t in tasks] == [24.5, 49.5, 74.5, 99.0]
    # multidimensional: tasks ordered by the L2 norm of the inputs
    points = torch.randn(60, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    l2_tasks = split_tasks(Dataset("toy3", points, points[:, 0]), 3, seed=0, split="l2")
    norms = [torch.cat([t.train_x, t.test_x]).norm(dim=-1) for t in l2_tasks]
    assert norms[0].max() <= norms[1].min() and norms[1].max() <= norms[2].min()
    with pytest.raises(ValueError, match="split"):
        split_tasks(data, 4, seed=0, split="random")
    with pytest.raises(ValueError, match="num_tasks"):
        split_tasks(data, 0, seed=0)


def test_bad_arguments_are_refused_by_name(tmp_path):
    with pytest.raises(SystemExit):
        online.main(["--methods", "ohsgpr,nope", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="does not apply to diabetes"):
        online.run_method("diabetes", "ohsgpr", 10, seed=0)
    with pytest.raises(ValueError, match="method must be one of"):
        online.make_schedule("svgp", 10, torch.zeros(5, 1), 2, 0)


def test_train_kernel_keeps_training_and_measures_are_selectable():
    _, fixed, _ = online.run_method("irradiance", "ohsgpr", 8, seed=0, num_tasks=2, first_iters=2)
    _, trained, _ = online.run_method("irradiance", "ohsgpr", 8, seed=0, num_tasks=2, first_iters=2, train_kernel=True)
    # same task-1 fit; only --train-kernel moves the length scale during task 2 (App. C.4.1)
    assert not fixed.covar_module.base_kernel.raw_lengthscale.requires_grad
    assert trained.covar_module.base_kernel.lengthscale.item() != pytest.approx(fixed.covar_module.base_kernel.lengthscale.item(), rel=1e-6)
    rows, legt, _ = online.run_method("irradiance", "ohsgpr", 8, seed=0, num_tasks=2, first_iters=2, measure="legt")
    assert legt.inducing_variables.measure == "legt" and all(np.isfinite(r["nlpd"]) for r in rows)


def test_ohsgpr_backends_agree_and_the_default_is_the_fastest_exact_one(tmp_path):
    # The runner's ohsgpr uses the Lyapunov backend for LegS (constant cost per task) and `auto`
    # for the other measures; every exact backend must give the same predictions (the spectral
    # backend is the reference; 1e-9 on NLPD leaves room for round-off only, a wrong carried Kuu
    # or a skipped advance moves it by far more).
    rows = {}
    for backend in ("spectral", None):
        rows[backend], model, _ = online.run_method("irradiance", "ohsgpr", 30, seed=0, num_tasks=4, first_iters=2, hippo_backend=backend)
        assert model.inducing_variables.method == (backend or "lyapunov")
    assert len(rows[None]) == len(rows["spectral"]) == 10
    for fast, reference in zip(rows[None], rows["spectral"]):
        assert (fast["task_trained"], fast["task_eval"]) == (reference["task_trained"], reference["task_eval"])
        assert fast["nlpd"] == pytest.approx(reference["nlpd"], abs=1e-9)
    legt = online.make_schedule("ohsgpr", 8, torch.arange(10.0), 2, 0, measure="legt")
    assert legt.options["method"] == "auto"
    with pytest.raises(ValueError, match="hippo_backend 'lyapunov' needs measure 'legs'"):
        online.make_schedule("ohsgpr", 8, torch.arange(10.0), 2, 0, measure="legt", hippo_backend="lyapunov")
    with pytest.raises(ValueError, match="hippo_backend must be one of"):
        online.make_schedule("ohsgpr", 8, torch.arange(10.0), 2, 0, hippo_backend="banded")
    with pytest.raises(SystemExit):
        online.main(["--methods", "ohsgpr", "--measure", "legt", "--hippo-backend", "lyapunov", "--out", str(tmp_path)])


def test_the_thesis_pairing_takes_kfu_from_the_ode_and_kuu_from_the_features():
    """``ohsgpr-ode-rff`` is the thesis's construction (§4.3.2): ``Kfu`` from the HiPPO ODE driven by the exact
    kernel (second order in the step, so the exact spectral ``Kfu`` to ~1e-6 here), ``Kuu`` from the 1000
    random features, the very ``Kuu`` of ``ohsgpr-rff``, whose ``Kfu`` comes from those features instead.
    The two disagree: already here the Nyström residual goes negative, and the evaluation says so."""
    models = {}
    for method, warns in (("ohsgpr-ode-rff", pytest.warns(InconsistentCovarianceWarning)), ("ohsgpr-rff", nullcontext())):
        with warns:
            rows, models[method], data = online.run_method("irradiance", method, 8, seed=0, num_tasks=2, first_iters=2)
        assert len(rows) == 3 and all(np.isfinite(r["nlpd"]) and np.isfinite(r["rmse"]) for r in rows)
    thesis, rff = models["ohsgpr-ode-rff"], models["ohsgpr-rff"]
    kernel, ivars = thesis.covar_module, thesis.inducing_variables
    assert (ivars.method, ivars.kuf, ivars.num_rff) == ("recurrence", "ode", 1000)
    x = data.x[data.x[:, 0] <= ivars.t][::7]
    with torch.no_grad():
        exact = HiPPOInducingVariables(8, "legs", t=ivars.t, start=float(data.x.min()), method="spectral").Kuf(kernel, x)
        ode, features = ivars.Kuf(kernel, x), rff.inducing_variables.Kuf(kernel, x)
        scale = exact.abs().max()
        assert (ode - exact).abs().max() < 1e-4 * scale
        assert (features - exact).abs().max() > 100 * (ode - exact).abs().max()  # the Monte-Carlo Kfu is not the ODE's
        torch.testing.assert_close(ivars.Kuu(kernel).to_dense(), rff.inducing_variables.Kuu(kernel).to_dense(), rtol=1e-12, atol=0)


def test_an_interrupted_run_keeps_the_rows_of_the_methods_it_finished(tmp_path, monkeypatch):
    calls = []
    real = online.run_method

    def fails_on_the_second_method(dataset, method, *args, **kwargs):
        calls.append(method)
        if len(calls) == 2:
            raise KeyboardInterrupt  # e.g. the run was stopped
        return real(dataset, method, *args, **kwargs)

    monkeypatch.setattr(online, "run_method", fails_on_the_second_method)
    with pytest.raises(KeyboardInterrupt):
        online.main(["--quick", "--quiet", "--methods", "osgpr-fixed,ovc", "--num-inducing", "6", "--out", str(tmp_path)])
    with open(tmp_path / "results.csv") as handle:
        written = list(csv.DictReader(handle))
    assert [r["method"] for r in written] == ["osgpr-fixed"] * (1 + 2 + 3)


@pytest.mark.parametrize("method", ["ohsgpr", "ovff"])
def test_float32_runs_agree_with_float64(method):
    """``--dtype float32``: the same rows as float64 within float32 round-off (sunspots, M = 50, 10 tasks:
    |ΔNLPD| <= 2e-4, |ΔRMSE| <= 6e-5 for OHSGPR; here irradiance, 4 tasks)."""
    rows = {
        dtype: online.run_method("irradiance", method, 30, seed=0, num_tasks=4, first_iters=2, dtype=dtype)[0]
        for dtype in (torch.float64, torch.float32)
    }
    for row64, row32 in zip(rows[torch.float64], rows[torch.float32]):
        assert abs(row64["nlpd"] - row32["nlpd"]) < 1e-3 and abs(row64["rmse"] - row32["rmse"]) < 1e-4


def test_the_hourly_irradiance_runner_runs_at_m_1000_on_a_short_stream(tmp_path, monkeypatch):
    """The runner at the results page's largest hourly setting, M = 1,000, on a short stream: every fourth
    hour of the year in 3 tasks (the full year takes minutes). Training, the per-task metrics and the
    figures' predictions over the whole year run within the cost guard (the prediction used to stop in
    the guard's advice with an AttributeError)."""
    full = load_dataset("irradiance-hourly")
    monkeypatch.setattr(online, "load_dataset", lambda name: Dataset(name, full.x[::4], full.y[::4]))
    rows = online.main(
        [
            "--dataset",
            "irradiance-hourly",
            "--methods",
            "ohsgpr,ovc",
            "--num-inducing",
            "1000",
            "--quick",
            "--quiet",
            "--threads",
            "1",
            "--out",
            str(tmp_path),
        ]
    )
    assert {row["method"] for row in rows} == {"ohsgpr", "ovc"}
    assert all(math.isfinite(row["nlpd"]) for row in rows)
    assert (tmp_path / "online_final_fit.png").exists()


@pytest.mark.parametrize("given, expected", [(None, 0.01), (0.003, 0.003)])
def test_the_elbo_methods_take_the_given_learning_rate_and_default_to_theirs(monkeypatch, given, expected):
    """``run_method(..., lr=...)`` (and ``--lr``) reaches the ELBO methods; without it they keep their 0.01."""
    seen = {}

    def fake_elbo_method(*args, **kwargs):
        seen.update(kwargs)
        return [], None, None

    monkeypatch.setattr(online, "run_elbo_method", fake_elbo_method)
    online.run_method("concrete", "ohsvgp", 8, seed=0, num_tasks=2, lr=given)
    assert seen["lr"] == expected
