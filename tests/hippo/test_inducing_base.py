"""The inducing-variable interface (gpytorch_hippo.inducing.base): the captured variance on every
inducing-variable class and the jitter policy.

References: GPyTorch's exact GP conditioned on the points, GPyTorch's own jitter setting, and the closed form of
the first LegS variance.
"""

import math

import gpytorch
import pytest
import torch
from test_inducing_hippo_backends import scaled_rbf
from test_monitor import DT, rbf

from gpytorch_hippo import HiPPOInducingVariables, InducingPoints
from gpytorch_hippo.inducing import FourierInducingVariables


def test_point_jitter_is_gpytorchs_absolute_jitter_in_each_dtype():
    # points add what GPyTorch's VariationalStrategy adds, whatever the kernel's scale (not a relative jitter)
    for dtype in (torch.float32, torch.float64):
        kernel = rbf(0.3).to(dtype)
        z = torch.linspace(0, 1, 6, dtype=dtype).unsqueeze(-1)
        added = InducingPoints(z).Kuu(kernel).to_dense() - kernel(z).to_dense()
        expected = gpytorch.settings.variational_cholesky_jitter.value(dtype) * torch.eye(6, dtype=dtype)
        torch.testing.assert_close(
            added, expected, rtol=1e-3 if dtype == torch.float32 else 1e-9, atol=5e-7 if dtype == torch.float32 else 1e-15
        )


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


def test_jitter_is_relative_to_the_scale_of_kuu():
    # LegS Var(u_0) ~ sigma^2 sqrt(2 pi) l / t shrinks with t: an absolute jitter would dominate it
    kernel = scaled_rbf(lengthscale=1.0, outputscale=1.0)
    for t in (20.0, 200.0):
        ivars = HiPPOInducingVariables(30, "legs", t=t)
        exact = HiPPOInducingVariables(30, "legs", t=t, jitter=0.0).Kuu(kernel).to_dense()
        added = (ivars.Kuu(kernel).to_dense() - exact).diagonal()
        expected = 1e-6 * exact.diagonal().mean()
        torch.testing.assert_close(added, expected.expand(30), rtol=1e-9, atol=0)
        assert exact[0, 0].item() == pytest.approx(math.sqrt(2 * math.pi) / t, rel=0.05)
    absolute = HiPPOInducingVariables(30, "legs", t=200.0, jitter=1e-3)  # an explicit jitter is absolute
    added = (absolute.Kuu(kernel).to_dense() - exact).diagonal()
    torch.testing.assert_close(added, torch.full((30,), 1e-3, dtype=DT), rtol=1e-9, atol=0)
