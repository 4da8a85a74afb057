"""``OnlineSGPR``'s refit policy (``refit_every``, :class:`RefitPolicy`) and its transactional refits
(gpytorch_hippo.fitting).

The policy is checked against the same stream with each task's ``num_iter``/``optimizer`` given by hand,
through a ``state_dict`` reload; a refit that moves a hyperparameter by orders of magnitude, raises or lowers
the bound against the hyperparameters before it."""

import copy

import gpytorch
import numpy as np
import pandas as pd
import pytest
import torch

from gpytorch_hippo import HiPPOInducingVariables, InducingPoints, OnlineSGPR, RefitPolicy, RefitWarning, TimeAxis
from gpytorch_hippo.inducing import hippo_backends
from gpytorch_hippo.inducing.cost import CovarianceCostError

DT = torch.float64


def stream(num_tasks=5, n=30, seed=0):
    generator = torch.Generator().manual_seed(seed)
    for k in range(num_tasks):
        t = torch.sort(k + torch.rand(n, generator=generator, dtype=DT)).values
        yield t, torch.sin(3 * t) + 0.1 * torch.randn(n, generator=generator, dtype=DT)


def hippo_model(**policy):
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=1.5)).double()
    return OnlineSGPR(
        HiPPOInducingVariables(24, "legs", t=1.0),
        kernel,
        gpytorch.likelihoods.GaussianLikelihood().double(),
        gpytorch.means.ConstantMean().double(),
        **policy,
    )


def test_refit_every_fits_tasks_one_and_every_kth_after_it_as_by_hand_and_keeps_the_schedule_on_reload():
    by_policy, by_hand = hippo_model(refit_every=2, refit_iter=20), hippo_model()
    fitted = []
    for k, (t, y) in enumerate(stream()):
        for model in (by_policy, by_hand):
            if k > 0:
                model.inducing_variables.advance(float(k + 1))
        before = by_policy.last_fit
        by_policy.update(t, y)
        fitted.append(by_policy.last_fit is not before)
        if k % 2 == 0:
            if k > 0:  # HiPPO variables project f - m: the policy leaves the mean out after task 1
                by_hand.mean_module.requires_grad_(False)
            by_hand.update(t, y, num_iter=20, optimizer="lbfgs")
            by_hand.mean_module.requires_grad_(True)
        else:
            by_hand.update(t, y, num_iter=0)
        if k == 2:  # reload mid-stream: the task count, hence the schedule, is in the state_dict
            state = copy.deepcopy(by_policy.state_dict())
            by_policy = hippo_model(refit_every=2, refit_iter=20)
            by_policy.inducing_variables.advance(3.0)
            by_policy.load_state_dict(state)
    assert fitted == [True, False, True, False, True]
    assert by_policy.last_fit.status in ("success", "stopped") and by_policy.last_fit.iterations <= 20
    test = torch.linspace(0, 5, 50, dtype=DT)
    by_policy.eval(), by_hand.eval()
    with torch.no_grad():
        ours, theirs = by_policy(test), by_hand(test)
    torch.testing.assert_close(ours.mean, theirs.mean, rtol=0, atol=1e-9)
    torch.testing.assert_close(ours.variance, theirs.variance, rtol=0, atol=1e-9)
    torch.testing.assert_close(by_policy.covar_module.outputscale, by_hand.covar_module.outputscale, rtol=0, atol=1e-12)


def test_an_explicit_num_iter_overrides_the_policy_and_bad_settings_raise():
    model = hippo_model(refit_every=3)
    t, y = next(stream(1))
    model.update(t, y, num_iter=0)
    assert model.last_fit is None
    for options, message in (
        ({"refit_every": 0}, "refit_every"),
        ({"refit_iter": 0}, "refit_iter"),
        ({"refit_optimizer": "sgd"}, "refit_optimizer"),
    ):
        with pytest.raises(ValueError, match=message):
            hippo_model(**options)


def test_the_refit_policy_is_an_object_the_update_consults_and_the_refit_attributes_set_it_checked():
    policy = RefitPolicy(every=2, num_iter=20)
    assert [policy.next_fit(k) for k in range(4)] == [(20, "lbfgs"), None, (20, "lbfgs"), None]
    model = hippo_model()
    assert model.refit_policy == RefitPolicy() and model.refit_every is None
    model.refit_every, model.refit_iter = 2, 20
    assert model.refit_policy == policy
    with pytest.raises(ValueError, match="refit_every"):
        model.refit_every = 0
    assert model.refit_policy == policy  # a refused setting changes nothing


def temperature_model(**options):
    """OHSGPR on hourly readings, as ``benchmarks/refit_calibration.py`` builds it."""
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=2.5)).double()
    kernel.base_kernel.lengthscale = 6.0
    return OnlineSGPR(
        HiPPOInducingVariables(48, "legs", t=24.0),
        kernel,
        gpytorch.likelihoods.GaussianLikelihood().double(),
        captured_variance_warning=None,
        time_axis=TimeAxis("h", origin=pd.Timestamp("2013-01-01")),
        **options,
    )


def temperature_days():
    """Two days of hourly readings: an 8-hour cycle, then a day whose sensor reported six values around 0."""
    hours = pd.date_range("2013-01-01", periods=48, freq="h")
    generator = np.random.default_rng(0)
    values = np.sin(2 * np.pi * np.arange(48) / 8) + 0.1 * generator.standard_normal(48)
    values[24:] = np.nan
    values[24:30] = 0.3 * generator.standard_normal(6)
    series = pd.Series(values, index=hours)
    return series.iloc[:24], series.iloc[24:]


def test_a_refit_that_moves_a_hyperparameter_by_orders_of_magnitude_is_undone_and_reported():
    """A refit on a day of six readings moved the noise 0.0032 -> 0.093 (29x) and reported "success"; now the
    fit is undone with a RefitWarning and ``last_fit.rejected`` saying why, and the model equals one that absorbed
    the day without a fit. ``refit_max_change=None`` keeps the old behaviour."""
    day1, day2 = temperature_days()
    models = {}
    for name, options in (("default", {}), ("any move", {"refit_max_change": None}), ("no refit", {})):
        model = temperature_model(refit_every=1, **options)
        model.update(day1.index, day1, missing="drop")
        model.inducing_variables.advance(48.0)
        before = {key: value.clone() for key, value in model.state_dict().items() if "raw_" in key}
        noise_before = model.likelihood.noise.item()
        if name == "default":
            with pytest.warns(RefitWarning, match=r"noise moved .*x, more than max_change=10"):
                model.update(day2.index, day2, missing="drop")
            assert model.last_fit.rejected and model.last_fit.largest_change > 10
            assert model.last_fit.bound_after == model.last_fit.bound_before
            assert all(torch.equal(model.state_dict()[key], value) for key, value in before.items())
        elif name == "any move":
            model.update(day2.index, day2, missing="drop")
            assert model.last_fit.status == "success" and not model.last_fit.rejected
            assert model.likelihood.noise.item() > 10 * noise_before  # the move the default refuses
        else:
            model.update(day2.index, day2, missing="drop", num_iter=0)
        models[name] = model.eval()
    test = pd.date_range("2013-01-02", periods=24, freq="h")
    with torch.no_grad():
        ours, reference = models["default"](test), models["no refit"](test)
    assert torch.equal(ours.mean, reference.mean) and torch.equal(ours.variance, reference.variance)


def test_a_refit_that_raises_restores_the_hyperparameters_and_the_model_keeps_working(monkeypatch):
    """A CovarianceCostError mid-fit (the spectral rule's node budget, reached as the fit shortens the length scale)
    left the length scale where the optimiser was and every later prediction raising; now the error is raised
    with the hyperparameters bit for bit those before the fit, and the task can be absorbed without a fit."""
    monkeypatch.setattr(hippo_backends, "MAX_SPECTRAL_NODES", 130)  # enough at length scale 1, not below it
    generator = torch.Generator().manual_seed(0)
    models = []
    for _ in range(2):
        kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).double()
        kernel.base_kernel.lengthscale = 1.0
        likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
        likelihood.noise = 0.01
        models.append(OnlineSGPR(HiPPOInducingVariables(40, "legs", t=10.0), kernel, likelihood, captured_variance_warning=None))
    x1 = torch.linspace(0, 10, 100, dtype=DT)
    y1 = torch.sin(2 * x1) + 0.1 * torch.randn(100, generator=generator, dtype=DT)
    x2 = torch.linspace(10, 20, 400, dtype=DT)
    y2 = torch.sin(25 * x2)  # a wiggle the fit chases with a shorter length scale
    failing, reference = models
    for model in models:
        model.update(x1, y1)
        model.inducing_variables.advance(20.0)
    before = copy.deepcopy(failing.state_dict())
    with pytest.raises(CovarianceCostError) as error:
        failing.update(x2, y2, num_iter=30, optimizer="lbfgs")
    assert "restored the hyperparameters" in "".join(getattr(error.value, "__notes__", []))
    state = failing.state_dict()
    assert state.keys() == before.keys()
    assert all(torch.equal(state[key], value) for key, value in before.items() if isinstance(value, torch.Tensor))
    assert failing.num_tasks.item() == 1 and failing.last_fit is None
    failing.update(x2, y2, num_iter=0)
    reference.update(x2, y2, num_iter=0)
    test = torch.linspace(0, 20, 50, dtype=DT)
    with torch.no_grad():
        assert torch.equal(failing.eval()(test).mean, reference.eval()(test).mean)


@pytest.mark.parametrize("optimizer", ["lbfgs", "adam"])
def test_a_batched_refit_keeps_every_hyperparameter_of_a_stream_without_points(optimizer):
    """Three streams in one batched OnlineSGPR; stream 1 has no point in the refitted task: its length scale,
    output scale and noise keep every bit (they moved 26.5 -> 22.6 in a fleet), the others are fitted."""
    S = 3
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=1.5, batch_shape=torch.Size([S])), batch_shape=torch.Size([S]))
    likelihood = gpytorch.likelihoods.GaussianLikelihood(batch_shape=torch.Size([S]))
    model = OnlineSGPR(
        HiPPOInducingVariables(12, "legs", t=torch.full((S,), 2.0, dtype=DT), batch_shape=torch.Size([S])),
        kernel,
        likelihood,
        captured_variance_warning=None,
    ).double()
    generator = torch.Generator().manual_seed(0)
    x = 2.0 * torch.rand(S, 20, 1, generator=generator, dtype=DT)
    model.update(x, torch.sin(3 * x[..., 0]) + 0.1 * torch.randn(S, 20, generator=generator, dtype=DT), num_iter=30, optimizer="lbfgs")
    model.inducing_variables.advance(torch.tensor([4.0, 4.0, 4.0], dtype=DT))
    x = 2.0 + 2.0 * torch.rand(S, 20, 1, generator=generator, dtype=DT)
    y = torch.sin(3 * x[..., 0]) + 0.1 * torch.randn(S, 20, generator=generator, dtype=DT)
    mask = torch.ones(S, 20, dtype=torch.bool)
    mask[1] = False
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    model.update(x, torch.where(mask, y, torch.nan), num_iter=20, optimizer=optimizer, lr=0.05, mask=mask)
    assert not model.last_fit.rejected
    for name, parameter in model.named_parameters():
        if parameter.dim() >= 1 and parameter.shape[0] == S:
            assert torch.equal(parameter[1], before[name][1]), name
            assert not torch.equal(parameter[0], before[name][0]), name


def test_a_fit_that_lowers_the_bound_is_undone_unless_every_fit_is_kept():
    """Three Adam steps of rate 1 from near the optimum end below the bound they started from: the default
    model undoes the fit (RefitWarning, ``last_fit.rejected``) and keeps its length scale; with
    ``refit_max_change=None`` (the thesis's protocol) the optimiser's end is kept as it is."""
    generator = torch.Generator().manual_seed(0)
    x = torch.linspace(0, 10, 60, dtype=DT)
    y = torch.sin(x) + 0.1 * torch.randn(60, generator=generator, dtype=DT)
    models = []
    for options in ({}, {"refit_max_change": None}):
        kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).double()
        kernel.base_kernel.lengthscale = 1.0
        likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
        likelihood.noise = 0.01
        points = InducingPoints(torch.linspace(0, 10, 15, dtype=DT).unsqueeze(-1))
        models.append(OnlineSGPR(points, kernel, likelihood, **options))
    undone, kept = models
    with pytest.warns(RefitWarning, match="the bound fell"):
        undone.update(x, y, num_iter=3, optimizer="adam", lr=1.0)
    kept.update(x, y, num_iter=3, optimizer="adam", lr=1.0)
    assert undone.last_fit.bound_after == undone.last_fit.bound_before
    assert undone.covar_module.base_kernel.lengthscale.item() == 1.0
    assert kept.last_fit.bound_after < kept.last_fit.bound_before and not kept.last_fit.rejected
    assert kept.covar_module.base_kernel.lengthscale.item() != 1.0
