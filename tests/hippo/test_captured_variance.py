"""captured_variance on every inducing-variable class, and OnlineSGPR's warning when it is low."""
import warnings

import gpytorch
import pytest
import torch

from gpytorch_hippo import HiPPOInducingVariables, InducingPoints, OnlineSGPR
from gpytorch_hippo.inducing import FourierInducingVariables

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
    expected = 1 - (posterior_var / kernel(grid, diag=True)).mean()
    captured = InducingPoints(z, jitter=jitter).captured_variance(kernel, grid)
    torch.testing.assert_close(captured, expected, rtol=1e-8, atol=1e-10)


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
    with pytest.warns(RuntimeWarning, match="keep only"):
        model.update(x, y)
    quiet = OnlineSGPR(HiPPOInducingVariables(10, "legs", t=30.0), kernel, likelihood, captured_variance_warning=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        quiet.update(x, y)
    with pytest.raises(ValueError, match="captured_variance_warning"):
        OnlineSGPR(HiPPOInducingVariables(10, "legs", t=30.0), kernel, likelihood, captured_variance_warning=1.5)
