"""The Nyström residual k(x, x) - Kxu Kuu^-1 Kux (gpytorch_hippo.nystrom): its value, its tolerance and the
warning an inconsistent Kuu/Kuf pair raises through OnlineSGPR.

References: the residual computed densely here with a linear solve; the dtype's round-off written out.
"""

import warnings

import gpytorch
import pytest
import torch
from test_inducing_hippo_backends import DT, scaled_rbf

from gpytorch_hippo import HiPPOInducingVariables, InconsistentCovarianceWarning, OnlineSGPR
from gpytorch_hippo.nystrom import nystrom_residual


def test_the_residual_is_the_conditional_variance_computed_densely():
    kernel = scaled_rbf(lengthscale=0.8, outputscale=1.5)
    z = torch.linspace(0, 4, 6, dtype=DT).unsqueeze(-1)
    x = torch.linspace(-1, 5, 13, dtype=DT).unsqueeze(-1)
    Kuu, Kux, kxx = kernel(z).to_dense() + 1e-8 * torch.eye(6, dtype=DT), kernel(z, x).to_dense(), kernel(x, diag=True)
    reference = kxx - (Kux * torch.linalg.solve(Kuu, Kux)).sum(-2)
    W = torch.linalg.solve_triangular(torch.linalg.cholesky(Kuu), Kux, upper=False)
    residual = nystrom_residual(kxx, W)
    torch.testing.assert_close(residual, reference, rtol=0, atol=1e-12)
    assert (residual > 0).all() and residual.shape == (13,)
    # batched: each batch its own residual
    torch.testing.assert_close(nystrom_residual(kxx.expand(2, 13), W.expand(2, 6, 13)), reference.expand(2, 13))


def test_round_off_below_the_tolerance_passes_unclipped_and_more_warns():
    kxx = torch.ones(3, dtype=DT)
    W = torch.zeros(1, 3, dtype=DT)
    W[0, 1] = (1 + 1e-5) ** 0.5  # residual -1e-5 at the second input
    expected = torch.tensor([1.0, -1e-5, 1.0], dtype=DT)
    # float32 covariances carry sqrt(eps32) ~ 3.5e-4 of round-off: tolerated, and the value is not clipped
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(nystrom_residual(kxx, W, computed_in=torch.float32), expected)
    # float64 tolerates sqrt(eps64) ~ 1.5e-8 only
    with pytest.warns(InconsistentCovarianceWarning, match="kuf='rff'"):
        torch.testing.assert_close(nystrom_residual(kxx, W), expected)
    assert nystrom_residual(torch.ones(0, dtype=DT), torch.zeros(2, 0, dtype=DT)).shape == (0,)


def test_negative_nystrom_residual_warns_and_consistent_defaults_do_not():
    kernel = scaled_rbf(lengthscale=0.2, outputscale=1.0)
    x = torch.linspace(0, 6, 100, dtype=DT)
    y = torch.sin(3 * x)
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(DT)
    inconsistent = HiPPOInducingVariables(40, "legs", t=6.0, method="recurrence", dt=0.02, num_rff=100, kuf="ode", jitter=1e-8)
    with pytest.warns(InconsistentCovarianceWarning, match="Nyström residual"):
        OnlineSGPR(inconsistent, kernel, likelihood).update(x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for ivars in (
            HiPPOInducingVariables(40, "legs", t=6.0, method="recurrence", dt=0.02, num_rff=100),
            HiPPOInducingVariables(40, "legs", t=6.0),
        ):
            model = OnlineSGPR(ivars, kernel, likelihood)
            model.update(x, y)
            model(x).variance
