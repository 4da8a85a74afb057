"""Pathwise posterior samples of OnlineGPModel: registered with BoTorch's dispatchers, their mean and
covariance equal the model's posterior (Monte Carlo), and the acquisitions built on them run."""

import pytest
import torch
from botorch.acquisition.joint_entropy_search import qJointEntropySearch
from botorch.acquisition.utils import get_optimal_samples
from botorch.models.transforms import Normalize, Standardize
from botorch.sampling.pathwise import draw_matheron_paths, get_matheron_path_model

from gpytorch_hippo import HiPPOInducingVariables, InducingPoints
from gpytorch_hippo.botorch import OnlineGPModel

DOUBLE = torch.float64


def model_2d(**kwargs):
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(12, 2, generator=generator, dtype=DOUBLE)
    y = torch.sin(4 * x[:, :1]) + torch.cos(3 * x[:, 1:]) + 0.05 * torch.randn(12, 1, generator=generator, dtype=DOUBLE)
    Z = torch.rand(10, 2, generator=generator, dtype=DOUBLE)
    model = OnlineGPModel(x, y, InducingPoints(Z, learn=False), fit_maxiter=20, **kwargs)
    return model.condition_on_observations(torch.rand(4, 2, generator=generator, dtype=DOUBLE),
                                           torch.rand(4, 1, generator=generator, dtype=DOUBLE))


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


def test_hippo_variables_name_what_pathwise_samples_need():
    t = torch.linspace(0, 1, 20, dtype=DOUBLE).unsqueeze(-1)
    model = OnlineGPModel(t, torch.sin(6 * t), HiPPOInducingVariables(8, "legs", t=1.0), fit_maxiter=0)
    with pytest.raises(NotImplementedError, match="InducingPoints"):
        draw_matheron_paths(model, sample_shape=torch.Size([2]))
