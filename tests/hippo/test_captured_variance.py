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
    with pytest.warns(RuntimeWarning, match="keep only"):
        model.update(x, y)
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
    middle = per_point[4 * tenth: 6 * tenth].mean()
    assert ends > middle + 0.1, (ends, middle)
    torch.testing.assert_close(legs.captured_variance(kernel, grid), per_point.mean())


def test_the_warning_names_the_worst_point_of_the_stream():
    kernel = rbf(0.5)
    x = torch.linspace(0, 30, 120, dtype=DT).unsqueeze(-1)
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(DT)
    model = OnlineSGPR(HiPPOInducingVariables(10, "legs", t=30.0), kernel, likelihood)
    with pytest.warns(RuntimeWarning, match=r"at worst, at x = ") as record:
        model.update(x, torch.sin(x[:, 0]))
    worst_x = float(str(record[0].message).split("at x = ")[1].split(";")[0])
    assert 5.0 < worst_x < 25.0  # mid-stream, not at either end
