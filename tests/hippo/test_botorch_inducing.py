"""The default inducing points of ``OnlineGPModel`` and the warning where they do not reach the data."""

import warnings

import pytest
import torch
from botorch.models import SingleTaskGP
from botorch.models.transforms.outcome import Standardize
from test_botorch_dropin import DT, data, same_hyperparameters

from gpytorch_hippo.botorch import OnlineGPModel, default_inducing_points


def test_default_points_cover_the_unit_cube_or_the_first_batch_box():
    x, _ = data()
    inside = default_inducing_points(x, 64).points
    assert inside.shape == (64, 2) and inside.min() >= 0 and inside.max() <= 1 and inside.min(0).values.max() < 0.1
    outside = default_inducing_points(100 + 10 * x, 64).points
    low, high = (100 + 10 * x).min(0).values, (100 + 10 * x).max(0).values
    assert (outside >= low - 0.1 * (high - low)).all() and (outside <= high + 0.1 * (high - low)).all()
    assert torch.equal(default_inducing_points(x, 64).points, inside)  # deterministic


def test_default_points_start_with_the_first_batch_so_a_small_model_is_the_exact_gp():
    """Up to num_inducing points, the first batch's inputs are inducing points: the posterior equals
    SingleTaskGP's with the same hyperparameters (it did not with a Sobol design alone); with more points,
    a farthest-point subset of them, no duplicate."""
    x, y = data()
    points = default_inducing_points(x, 64).points
    torch.testing.assert_close(points[: x.shape[0]], torch.unique(x, dim=0))
    model = OnlineGPModel(x, y, fit_maxiter=0, num_inducing=x.shape[0])
    gp = SingleTaskGP(x, y)
    for name in ("covar_module", "likelihood", "mean_module"):
        getattr(gp, name).load_state_dict(getattr(model, name).state_dict())
    gp.eval()
    test = torch.rand(9, 2, generator=torch.Generator().manual_seed(3), dtype=DT)
    # to the points' jitter (GPyTorch's variational jitter); 20 Sobol points are 0.24 off in the mean
    torch.testing.assert_close(model.posterior(test).mean, gp.posterior(test).mean, rtol=0, atol=1e-4)
    torch.testing.assert_close(model.posterior(test).variance, gp.posterior(test).variance, rtol=0, atol=1e-4)
    few = default_inducing_points(x, 5).points
    assert few.shape == (5, 2) and torch.unique(few, dim=0).shape == (5, 2)
    assert all(bool((x == p).all(-1).any()) for p in few)
    spread = torch.cdist(few, few) + torch.eye(5, dtype=DT) * 9
    assert spread.min() > torch.cdist(x[:5], x[:5]).add(torch.eye(5, dtype=DT) * 9).min()


def test_conditioning_where_the_inducing_points_do_not_reach_warns_a_botorch_loop():
    """A BoTorch loop (which filters RuntimeWarning, as BoTorch's tutorials do) conditions the default model on new
    points between the fixed inducing points: its posterior sd there is many times SingleTaskGP's (up to 60x here), and
    an InducingApproximationWarning, a BotorchWarning, says so; at points the inducing points reach it stays silent."""
    from botorch.exceptions.warnings import BotorchWarning
    from botorch.models.utils.gpytorch_modules import (
        get_covar_module_with_dim_scaled_prior,
        get_gaussian_likelihood_with_lognormal_prior,
    )

    from gpytorch_hippo.botorch import InducingApproximationWarning

    generator = torch.Generator().manual_seed(0)
    x = torch.rand(25, 2, generator=generator, dtype=DT)
    y = torch.sin(6 * x[:, :1]) * torch.cos(5 * x[:, 1:]) + 0.01 * torch.randn(25, 1, generator=generator, dtype=DT)
    kernel, likelihood = get_covar_module_with_dim_scaled_prior(ard_num_dims=2), get_gaussian_likelihood_with_lognormal_prior()
    kernel.lengthscale = 0.1
    likelihood.noise = 1e-5
    model = OnlineGPModel(x[:20], y[:20], covar_module=kernel, likelihood=likelihood, fit_maxiter=0)  # exact on its 20 points
    assert issubclass(InducingApproximationWarning, BotorchWarning) and not issubclass(InducingApproximationWarning, RuntimeWarning)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # BoTorch's tutorials
        with pytest.warns(InducingApproximationWarning, match="num_inducing"):
            conditioned = model.condition_on_observations(x[20:], y[20:])
    gp = same_hyperparameters(SingleTaskGP(x, y, outcome_transform=Standardize(1)), model)
    gp.outcome_transform.load_state_dict(model.outcome_transform.state_dict())
    ratio = conditioned.posterior(x[20:]).variance.sqrt() / gp.posterior(x[20:]).variance.sqrt()
    assert ratio.max() > 10
    with warnings.catch_warnings():
        warnings.simplefilter("error", InducingApproximationWarning)
        model.condition_on_observations(x[:3], y[:3])  # inputs at inducing points: exact, silent
