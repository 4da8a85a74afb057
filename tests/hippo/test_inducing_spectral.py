"""Frequency-domain pieces of the HiPPO covariances (gpytorch_hippo.inducing.spectral): spherical Bessel
functions, Gauss-Legendre rules, the RBF spectral density and the closed-form HiPPO transforms behind the
spectral backend.

References: SciPy's spherical Bessel functions, NumPy's Gauss-Legendre rule, SciPy's adaptive quadrature of the
spectral density against GPyTorch's kernel, and the quadrature backend (exact in time, tested against adaptive
quadrature in test_inducing_hippo_variables.py).
"""

import math

import gpytorch
import numpy as np
import pytest
import scipy.integrate
import scipy.special
import torch
from test_inducing_hippo_backends import DT, pair, rel, scaled_rbf

from gpytorch_hippo.inducing.spectral import gauss_legendre, rbf_spectral_density, spherical_jn


def test_spherical_bessel_matches_scipy_far_above_and_below_the_argument():
    x = torch.cat([torch.tensor([0.0, 1e-8, 1e-3]), torch.linspace(0.01, 400, 997, dtype=DT)])
    M = 160  # orders well above (downward ratios) and below (upward recurrence) the argument
    ours = spherical_jn(M, x)
    ref = np.stack([scipy.special.spherical_jn(n, x.numpy()) for n in range(M)], -1)
    # absolute error relative to the largest value of each order (|j_n| <= 1)
    assert np.abs(ours.numpy() - ref).max() < 1e-13
    tiny = (np.abs(ref) < 1e-250) & (ref != 0)
    assert (ours.numpy()[tiny] == 0).all()  # flushed, not subnormal


def test_gauss_legendre_matches_numpy():
    for n in (2, 7, 64, 300):
        z, w = gauss_legendre(n)
        z_ref, w_ref = np.polynomial.legendre.leggauss(n)
        assert np.abs(z.numpy() - z_ref).max() < 1e-14
        assert np.abs(w.numpy() - w_ref).max() < 1e-13
    with pytest.raises(ValueError, match="n must be"):
        gauss_legendre(1)


@pytest.mark.parametrize("measure, t, theta", [("legs", 8.0, 3.0), ("legt", 8.0, 3.0), ("fout", 8.0, 3.0), ("lagt", 100.0, 1.0)])
def test_spectral_equals_quadrature_for_every_measure(measure, t, theta):
    kernel = scaled_rbf(lengthscale=1.0 if measure == "lagt" else 0.5)  # LagT needs t >= 80 theta: fewer quadrature panels
    spectral, quadrature = pair(measure, t, theta)
    assert spectral.backend_for(kernel).name == "spectral"
    assert rel(spectral.Kuu(kernel).to_dense(), quadrature.Kuu(kernel).to_dense()) < 1e-12
    x = torch.linspace(-2.0, t + 3.0, 41, dtype=DT)  # inside and outside the support (wider frequency band)
    assert rel(spectral.Kuf(kernel, x), quadrature.Kuf(kernel, x)) < 1e-12
    # across an advance: different supports, the cross-covariance of the online update
    later_s, later_q = pair(measure, t, theta)
    later_s.advance(t + 0.7)
    later_q.advance(t + 0.7)
    scale = quadrature.Kuu(kernel).to_dense().abs().max()
    assert ((spectral.Kuu_cross(later_s, kernel) - quadrature.Kuu_cross(later_q, kernel)).abs().max() / scale) < 1e-12


def test_spectral_is_exact_on_long_streams_and_large_m():
    # t / lengthscale = 128, M = 150: the regime where quadrature costs O((t/l)^2)
    kernel = scaled_rbf(lengthscale=1.0)
    spectral, quadrature = pair("legs", 128.0, M=150)
    K_s, K_q = spectral.Kuu(kernel).to_dense(), quadrature.Kuu(kernel).to_dense()
    assert rel(K_s, K_q) < 1e-10
    x = torch.linspace(0, 128, 50, dtype=DT)
    assert rel(spectral.Kuf(kernel, x), quadrature.Kuf(kernel, x)) < 1e-10


def test_the_rbf_spectral_density_integrates_to_gpytorchs_kernel():
    # k(r) = int S(w) e^{iwr} dw over the real line (S even: twice the integral of S(w) cos(wr) over w >= 0)
    kernel = scaled_rbf(lengthscale=0.7, outputscale=1.3)
    for r in (0.0, 0.3, 1.1, 2.5):
        integral, _ = scipy.integrate.quad(
            lambda w: rbf_spectral_density(kernel, torch.tensor(w, dtype=DT)).item() * math.cos(w * r), 0, np.inf, epsabs=1e-13
        )
        reference = kernel(torch.zeros(1, 1, dtype=DT), torch.full((1, 1), r, dtype=DT)).to_dense().item()
        assert 2 * integral == pytest.approx(reference, rel=1e-10, abs=1e-13)
    with pytest.raises(TypeError, match="RBF"):
        rbf_spectral_density(gpytorch.kernels.MaternKernel(nu=1.5).double(), torch.zeros(3, dtype=DT))
