"""captured_variance on every inducing-variable class, and OnlineSGPR's warning when it is low."""

import warnings

import gpytorch
import pytest
import torch

from gpytorch_hippo import HiPPOInducingVariables, InducingPoints, OnlineSGPR, online
from gpytorch_hippo.inducing import CapturedVarianceWarning, FourierInducingVariables, InputsOutsideSupportError

DT = torch.float64


def rbf(lengthscale):
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).to(DT)
    kernel.base_kernel.lengthscale = torch.tensor(lengthscale, dtype=DT)
    kernel.outputscale = torch.tensor(2.0, dtype=DT)
    return kernel


def test_points_equal_the_variance_explained_by_a_gpytorch_exact_gp():
    """Point inducing variables with jitter σ_j² are noisy observations f(Z) + N(0, σ_j²): the captured
    fraction is 1 - posterior/prior variance of GPyTorch's exact GP conditioned on them."""
    kernel = rbf(0.2)
    z = torch.linspace(0, 1, 7, dtype=DT).unsqueeze(-1)
    grid = torch.linspace(0, 1.5, 40, dtype=DT).unsqueeze(-1)
    jitter = 1e-3

    class Exact(gpytorch.models.ExactGP):
        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(torch.zeros_like(x[:, 0]), kernel(x))

    likelihood = gpytorch.likelihoods.GaussianLikelihood(noise_constraint=gpytorch.constraints.GreaterThan(1e-8)).to(DT)
    likelihood.noise = torch.tensor(jitter, dtype=DT)
    exact = Exact(z, torch.zeros(7, dtype=DT), likelihood).eval()
    with torch.no_grad():
        posterior_var = exact(grid).variance
    expected = 1 - posterior_var / kernel(grid, diag=True)
    points = InducingPoints(z, jitter=jitter)
    torch.testing.assert_close(points.captured_variance(kernel, grid), expected.mean(), rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(points.captured_variance(kernel, grid, reduction="none"), expected, rtol=1e-8, atol=1e-10)
    with pytest.raises(ValueError, match="reduction"):
        points.captured_variance(kernel, grid, reduction="sum")


def test_hippo_and_fourier_capture_more_with_more_variables():
    kernel = rbf(1.0)
    grid = torch.linspace(0, 20, 200, dtype=DT).unsqueeze(-1)  # t / ℓ = 20
    # LegS resolves about M wiggles: measured 0.44 / 0.96 / 0.9999 for M = 4 / 16 / 32 (M ≈ 1.6 t/ℓ)
    legs = [HiPPOInducingVariables(m, "legs", t=20.0).captured_variance(kernel, grid).item() for m in (4, 16, 32)]
    assert legs[0] < 0.5 and 0.9 < legs[1] < legs[2] and legs[2] > 0.999
    matern = gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=1.5)).to(DT)
    vff = [FourierInducingVariables(k, 0.0, 20.0).captured_variance(matern, grid).item() for k in (3, 30)]
    assert 0 < vff[0] < vff[1] <= 1 + 1e-9


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
    """Learn ``tasks``, the captured-variance check on every task; the warnings raised."""
    model._check_clock = {"updates": 0.0, "check": 0.0}
    online.CHECK_COST_FRACTION, fraction = float("inf"), online.CHECK_COST_FRACTION
    try:
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always", CapturedVarianceWarning)
            for k, (x, y) in enumerate(tasks):
                if k > 0 and advance:
                    model.inducing_variables.advance(size * (k + 1))
                model.update(x, y)
    finally:
        online.CHECK_COST_FRACTION = fraction
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
    assert len(messages) == 1 and "pivoted Cholesky" in messages[0] and "HiPPO" not in messages[0]
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


def test_the_check_takes_at_most_its_share_of_the_update_time(monkeypatch):
    """On a clock where an update takes 2 s (two ``Kuu``) and the check 3 s, the check runs on the first
    task and then after every 60 s of updates (``CHECK_COST_FRACTION = 0.05``): tasks 1 and 31 of 40."""
    now, task, checks = [0.0], [0], []
    kuu, kuf = HiPPOInducingVariables.Kuu, HiPPOInducingVariables.Kuf

    def slow_kuu(self, kernel):
        now[0] += 1.0
        return kuu(self, kernel)

    def slow_kuf(self, kernel, x):
        if x.shape[-2] == 32:
            now[0] += 3.0
            checks.append(task[0])
        return kuf(self, kernel, x)

    monkeypatch.setattr(online.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(HiPPOInducingVariables, "Kuu", slow_kuu)
    monkeypatch.setattr(HiPPOInducingVariables, "Kuf", slow_kuf)
    model = OnlineSGPR(HiPPOInducingVariables(20, "legs", t=40.0), rbf(2000.0), gpytorch.likelihoods.GaussianLikelihood().to(DT))
    for k, (x, y) in enumerate(_stream(40, n=10)):
        task[0] = k + 1
        if k > 0:
            model.inducing_variables.advance(40.0 * (k + 1))
        model.update(x, y)
    assert checks == [1, 31]
