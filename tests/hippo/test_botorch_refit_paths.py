"""BoTorch's fitting and loading paths on ``OnlineGPModel`` never leave a stale posterior: after
``fit_gpytorch_mll(ExactMarginalLogLikelihood(...))``, a torch training loop over ``train_inputs``, a
warm start or a checkpoint, the posterior equals a fresh model's with the same hyperparameters and data
(it used to keep the ``q(u)`` of the old hyperparameters, or the checkpoint's observations)."""

import contextlib
import copy

import gpytorch
import pytest
import torch
from botorch.fit import fit_gpytorch_mll
from gpytorch.mlls import ExactMarginalLogLikelihood

from gpytorch_hippo import HiPPOInducingVariables, InducingPoints
from gpytorch_hippo.botorch import OnlineGPModel, OnlineGPModelWarning

DT = torch.float64


def data(n, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=generator, dtype=DT)
    y = torch.sin(6 * x[:, :1]) * torch.cos(4 * x[:, 1:]) + 0.05 * torch.randn(n, 1, generator=generator, dtype=DT)
    return x, y


def points():
    return InducingPoints(torch.rand(12, 2, generator=torch.Generator().manual_seed(5), dtype=DT), learn=False)


def modules():
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2))
    return dict(covar_module=kernel, likelihood=gpytorch.likelihoods.GaussianLikelihood(), mean_module=gpytorch.means.ConstantMean())


def streamed(x, y, split=10, **kwargs):
    """A model built on the first ``split`` points, then conditioned on the rest."""
    model = OnlineGPModel(x[:split], y[:split], points(), **modules(), fit_maxiter=0, **kwargs, outcome_transform=None)
    return model.condition_on_observations(x[split:], y[split:])


def fresh_like(model, x, y):
    """A model built on all of ``(x, y)`` at once with ``model``'s hyperparameters (no fit)."""
    return OnlineGPModel(
        x,
        y,
        copy.deepcopy(model.inducing_variables),
        covar_module=copy.deepcopy(model.covar_module),
        likelihood=copy.deepcopy(model.likelihood),
        mean_module=copy.deepcopy(model.mean_module),
        fit_maxiter=0,
        outcome_transform=None,
    )


def assert_same_posterior(model, reference, atol=1e-9):
    test = torch.rand(7, 2, generator=torch.Generator().manual_seed(9), dtype=DT)
    ours, theirs = model.posterior(test), reference.posterior(test)
    torch.testing.assert_close(ours.mean, theirs.mean, rtol=0, atol=atol)
    torch.testing.assert_close(ours.variance, theirs.variance, rtol=0, atol=atol)


@pytest.mark.filterwarnings("ignore::gpytorch_hippo.botorch.InducingApproximationWarning")  # few inducing points, to be fast
def test_fit_gpytorch_mll_with_the_exact_marginal_likelihood_refreshes_the_posterior():
    x, y = data(20)
    model = streamed(x, y, keep_data=True)
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    model.train()
    objective = mll(model(*model.train_inputs), model.train_targets)
    # the objective is GPyTorch's exact marginal likelihood of all kept data
    exact = gpytorch.models.ExactGP(x, y[:, 0], copy.deepcopy(model.likelihood))
    exact.forward = lambda inputs: gpytorch.distributions.MultivariateNormal(model.mean_module(inputs), model.covar_module(inputs))
    exact.train()
    reference = ExactMarginalLogLikelihood(exact.likelihood, exact)(exact(x), y[:, 0])
    torch.testing.assert_close(objective, reference, rtol=0, atol=1e-10)
    before = model.covar_module.base_kernel.lengthscale.detach().clone()
    fit_gpytorch_mll(mll, optimizer_kwargs={"options": {"maxiter": 30}})
    assert not torch.equal(before, model.covar_module.base_kernel.lengthscale)
    assert_same_posterior(model, fresh_like(model, x, y))


def test_a_torch_training_loop_over_train_inputs_refreshes_the_posterior():
    """BoTorch's tutorial "fit a model with a torch optimizer", verbatim in its steps."""
    x, y = data(20, seed=1)
    model = streamed(x, y, keep_data=True)
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    optimizer = torch.optim.Adam([{"params": model.parameters()}], lr=0.1)
    model.train()
    for _ in range(20):
        optimizer.zero_grad()
        output = model(*model.train_inputs)
        loss = -mll(output, model.train_targets)
        loss.backward()
        optimizer.step()
    model.eval()
    assert_same_posterior(model, fresh_like(model, x, y))


def test_hippo_variables_refresh_over_the_whole_stream():
    t = torch.linspace(0, 4, 40, dtype=DT).unsqueeze(-1)
    y = torch.sin(3 * t)
    kernel = gpytorch.kernels.RBFKernel()
    kernel.lengthscale = 0.4
    model = OnlineGPModel(
        t[:20],
        y[:20],
        HiPPOInducingVariables(20, "legs", t=2.0),
        covar_module=kernel,
        mean_module=gpytorch.means.ZeroMean(),
        fit_maxiter=0,
        keep_data=True,
        outcome_transform=None,
    )
    model = model.condition_on_observations(t[20:], y[20:])
    model.covar_module.lengthscale = 0.6  # set by hand: the next posterior is recomputed from the kept data
    other_kernel = gpytorch.kernels.RBFKernel()
    other_kernel.lengthscale = 0.6
    reference = OnlineGPModel(
        t,
        y,
        HiPPOInducingVariables(20, "legs", t=4.0),
        covar_module=other_kernel,
        likelihood=copy.deepcopy(model.likelihood),
        mean_module=gpytorch.means.ZeroMean(),
        fit_maxiter=0,
        outcome_transform=None,
    )
    test = torch.linspace(0, 4, 9, dtype=DT).unsqueeze(-1)
    torch.testing.assert_close(model.posterior(test).mean, reference.posterior(test).mean, rtol=0, atol=1e-8)


def test_without_kept_data_the_exact_fit_names_what_to_call():
    x, y = data(20)
    model = streamed(x, y, keep_data=False)
    with pytest.raises(AttributeError, match="keep_data=True") as error:
        fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
    assert "observe" in str(error.value) and "fit_hyperparameters" in str(error.value)


def test_a_warm_start_by_load_state_dict_keeps_the_models_own_data_as_single_task_gp():
    """BoTorch's closed-loop tutorial rebuilds the model on more data and loads the old model's state_dict:
    the kernel, likelihood and mean are loaded, the posterior is that of this model's own data (it used to
    be replaced by the checkpoint's 5-point posterior); the same through ModelListGP, which calls each
    model's loader. load_hyperparameters is the same warm start without the warning."""
    from botorch.models import ModelListGP

    x, y = data(20, seed=2)
    old = OnlineGPModel(x[:5], y[:5], points(), **modules(), fit_maxiter=20, outcome_transform=None)
    for load in ("load_state_dict", "load_hyperparameters"):
        new = streamed(x, y)
        with pytest.warns(OnlineGPModelWarning) if load == "load_state_dict" else contextlib.nullcontext():
            getattr(new, load)(old.state_dict())
        torch.testing.assert_close(new.covar_module.base_kernel.lengthscale, old.covar_module.base_kernel.lengthscale)
        assert new.num_updates.item() == 2 and new.train_targets.shape == (20,)  # its own data and counter
        assert_same_posterior(new, fresh_like(old, x, y))
    listed = ModelListGP(streamed(x, y), streamed(x, y))
    with pytest.warns(OnlineGPModelWarning):
        listed.load_state_dict(ModelListGP(old, copy.deepcopy(old)).state_dict())
    for model in listed.models:
        assert_same_posterior(model, fresh_like(old, x, y))


def test_a_warm_start_keeps_the_models_own_transforms():
    """Standardize's statistics describe the data a model was built on: a warm start keeps them (the kept targets
    were transformed with them), and the posterior is a fresh model's with the loaded kernel, likelihood and mean."""
    x, y = data(20, seed=4)
    y = 3 + 2 * y
    old = OnlineGPModel(x[:5], y[:5], points(), **modules(), fit_maxiter=20)
    new = OnlineGPModel(x, y, points(), **modules(), fit_maxiter=0)
    means = new.outcome_transform.means.clone()
    new.load_hyperparameters(old.state_dict())
    torch.testing.assert_close(new.outcome_transform.means, means, rtol=0, atol=0)
    reference = OnlineGPModel(
        x,
        y,
        points(),
        covar_module=copy.deepcopy(old.covar_module),
        likelihood=copy.deepcopy(old.likelihood),
        mean_module=copy.deepcopy(old.mean_module),
        fit_maxiter=0,
    )
    assert_same_posterior(new, reference)


def test_without_kept_data_a_warm_start_by_load_state_dict_is_refused():
    x, y = data(20, seed=2)
    old = OnlineGPModel(x[:5], y[:5], points(), **modules(), fit_maxiter=0, outcome_transform=None)
    new = streamed(x, y, keep_data=False)
    with pytest.raises(ValueError, match="load_hyperparameters"):
        new.load_state_dict(old.state_dict())
    new.load_hyperparameters(old.state_dict())  # the online summary carried to the loaded hyperparameters
    torch.testing.assert_close(new.covar_module.base_kernel.lengthscale, old.covar_module.base_kernel.lengthscale)


@pytest.mark.filterwarnings("ignore::gpytorch_hippo.inducing.CapturedVarianceWarning")  # few inducing variables, to be fast
@pytest.mark.filterwarnings("ignore::gpytorch_hippo.botorch.InducingApproximationWarning")  # few inducing points, to be fast
def test_a_checkpoint_rebuilds_without_data_and_refits_on_the_same_schedule():
    x, y = data(30, seed=3)
    model = OnlineGPModel(x[:10], y[:10], points(), **modules(), fit_maxiter=5, refit_every=2, outcome_transform=None, keep_data=False)
    model = model.observe(x[10:15], y[10:15])  # update 2: refit
    checkpoint = copy.deepcopy(model.state_dict())
    resumed = OnlineGPModel.from_state_dict(checkpoint, points(), **modules(), fit_maxiter=5, refit_every=2, outcome_transform=None)
    assert resumed.num_updates.item() == 2
    assert_same_posterior(resumed, model, atol=0)
    for start in (15, 20, 25):  # updates 3 (no refit), 4 (refit), 5
        model = model.observe(x[start : start + 5], y[start : start + 5])
        resumed = resumed.observe(x[start : start + 5], y[start : start + 5])
    torch.testing.assert_close(resumed.covar_module.base_kernel.lengthscale, model.covar_module.base_kernel.lengthscale)
    assert_same_posterior(resumed, model, atol=1e-12)


def test_the_same_checkpoint_loads_into_its_own_model():
    """fit_gpytorch_mll's roll-back and a reload of the model's own state are not warm starts."""
    x, y = data(15)
    model = streamed(x, y)
    state = copy.deepcopy(model.state_dict())
    model.load_state_dict(state)
    assert_same_posterior(model, streamed(x, y), atol=0)


def test_predictive_entropy_search_reads_the_kept_data_as_single_task_gp():
    """qPredictiveEntropySearch reads train_inputs: with keep_data=True and inducing points at the data it
    equals its value on SingleTaskGP with the same hyperparameters (to its EP iterations' tolerance)."""
    from botorch.acquisition.predictive_entropy_search import qPredictiveEntropySearch
    from botorch.models import SingleTaskGP

    generator = torch.Generator().manual_seed(0)
    x = torch.rand(12, 2, generator=generator, dtype=DT)
    y = torch.sin(4 * x[:, :1]) + torch.cos(3 * x[:, 1:])
    model = OnlineGPModel(x, y, inducing_variables=InducingPoints(x, learn=False, jitter=1e-10), keep_data=True, fit_maxiter=20)
    gp = SingleTaskGP(x, y, outcome_transform=copy.deepcopy(model.outcome_transform))
    for name in ("covar_module", "likelihood", "mean_module"):
        getattr(gp, name).load_state_dict(getattr(model, name).state_dict())
    gp.eval()
    optimal_inputs = torch.rand(4, 2, generator=generator, dtype=DT)
    X = torch.rand(3, 1, 2, generator=generator, dtype=DT)
    ours = qPredictiveEntropySearch(model, optimal_inputs=optimal_inputs)(X)
    theirs = qPredictiveEntropySearch(gp, optimal_inputs=optimal_inputs)(X)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-4)


def test_fit_gpytorch_mll_keeps_normalizes_bounds_and_matches_single_task_gp():
    """BoTorch's closure passes model.transform_inputs(train_inputs) in train mode; the kept inputs are in
    the model space already, so a second Normalize re-learned its bounds from them ([0, 1]) and silently
    shifted every later prediction. With the first batch's inputs as inducing points and the same data,
    noise and input transform, the fitted model equals SingleTaskGP's."""
    from botorch.models import SingleTaskGP
    from botorch.models.transforms.input import Normalize

    generator = torch.Generator().manual_seed(1)
    x = 0.2 + 0.6 * torch.rand(16, 3, generator=generator, dtype=DT)
    y = torch.sin(5 * x[:, :1]) + x[:, 1:2] ** 2 + 0.1 * torch.randn(16, 1, generator=generator, dtype=DT)
    yvar = torch.full_like(y, 0.01)
    gp = SingleTaskGP(x, y, yvar, input_transform=Normalize(d=3))
    fit_gpytorch_mll(ExactMarginalLogLikelihood(gp.likelihood, gp))
    model = OnlineGPModel(x, y, yvar, input_transform=Normalize(d=3))
    offset = model.input_transform.offset.clone()
    with pytest.warns(OnlineGPModelWarning, match="fit_maxiter=0"):  # the exact fit starts from the sparse fit
        fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
    torch.testing.assert_close(model.input_transform.offset, offset, rtol=0, atol=0)
    torch.testing.assert_close(model.covar_module.lengthscale, gp.covar_module.lengthscale, rtol=1e-3, atol=0)
    test = torch.rand(6, 3, generator=generator, dtype=DT)
    torch.testing.assert_close(model.posterior(test).mean, gp.posterior(test).mean, rtol=0, atol=2e-4)  # the points' jitter
    torch.testing.assert_close(model.posterior(test).variance, gp.posterior(test).variance, rtol=0, atol=1e-4)


def test_a_warm_start_loads_every_hyperparameter_as_single_task_gp_and_says_it_is_not_a_restore():
    """BoTorch's closed loop: rebuild on more data, load the old model's state_dict. SingleTaskGP loads the kernel,
    the likelihood and the mean constant; so does OnlineGPModel (it used to keep its own mean: 0.57 off here), and
    code that meant load_state_dict as a restore of the checkpoint's posterior is told to use from_state_dict."""
    from botorch.models import SingleTaskGP

    x, y = data(20, seed=6)
    y = y + 0.8
    old = OnlineGPModel(x[:5], y[:5], **modules(), fit_maxiter=0, outcome_transform=None)
    old.covar_module.base_kernel.lengthscale = torch.tensor([[0.3, 0.6]], dtype=DT)
    old.covar_module.outputscale, old.likelihood.noise, old.mean_module.constant = 0.7, 0.02, -0.9
    old_gp = SingleTaskGP(x[:5], y[:5], **{name: copy.deepcopy(getattr(old, name)) for name in modules()}, outcome_transform=None)
    new = OnlineGPModel(x, y, **modules(), fit_maxiter=20, outcome_transform=None)
    new_gp = SingleTaskGP(x, y, **modules(), outcome_transform=None)
    with pytest.warns(OnlineGPModelWarning, match="from_state_dict"):
        new.load_state_dict(old.state_dict())
    new_gp.load_state_dict(old_gp.state_dict())
    new_gp.eval()
    assert new.mean_module.constant.item() == pytest.approx(-0.9)
    test = torch.rand(9, 2, generator=torch.Generator().manual_seed(7), dtype=DT)
    # to the jitter of the inducing points, which are the data (noise 0.02, jitter 1e-6)
    torch.testing.assert_close(new.posterior(test).mean, new_gp.posterior(test).mean, rtol=0, atol=1e-4)
    torch.testing.assert_close(new.posterior(test).variance, new_gp.posterior(test).variance, rtol=0, atol=1e-4)


def test_an_exact_fit_after_the_constructors_sparse_fit_says_so_and_fit_maxiter_0_starts_as_single_task_gp():
    """BoTorch's loop: build the model, then fit_gpytorch_mll(ExactMarginalLogLikelihood). The constructor's fit of the
    sparse bound is the exact fit's start (at n = 1,000 it ended 150 nats worse than SingleTaskGP's, without a word):
    the fit says so; built with fit_maxiter=0 the model starts where SingleTaskGP starts and ends at its optimum."""
    from botorch.models import SingleTaskGP

    x, y = data(24, seed=8)
    gp = SingleTaskGP(x, y)
    fit_gpytorch_mll(ExactMarginalLogLikelihood(gp.likelihood, gp))
    fitted = OnlineGPModel(x, y, fit_maxiter=30)
    with pytest.warns(OnlineGPModelWarning, match="fit_maxiter=0"):
        fit_gpytorch_mll(ExactMarginalLogLikelihood(fitted.likelihood, fitted))
    model = OnlineGPModel(x, y, fit_maxiter=0)
    fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))  # no warning: SingleTaskGP's start
    torch.testing.assert_close(model.covar_module.lengthscale, gp.covar_module.lengthscale, rtol=1e-3, atol=0)
