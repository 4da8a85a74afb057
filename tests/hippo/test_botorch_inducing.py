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
    """A BoTorch loop (which filters RuntimeWarning, as BoTorch's tutorials do) conditions a model on fixed points (the
    first batch and a Sobol design) on new points between them: its posterior sd there is many times SingleTaskGP's (up
    to 60x here), and an InducingApproximationWarning, a BotorchWarning, says so; at points the inducing points reach it
    stays silent, and so does the default model, whose points take in the new inputs (up to ``num_inducing``)."""
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
    fixed = default_inducing_points(x[:20], 128)  # 20 inputs and 108 Sobol points: too few for length scale 0.1
    model = OnlineGPModel(x[:20], y[:20], fixed, covar_module=kernel, likelihood=likelihood, fit_maxiter=0)  # exact on its 20 points
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
        modules = dict(covar_module=model.covar_module, likelihood=model.likelihood)
        OnlineGPModel(x[:20], y[:20], **modules, fit_maxiter=0).condition_on_observations(x[20:], y[20:])


def test_select_inducing_points_picks_what_linear_operators_pivoted_cholesky_picks():
    """The points are the first pivots of linear_operator's pivoted Cholesky of the dense kernel matrix, in that order;
    with more points asked than the candidates add variance, fewer (no duplicate)."""
    from botorch.models.utils.gpytorch_modules import get_covar_module_with_dim_scaled_prior
    from linear_operator.functions import pivoted_cholesky

    from gpytorch_hippo.botorch.inducing import select_inducing_points

    x, _ = data(40, seed=4)
    kernel = get_covar_module_with_dim_scaled_prior(ard_num_dims=2).to(DT)
    kernel.lengthscale = torch.tensor([[0.2, 0.5]], dtype=DT)
    with torch.no_grad():
        _, pivots = pivoted_cholesky(kernel(x).to_dense(), rank=12, error_tol=1e-10, return_pivots=True)
    torch.testing.assert_close(select_inducing_points(kernel, x, 12), x[pivots[:12]], rtol=0, atol=0)
    duplicated = torch.cat([x[:5], x[:5]])
    chosen = select_inducing_points(kernel, duplicated, 10)
    assert chosen.shape == (5, 2) and torch.unique(chosen, dim=0).shape == (5, 2)


@pytest.mark.filterwarnings("ignore::gpytorch_hippo.botorch.InducingApproximationWarning")
def test_streaming_updates_reselect_the_default_points_and_equal_osgpr_with_them():
    """A BoTorch loop conditions the default model batch by batch: the inducing points are chosen anew from the old
    points and the new batch (pivoted Cholesky), the update moves q(u) to them, and the posterior equals OnlineSGPR
    driven by hand with the same points (they used to stay at the first batch and a Sobol design); with as many points
    as data it is the exact GP of all of it (SingleTaskGP with the same hyperparameters); fantasies keep the points."""
    import copy

    from gpytorch_hippo import InducingPoints, OnlineSGPR
    from gpytorch_hippo.botorch.inducing import select_inducing_points

    x, y = data(36, seed=5)
    model = OnlineGPModel(x[:12], y[:12], num_inducing=16, fit_maxiter=0, outcome_transform=None)
    kernel, likelihood, mean = (copy.deepcopy(getattr(model, name)) for name in ("covar_module", "likelihood", "mean_module"))
    twin = OnlineSGPR(InducingPoints(x[:12], learn=False), kernel, likelihood, mean)
    twin.update(x[:12], y[:12, 0])
    for start in range(12, 36, 8):
        model = model.condition_on_observations(x[start : start + 8], y[start : start + 8])
        candidates = torch.cat([twin.inducing_variables.points, x[start : start + 8]])
        twin.inducing_variables = InducingPoints(select_inducing_points(kernel, candidates, 16), learn=False)
        twin.update(x[start : start + 8], y[start : start + 8, 0])
        torch.testing.assert_close(model.inducing_variables.points, twin.inducing_variables.points, rtol=0, atol=0)
    test = torch.rand(9, 2, generator=torch.Generator().manual_seed(6), dtype=DT)
    torch.testing.assert_close(model.posterior(test).mean[..., 0], twin(test).mean, rtol=0, atol=1e-10)
    torch.testing.assert_close(model.posterior(test).variance[..., 0], twin(test).variance, rtol=0, atol=1e-10)
    exact = OnlineGPModel(x[:12], y[:12], num_inducing=36, fit_maxiter=0, outcome_transform=None)
    for start in range(12, 36, 8):
        exact = exact.condition_on_observations(x[start : start + 8], y[start : start + 8])
    gp = same_hyperparameters(SingleTaskGP(x, y, outcome_transform=None), exact)
    # to the points' jitter (GPyTorch's variational jitter) on targets near 5
    torch.testing.assert_close(exact.posterior(test).mean, gp.posterior(test).mean, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(exact.posterior(test).variance, gp.posterior(test).variance, rtol=0, atol=1e-4)
    fantasy = model.fantasize(test[:2].requires_grad_(True), sampler=_sampler())
    torch.testing.assert_close(fantasy.inducing_variables.points, model.inducing_variables.points, rtol=0, atol=0)


def _sampler():
    from botorch.sampling import SobolQMCNormalSampler

    return SobolQMCNormalSampler(sample_shape=torch.Size([2]), seed=0)
