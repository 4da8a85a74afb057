"""Pathwise posterior samples of OnlineGPModel: registered with BoTorch's dispatchers, their mean and
covariance equal the model's posterior (Monte Carlo), and the acquisitions built on them run."""

import pytest
import torch
from botorch.acquisition.joint_entropy_search import qJointEntropySearch
from botorch.acquisition.utils import get_optimal_samples
from botorch.models.transforms import Normalize, Standardize
from botorch.sampling import SobolQMCNormalSampler
from botorch.sampling.pathwise import draw_matheron_paths, get_matheron_path_model

from gpytorch_hippo import HiPPOInducingVariables, InducingPoints
from gpytorch_hippo.botorch import OnlineGPModel

DOUBLE = torch.float64

# these tests check the online model against OnlineSGPR and BoTorch's own algebra with few inducing points, to be fast:
# where those points do not reach new inputs the model says so (test_botorch_dropin.py checks the warning)
pytestmark = pytest.mark.filterwarnings("ignore::gpytorch_hippo.botorch.InducingApproximationWarning")


def model_2d(**kwargs):
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(12, 2, generator=generator, dtype=DOUBLE)
    y = torch.sin(4 * x[:, :1]) + torch.cos(3 * x[:, 1:]) + 0.05 * torch.randn(12, 1, generator=generator, dtype=DOUBLE)
    Z = torch.rand(10, 2, generator=generator, dtype=DOUBLE)
    model = OnlineGPModel(x, y, InducingPoints(Z, learn=False), fit_maxiter=20, **{"outcome_transform": None, **kwargs})
    return model.condition_on_observations(
        torch.rand(4, 2, generator=generator, dtype=DOUBLE), torch.rand(4, 1, generator=generator, dtype=DOUBLE)
    )


@pytest.mark.parametrize("transforms", [False, True])
def test_paths_have_the_posterior_mean_and_covariance(transforms):
    """4,096 paths at 6 points: mean within 4 Monte-Carlo standard errors, covariance within 0.1 of the
    largest variance (the random Fourier features add their own error)."""
    torch.manual_seed(1)
    kwargs = {"input_transform": Normalize(2), "outcome_transform": Standardize(1)} if transforms else {}
    model = model_2d(**kwargs)
    X = torch.rand(6, 2, generator=torch.Generator().manual_seed(2), dtype=DOUBLE)
    paths = draw_matheron_paths(model, sample_shape=torch.Size([4096]))
    with torch.no_grad():
        samples = paths(X)  # (4096, 6)
        posterior = model.posterior(X)
    mean, covar = posterior.mean[..., 0], posterior.distribution.covariance_matrix
    if transforms:  # the posterior is in the outcome space; its covariance from the MVN is too
        covar = posterior.mvn.covariance_matrix
    error = samples.std(0) / 4096**0.5
    assert ((samples.mean(0) - mean).abs() < 4 * error + 1e-3).all()
    assert (torch.cov(samples.T) - covar).abs().max() < 0.1 * covar.diagonal().max()


def test_optimal_samples_and_joint_entropy_search_run_on_the_online_model():
    torch.manual_seed(3)
    model = model_2d()
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=DOUBLE)
    optimal_inputs, optimal_outputs = get_optimal_samples(model, bounds=bounds, num_optima=4)
    assert optimal_inputs.shape == (4, 2) and optimal_outputs.shape == (4, 1)
    thompson = get_matheron_path_model(model)
    with torch.no_grad():
        path_values = thompson(optimal_inputs)
    assert torch.isfinite(path_values).all()
    jes = qJointEntropySearch(model, optimal_inputs=optimal_inputs, optimal_outputs=optimal_outputs)
    values = jes(torch.rand(5, 1, 2, dtype=DOUBLE))
    assert values.shape == (5,) and torch.isfinite(values).all()


def mc_moments(model, X, num_paths=8192):
    paths = draw_matheron_paths(model, sample_shape=torch.Size([num_paths]))
    with torch.no_grad():
        samples = paths(X)  # (num_paths, n)
    return paths, samples.mean(0), samples.std(0) / num_paths**0.5, torch.cov(samples.T)


@pytest.mark.parametrize("method", ["auto", "lyapunov", "quadrature"])
def test_hippo_time_paths_have_the_posterior_mean_and_covariance(method):
    """Time inputs (OHSGPR on a stream): the prior paths' HiPPO projections are the closed-form transforms
    of their Fourier features, so 8,192 paths give the posterior's mean (within 4.5 standard errors) and
    covariance (within 5 % of the largest variance: the features' error; a sign error in the transforms'
    imaginary part gives errors 50x the variance)."""
    torch.manual_seed(4)
    generator = torch.Generator().manual_seed(5)
    t = torch.linspace(0, 3, 40, dtype=DOUBLE).unsqueeze(-1)
    y = torch.sin(3 * t) + 0.1 * torch.randn(40, 1, generator=generator, dtype=DOUBLE)
    model = OnlineGPModel(t[:20], y[:20], HiPPOInducingVariables(12, "legs", t=1.5, method=method), fit_maxiter=20, outcome_transform=None)
    model = model.observe(t[20:], y[20:])  # the variables advance to t = 3
    X = torch.linspace(0, 3.2, 7, dtype=DOUBLE).unsqueeze(-1)  # inside and beyond the stream
    _, mean, error, covariance = mc_moments(model, X)
    with torch.no_grad():
        posterior = model.posterior(X)
    expected = posterior.distribution.covariance_matrix
    assert ((mean - posterior.mean[..., 0]).abs() < 4.5 * error).all()
    assert (covariance - expected).abs().max() < 0.05 * expected.diagonal().max()


def test_hippo_path_variables_paths_equal_the_posterior_of_their_feature_model():
    """Several input dimensions: the variables are projections of their own random features ψ along the
    input path, and the prior paths use those features; so the paths' covariance is the posterior's with
    the prior term k(X, X) replaced by ψ(X)ψ(X)ᵀ, to Monte-Carlo error (1 % of the variance)."""
    torch.manual_seed(6)
    generator = torch.Generator().manual_seed(7)
    x = torch.rand(30, 2, generator=generator, dtype=DOUBLE)
    y = torch.sin(4 * x[:, :1]) + torch.cos(3 * x[:, 1:])
    model = OnlineGPModel(
        x[:15],
        y[:15],
        HiPPOInducingVariables(10, input_dim=2, num_rff=1000, seed=1),
        input_transform=Normalize(2),
        fit_maxiter=20,
        outcome_transform=None,
    )
    model = model.condition_on_observations(x[15:], y[15:])
    X = torch.rand(6, 2, generator=generator, dtype=DOUBLE)
    paths, mean, error, covariance = mc_moments(model, X)
    with torch.no_grad():
        posterior = model.posterior(X)
        x_model = model.transform_inputs(X)
        features = paths.paths["prior_paths"].feature_map(x_model)
        expected = posterior.distribution.covariance_matrix - model.covar_module(x_model).to_dense() + features @ features.mT
    assert ((mean - posterior.mean[..., 0]).abs() < 4.5 * error).all()
    assert (covariance - expected).abs().max() < 0.02 * expected.diagonal().max()
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=DOUBLE)
    optimal_inputs, optimal_outputs = get_optimal_samples(model, bounds=bounds, num_optima=3)
    jes = qJointEntropySearch(model, optimal_inputs=optimal_inputs, optimal_outputs=optimal_outputs)
    assert torch.isfinite(jes(torch.rand(4, 1, 2, dtype=DOUBLE))).all()


def test_what_paths_do_not_cover_raises_named_errors():
    t = torch.linspace(0.5, 1, 20, dtype=DOUBLE).unsqueeze(-1)
    clipped = OnlineGPModel(t, torch.sin(6 * t), HiPPOInducingVariables(8, "legs", t=1.0, start=0.5), fit_maxiter=0, outcome_transform=None)
    with pytest.raises(NotImplementedError, match="closed form"):
        draw_matheron_paths(clipped, sample_shape=torch.Size([2]))
    x = torch.rand(10, 2, dtype=DOUBLE)
    fantasies = model_2d().fantasize(x[:1], sampler=SobolQMCNormalSampler(torch.Size([2])))
    with pytest.raises(NotImplementedError, match="batched"):
        draw_matheron_paths(fantasies, sample_shape=torch.Size([2]))


def test_two_output_paths_have_each_outputs_posterior_and_give_optimal_samples():
    """A 2-output model (default ``Standardize(m=2)``): 4,096 stacked paths, ``(4096, 2, 6)`` as BoTorch's
    multi-output models return them, have each output's posterior mean and covariance in the raw outcome
    space; ``get_optimal_samples`` with a scalarisation runs on them."""
    from botorch.acquisition.objective import ScalarizedPosteriorTransform

    generator = torch.Generator().manual_seed(0)
    x = torch.rand(15, 2, generator=generator, dtype=DOUBLE)
    noise = 0.05 * torch.randn(15, 2, generator=generator, dtype=DOUBLE)
    y = torch.cat([torch.sin(4 * x[:, :1]), 3 + 2 * torch.cos(3 * x[:, 1:])], -1) + noise
    model = OnlineGPModel(x, y, InducingPoints(torch.rand(12, 2, generator=generator, dtype=DOUBLE), learn=False), fit_maxiter=20)
    torch.manual_seed(3)
    X = torch.rand(6, 2, generator=torch.Generator().manual_seed(2), dtype=DOUBLE)
    paths = draw_matheron_paths(model, sample_shape=torch.Size([4096]))
    with torch.no_grad():
        samples = paths(X)
        posterior = model.posterior(X)
    assert samples.shape == (4096, 2, 6)
    for j in range(2):
        mean = posterior.mean[..., j]
        covar = model.outputs[j].posterior(model.input_transform(X) if hasattr(model, "input_transform") else X).mvn.covariance_matrix
        covar = covar * model.outcome_transform.stdvs[..., j] ** 2
        error = samples[:, j].std(0) / 4096**0.5
        assert ((samples[:, j].mean(0) - mean).abs() < 4 * error + 1e-3).all()
        assert (torch.cov(samples[:, j].T) - covar).abs().max() < 0.1 * covar.diagonal().max()
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=DOUBLE)
    weights = ScalarizedPosteriorTransform(torch.tensor([1.0, 0.5], dtype=DOUBLE))
    optimal_inputs, optimal_outputs = get_optimal_samples(model, bounds=bounds, num_optima=3, posterior_transform=weights)
    assert optimal_inputs.shape == (3, 2) and ((optimal_inputs >= 0) & (optimal_inputs <= 1)).all()
