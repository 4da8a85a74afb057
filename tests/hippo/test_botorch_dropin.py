"""``OnlineGPModel`` built as BoTorch's ``SingleTaskGP`` is: ``(train_X, train_Y)`` and
``(train_X, train_Y, train_Yvar)`` with the same defaults (kernel, likelihood, mean, ``Standardize``),
BoTorch's input warnings, and a 1-D ``X`` read as points; compared with ``SingleTaskGP`` itself."""

import warnings

import gpytorch
import pytest
import torch
from botorch.exceptions.warnings import InputDataWarning
from botorch.models import SingleTaskGP
from botorch.models.transforms.outcome import Standardize

from gpytorch_hippo import InducingPoints
from gpytorch_hippo.botorch import DEFAULT_NUM_INDUCING, OnlineGPModel

DT = torch.float64


def data(n=20, seed=0, scale=3.0, shift=5.0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=generator, dtype=DT)
    y = shift + scale * torch.sin(6 * x[:, :1]) * torch.cos(4 * x[:, 1:]) + 0.1 * torch.randn(n, 1, generator=generator, dtype=DT)
    return x, y


def same_hyperparameters(gp, model):
    """Copy the fitted kernel, noise and mean of ``model`` into ``gp`` (SingleTaskGP)."""
    gp.covar_module.load_state_dict(model.covar_module.state_dict())
    gp.likelihood.load_state_dict(model.likelihood.state_dict())
    gp.mean_module.load_state_dict(model.mean_module.state_dict())
    return gp.eval()


def test_two_arguments_build_the_single_task_gp_model():
    """Default points (the data's, up to DEFAULT_NUM_INDUCING) and the default ``Standardize``: with the
    same hyperparameters the posterior is SingleTaskGP's to sparse-approximation accuracy, in the raw
    outcome space (an unstandardised model would be off by the shift of 5)."""
    x, y = data()
    model = OnlineGPModel(x, y, fit_maxiter=50)
    assert isinstance(model.outcome_transform, Standardize)
    assert model.inducing_variables.num_inducing == min(x.shape[0], DEFAULT_NUM_INDUCING)
    gp = same_hyperparameters(SingleTaskGP(x, y), model)
    test = torch.rand(30, 2, generator=torch.Generator().manual_seed(1), dtype=DT)
    ours, theirs = model.posterior(test), gp.posterior(test)
    assert (ours.mean - theirs.mean).abs().max() < 0.02 * y.std()
    assert (ours.variance - theirs.variance).abs().max() < 0.02 * theirs.variance.max()


@pytest.mark.parametrize("streamed", [False, True])
def test_known_noise_is_single_task_gp_with_train_yvar(streamed):
    """``OnlineGPModel(X, Y, Yvar)``: with inducing points at the data, SingleTaskGP(X, Y, Yvar) exactly, with
    the default ``Standardize`` on one batch; streamed, later batches bring their noise through ``observe``
    (required there). (Streamed with ``Standardize`` the two differ by design: ours keeps the first
    batch's statistics, SingleTaskGP refits them on all data.)"""
    x, y = data(30, seed=2)
    yvar = 0.01 + 0.05 * torch.rand(30, 1, generator=torch.Generator().manual_seed(3), dtype=DT)
    split = 20 if streamed else 30
    transform = {"outcome_transform": None} if streamed else {}
    model = OnlineGPModel(
        x[:split], y[:split], yvar[:split], inducing_variables=InducingPoints(x, learn=False, jitter=1e-10), fit_maxiter=30, **transform
    )
    assert model.known_noise and not model.likelihood.noise_covar.raw_noise.requires_grad
    if streamed:
        with pytest.raises(ValueError, match="Yvar"):
            model.observe(x[20:], y[20:])
        model = model.observe(x[20:], y[20:], yvar[20:])
    resumed = OnlineGPModel.from_state_dict(model.state_dict(), InducingPoints(x, learn=False, jitter=1e-10), **transform)
    assert resumed.known_noise  # a checkpoint keeps the known-noise setting
    gp = SingleTaskGP(x, y, yvar, **transform)
    gp.covar_module.load_state_dict(model.covar_module.state_dict())
    gp.mean_module.load_state_dict(model.mean_module.state_dict())
    gp.eval()
    test = torch.rand(9, 2, generator=torch.Generator().manual_seed(4), dtype=DT)
    # to the points' jitter (GPyTorch's variational jitter); 20 Sobol points are 0.24 off in the mean
    torch.testing.assert_close(model.posterior(test).mean, gp.posterior(test).mean, rtol=0, atol=1e-4)
    torch.testing.assert_close(model.posterior(test).variance, gp.posterior(test).variance, rtol=0, atol=1e-4)


@pytest.mark.filterwarnings("ignore::gpytorch_hippo.botorch.InducingApproximationWarning")  # few inducing points, to be fast
def test_the_former_positional_inducing_variables_keep_working():
    x, y = data()
    points = InducingPoints(x[:8], learn=False)
    model = OnlineGPModel(x, y, points, fit_maxiter=0)
    assert model.inducing_variables is points and not model.known_noise
    with pytest.raises(TypeError, match="twice"):
        OnlineGPModel(x, y, points, inducing_variables=InducingPoints(x[:4]))
    with pytest.raises(ValueError, match="train_Yvar"):
        OnlineGPModel(x, y, torch.ones(20, 2, dtype=DT))
    with pytest.raises(ValueError, match="non-negative"):
        OnlineGPModel(x, y, -torch.ones(20, 1, dtype=DT))
    with pytest.raises(TypeError, match="train_Yvar"):
        OnlineGPModel(x, y, likelihood=gpytorch.likelihoods.FixedNoiseGaussianLikelihood(torch.ones(20, dtype=DT)))
    with pytest.raises(ValueError, match="not both"):
        OnlineGPModel(x, y, inducing_variables=points, num_inducing=10)


def _input_warnings(build):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        build()
    return sorted(str(w.message).split(".")[0] for w in record if issubclass(w.category, InputDataWarning))


@pytest.mark.parametrize("case", ["float32", "unscaled inputs", "unstandardised outcomes"])
def test_botorch_input_warnings_are_single_task_gps(case):
    x, y = data()
    if case == "float32":
        x, y = x.float(), y.float()
    if case == "unscaled inputs":
        x = 10 * x
    transform = {"outcome_transform": None} if case == "unstandardised outcomes" else {}
    ours = _input_warnings(lambda: OnlineGPModel(x, y, fit_maxiter=0, **transform))
    theirs = _input_warnings(lambda: SingleTaskGP(x, y, **transform))
    assert ours and set(ours) == set(theirs)


def test_a_one_dimensional_test_x_is_read_as_points():
    t = torch.rand(15, 1, generator=torch.Generator().manual_seed(0), dtype=DT)
    model = OnlineGPModel(t, torch.sin(6 * t), fit_maxiter=0)
    grid = torch.linspace(0, 1, 101, dtype=DT)
    posterior = model.posterior(grid)
    assert posterior.mean.shape == (101, 1)
    torch.testing.assert_close(posterior.mean, model.posterior(grid.unsqueeze(-1)).mean)
