"""The captured-variance monitor (gpytorch_hippo.monitor): OnlineSGPR's warning when its inducing variables keep
too little of the prior variance, what it names and how it is paced (captured_variance itself: test_inducing_base.py)."""

import time
import warnings

import gpytorch
import pytest
import torch

from gpytorch_hippo import CapturedVarianceMonitor, HiPPOInducingVariables, InducingPoints, OnlineSGPR
from gpytorch_hippo.inducing import CapturedVarianceWarning, FourierInducingVariables, InputsOutsideSupportError

DT = torch.float64


def rbf(lengthscale):
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).to(DT)
    kernel.base_kernel.lengthscale = torch.tensor(lengthscale, dtype=DT)
    kernel.outputscale = torch.tensor(2.0, dtype=DT)
    return kernel


def test_update_warns_when_the_memory_is_too_small():
    kernel = rbf(0.5)
    x = torch.linspace(0, 30, 120, dtype=DT).unsqueeze(-1)  # t / ℓ = 60 with M = 10
    y = torch.sin(x[:, 0])
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(DT)
    model = OnlineSGPR(HiPPOInducingVariables(10, "legs", t=30.0), kernel, likelihood)
    with pytest.warns(CapturedVarianceWarning, match="keep only"):
        model.update(x, y)
    assert issubclass(CapturedVarianceWarning, RuntimeWarning)  # filters written for RuntimeWarning still apply
    quiet = OnlineSGPR(HiPPOInducingVariables(10, "legs", t=30.0), kernel, likelihood, captured_variance_warning=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        quiet.update(x, y)
    with pytest.raises(ValueError, match="captured_variance_warning"):
        OnlineSGPR(HiPPOInducingVariables(10, "legs", t=30.0), kernel, likelihood, captured_variance_warning=1.5)


def test_legs_keeps_the_ends_of_the_stream_better_than_its_middle():
    """LegS on [0, t] is a Legendre basis, whose polynomials oscillate fastest near ±1: with M below
    t/ℓ the captured fraction is U-shaped in x (measured on hourly irradiance, M = 1000, t/ℓ = 2763:
    0.90 in the first and last tenth, 0.53 in the middle). Per-point values are checked against
    the Nyström diagonal built from the dense Kuu and Kuf."""
    kernel = rbf(1.0)
    grid = torch.linspace(0, 100, 501, dtype=DT).unsqueeze(-1)  # t / ℓ = 100, M = 50
    legs = HiPPOInducingVariables(50, "legs", t=100.0)
    per_point = legs.captured_variance(kernel, grid, reduction="none")
    kuf = legs.Kuf(kernel, grid)
    nystrom = (kuf * torch.linalg.solve(legs.Kuu(kernel).to_dense(), kuf)).sum(-2)
    torch.testing.assert_close(per_point, nystrom / kernel.outputscale, rtol=1e-7, atol=1e-9)
    tenth = len(grid) // 10
    ends = torch.cat([per_point[:tenth], per_point[-tenth:]]).mean()
    middle = per_point[4 * tenth : 6 * tenth].mean()
    assert ends > middle + 0.1, (ends, middle)
    torch.testing.assert_close(legs.captured_variance(kernel, grid), per_point.mean())


def test_the_warning_names_the_worst_point_of_the_stream():
    kernel = rbf(0.5)
    x = torch.linspace(0, 30, 120, dtype=DT).unsqueeze(-1)
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(DT)
    model = OnlineSGPR(HiPPOInducingVariables(10, "legs", t=30.0), kernel, likelihood)
    with pytest.warns(CapturedVarianceWarning, match=r"at worst, at x = ") as record:
        model.update(x, torch.sin(x[:, 0]))
    worst_x = float(str(record[0].message).split("at x = ")[1].split(";")[0])
    assert 5.0 < worst_x < 25.0  # mid-stream, not at either end


def _stream(num_tasks, size=40.0, n=80, seed=0):
    generator = torch.Generator().manual_seed(seed)
    tasks = []
    for k in range(num_tasks):
        x = torch.sort(k * size + size * torch.rand(n, generator=generator, dtype=DT)).values
        tasks.append((x, torch.sin(x / 3) + 0.1 * torch.randn(n, generator=generator, dtype=DT)))
    return tasks


def _learn(model, tasks, size=40.0, advance=True):
    """Learn ``tasks``, the check over the inputs seen so far on every task (of 80 points); the warnings raised."""
    if model.captured_variance_monitor is not None and model.captured_variance_monitor.cost_fraction < 1:
        model.captured_variance_monitor = CapturedVarianceMonitor(model.captured_variance_warning, cost_fraction=1.0, spacing=0.0)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always", CapturedVarianceWarning)
        for k, (x, y) in enumerate(tasks):
            if k > 0 and advance:
                model.inducing_variables.advance(size * (k + 1))
            model.update(x, y)
    return [str(w.message) for w in record if issubclass(w.category, CapturedVarianceWarning)]


def _level(message):
    return float(message.split("keep only ")[1].split("%")[0]) / 100


def test_too_few_variables_warn_with_the_legs_rule_and_again_when_it_halves():
    """8 LegS variables over a stream growing to t / ℓ = 200: the first warning, then one more each time
    the captured fraction falls below half its last warned level (it warned once, at 74 %, and stayed
    silent at 1 % before), never for a stable level; the latest value is readable."""
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(DT)
    model = OnlineSGPR(HiPPOInducingVariables(8, "legs", t=40.0), rbf(1.0), likelihood)
    messages = _learn(model, _stream(5))  # t / ℓ = 200 with M = 8
    assert len(messages) >= 2 and all("keep only" in m and "M of about t / lengthscale" in m for m in messages)
    levels = [_level(m) for m in messages]
    assert levels[0] < 0.9 and all(later < earlier / 2 for earlier, later in zip(levels, levels[1:]))
    assert model.last_captured_variance <= levels[-1] + 1e-3 and model.last_captured_variance > levels[-1] / 2 - 1e-3
    assert _learn(model, []) == []  # nothing new: no warning


def test_inputs_beyond_t_raise_naming_the_missed_advance_not_more_variables():
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(DT)
    model = OnlineSGPR(HiPPOInducingVariables(40, "legs", t=40.0), rbf(10.0), likelihood)
    with pytest.raises(InputsOutsideSupportError, match=r"advance\(t_new\)") as error:
        _learn(model, _stream(3), advance=False)
    assert "more inducing variables" not in str(error.value)
    assert model.num_tasks.item() == 1  # the refused task left the model as it was


def test_a_sliding_window_that_forgets_by_design_does_not_warn():
    """LegT keeps the last ``theta`` of the stream; the check looks only there (it warned on almost
    every task when it looked at the whole stream)."""
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(DT)
    model = OnlineSGPR(HiPPOInducingVariables(40, "legt", t=40.0, theta=40.0), rbf(10.0), likelihood)
    assert _learn(model, _stream(6)) == []


def test_advice_matches_the_kind_of_inducing_variables():
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(DT)
    points = OnlineSGPR(InducingPoints(torch.linspace(0, 40, 3, dtype=DT), learn=False), rbf(1.0), likelihood)
    messages = _learn(points, _stream(2), advance=False)
    # task 2, beyond the points, warns again at its own inputs
    assert len(messages) == 2 and all("pivoted Cholesky" in m and "HiPPO" not in m for m in messages)
    matern = gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=1.5)).to(DT)
    fourier = OnlineSGPR(FourierInducingVariables(3, 0.0, 80.0), matern, likelihood)
    messages = _learn(fourier, _stream(2), advance=False)
    assert len(messages) == 1 and "num_frequencies" in messages[0] and "HiPPO" not in messages[0]


@pytest.mark.parametrize("measure", ["legs", "legt"])
def test_the_check_reuses_the_update_factorisation(measure, monkeypatch):
    """The check adds one ``Kuf`` on a 32-point grid and no ``Kuu``: its cost does not grow with the
    stream beyond that of ``Kuf`` (timings: ``benchmarks/captured_variance_cost.py``)."""
    calls = {"Kuu": 0, "Kuf": []}
    kuu, kuf = HiPPOInducingVariables.Kuu, HiPPOInducingVariables.Kuf

    def counting_kuu(self, kernel):
        calls["Kuu"] += 1
        return kuu(self, kernel)

    def counting_kuf(self, kernel, x):
        calls["Kuf"].append(x.shape[-2])
        return kuf(self, kernel, x)

    monkeypatch.setattr(HiPPOInducingVariables, "Kuu", counting_kuu)
    monkeypatch.setattr(HiPPOInducingVariables, "Kuf", counting_kuf)
    counts = {}
    for threshold in (None, 0.9):
        calls["Kuu"], calls["Kuf"] = 0, []
        model = OnlineSGPR(
            HiPPOInducingVariables(20, measure, t=40.0, theta=40.0),
            rbf(10.0),
            gpytorch.likelihoods.GaussianLikelihood().to(DT),
            captured_variance_warning=threshold,
        )
        _learn(model, _stream(3))
        counts[threshold] = (calls["Kuu"], list(calls["Kuf"]))
    assert counts[0.9][0] == counts[None][0]
    assert sorted(counts[0.9][1]) == sorted(counts[None][1] + [32] * 3)


def _grid_checks(model, tasks, monkeypatch, clock_step):
    """The tasks (1-based) on which ``model`` checks the inputs seen so far, and ``last_captured_variance`` after each,
    with ``time.perf_counter`` advancing ``clock_step`` seconds per call (a loaded machine: large steps)."""
    now, task, checks, values = [0.0], [0], [], []
    kuf = HiPPOInducingVariables.Kuf

    def counting_kuf(self, kernel, x):
        if x.shape[-2] == model.captured_variance_monitor.grid_size:
            checks.append(task[0])
        return kuf(self, kernel, x)

    def clock():
        now[0] += clock_step
        return now[0]

    monkeypatch.setattr(time, "perf_counter", clock)
    monkeypatch.setattr(HiPPOInducingVariables, "Kuf", counting_kuf)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always", CapturedVarianceWarning)
        for k, (x, y) in enumerate(tasks):
            task[0] = k + 1
            if k > 0:
                model.inducing_variables.advance(40.0 * (k + 1))
            model.update(x, y)
            values.append(model.last_captured_variance)
    monkeypatch.undo()
    return checks, values, [str(w.message) for w in record]


def test_the_check_is_paced_by_counts_so_the_same_data_give_the_same_warnings_on_any_machine(monkeypatch):
    """Tasks of N = 10 points, M = 20: the check over the inputs seen so far runs on task 1 and then whenever
    sum(N + M) since its last run reaches 32 / 0.05 = 640 and the work before it, i.e. on tasks 1 and 23 of 40,
    whatever the clock reads; the clock used to decide (tasks 1 and 31 on a clock where an update took 2 s and the
    check 3 s, other tasks on a busier clock)."""
    runs = []
    for clock_step in (1e-6, 1.0, 1000.0):
        model = OnlineSGPR(HiPPOInducingVariables(20, "legs", t=40.0), rbf(30.0), gpytorch.likelihoods.GaussianLikelihood().to(DT))
        runs.append(_grid_checks(model, _stream(40, n=10), monkeypatch, clock_step))
    assert runs[0][0] == [1, 23]
    assert runs[0] == runs[1] == runs[2]


def test_points_that_do_not_reach_the_data_warn_on_the_first_task_beyond_them():
    """Points fixed over [0, 10], a stream moving on past them: the posterior at the new inputs is the prior
    (mean 1e-86, variance 1). The task's own inputs are checked on every task, from the update's own factor:
    task 2 warns, with the fraction that ``InducingPoints.captured_variance`` gives at its inputs."""
    kernel = rbf(1.0)
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(DT)
    points = InducingPoints(torch.linspace(0, 10, 20, dtype=DT), learn=False)
    model = OnlineSGPR(points, kernel, likelihood)
    x1, x2 = torch.linspace(0, 10, 100, dtype=DT), torch.linspace(10, 20, 100, dtype=DT)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CapturedVarianceWarning)
        model.update(x1, torch.sin(x1))
    with pytest.warns(CapturedVarianceWarning, match="over this task's inputs") as record:
        model.update(x2, torch.sin(x2))
    expected = points.captured_variance(kernel, x2.unsqueeze(-1)).item()
    assert expected < 0.2
    assert model.last_captured_variance == pytest.approx(expected, rel=1e-9)
    assert f"keep only {expected:.1%}" in str(record[0].message)
