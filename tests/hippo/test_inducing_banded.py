"""The banded time-domain backend (Matérn kernels, ``method="spectral"``) against adaptive quadrature.

References are scipy's adaptive Gauss-Kronrod ``quad_vec`` (independent of the panel rules), with
breakpoints where the integrand has a kink: tolerances 1e-12 relative to the largest entry, set by
the references' own accuracy (``epsabs=1e-14`` on entries of order 0.1-1).
"""

import math

import gpytorch
import numpy as np
import pytest
import torch
from scipy.integrate import quad_vec

from gpytorch_hippo import HiPPOInducingVariables
from gpytorch_hippo.inducing.banded import _span

DT = torch.float64


def matern(nu, lengthscale=1.3, outputscale=1.7, dtype=DT):
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=nu)).to(dtype)
    kernel.base_kernel.lengthscale = lengthscale
    kernel.outputscale = outputscale
    return kernel


def phi(ivars, s):
    s = torch.as_tensor(np.atleast_1d(s), dtype=DT)
    return (ivars.memory.basis(s, ivars.t) * ivars.memory.measure_density(s, ivars.t)[:, None])[0].numpy()


def kernel_value(kernel, r):
    """Matérn k(r) as in Rasmussen & Williams eq. (4.17) for half-integer ν (checked against GPyTorch below)."""
    nu, ell = kernel.base_kernel.nu, float(kernel.base_kernel.lengthscale.detach())
    x = math.sqrt(2 * nu) * abs(r) / ell
    polynomial = {0.5: 1.0, 1.5: 1 + x, 2.5: 1 + x + x * x / 3}[nu]
    return float(kernel.outputscale.detach()) * polynomial * math.exp(-x)


@pytest.mark.parametrize("nu", [0.5, 1.5, 2.5])
def test_reference_kernel_is_gpytorchs(nu):
    kernel = matern(nu)
    r = torch.tensor([0.0, 0.1, 1.0, 7.0], dtype=DT)
    with torch.no_grad():
        expected = kernel(torch.zeros(1, 1, dtype=DT), r[:, None]).to_dense()[0]
    assert [kernel_value(kernel, float(v)) for v in r] == pytest.approx(expected.tolist(), rel=1e-12)


def reference_kuf(ivars, kernel, x):
    """``∫ φ(s) k(x - s) ds`` over the support, adaptively, split at ``x``."""
    lower, upper = _span(ivars)
    points = [x] if lower < x < upper else None
    value, _ = quad_vec(
        lambda s: phi(ivars, s) * kernel_value(kernel, x - s), lower, upper, points=points, epsabs=1e-14, epsrel=1e-13, limit=2000
    )
    return value


def rel(a, b):
    return float(((a - b).abs().max() / b.abs().max()).detach())


@pytest.mark.parametrize(
    "measure, theta, M, nu",
    [
        ("legs", 1.0, 8, 0.5),
        ("legs", 1.0, 8, 1.5),
        ("legs", 1.0, 8, 2.5),
        ("legt", 6.0, 8, 0.5),
        ("lagt", 0.7, 8, 0.5),
        ("fout", 6.0, 9, 0.5),
    ],
)
def test_kuf_matches_adaptive_quadrature(measure, theta, M, nu):
    ivars = HiPPOInducingVariables(M, measure, t=10.0, theta=theta)
    kernel = matern(nu)
    assert ivars.backend_for(kernel).name == "banded"
    times = [-3.0, 0.0, 0.3, 4.1, 9.99, 10.0, 12.5]  # before, at the start, inside, at t, after
    Kuf = ivars.Kuf(kernel, torch.tensor(times, dtype=DT)[:, None]).detach()
    reference = torch.tensor(np.stack([reference_kuf(ivars, kernel, x) for x in times], axis=1))
    assert rel(Kuf, reference) < 1e-12


@pytest.mark.parametrize("nu", [0.5, 2.5])
def test_kuu_and_cross_are_outer_integrals_of_kuf(nu):
    """``Kuu = ∫ φ(s) Kuf(s)ᵀ ds``: the fast node path (shifted panel blocks, interpolated own panel)
    against an adaptive outer integral of the point-wise ``Kuf`` checked above; the same for the
    cross-covariance of an online update, split where the newer support ends."""
    kernel = matern(nu, lengthscale=0.8)
    old = HiPPOInducingVariables(6, "legt", t=7.0, theta=5.0)
    new = HiPPOInducingVariables(6, "legt", t=9.5, theta=5.0)
    backend = old.backend_for(kernel)

    def outer(a, b):
        lower, upper = _span(a)
        panels_b = backend._panels(b, kernel)
        inside = [e for e in _span(b) if lower < e < upper]

        def integrand(s):
            kuf = backend._kuf_at(panels_b, kernel, torch.tensor([s], dtype=DT), DT).detach()[0].numpy()
            return phi(a, s)[:, None] * kuf[None, :]

        return torch.tensor(quad_vec(integrand, lower, upper, points=inside or None, epsabs=1e-14, epsrel=1e-13)[0])

    with torch.no_grad():
        Kuu = backend.cross(old, old, kernel)
        cross = backend.cross(old, new, kernel)
    assert rel(Kuu, outer(old, old)) < 1e-12
    assert rel(cross, outer(old, new)) < 1e-12
    # and through the public interface, jitter excluded: cov(u_new, u_old) is the transpose
    torch.testing.assert_close(new.Kuu_cross(old, kernel).detach(), cross.mT, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("nu", [0.5, 1.5, 2.5])
def test_long_stream_kuu_converged_and_psd(nu):
    """t/ℓ = 300, M = 100: halving the panels and adding nodes changes nothing above round-off."""
    from gpytorch_hippo.inducing import banded

    ivars = HiPPOInducingVariables(100, "legs", t=300.0)
    kernel = matern(nu, lengthscale=1.0)
    with torch.no_grad():
        Kuu = ivars.backend_for(kernel).cross(ivars, ivars, kernel)
        width, base = banded.PANEL_WIDTH, banded.BASE_NODES
        try:
            banded.PANEL_WIDTH, banded.BASE_NODES = width / 2, base + 12
            refined = ivars.backend_for(kernel).cross(ivars, ivars, kernel)
        finally:
            banded.PANEL_WIDTH, banded.BASE_NODES = width, base
    assert rel(Kuu, refined) < 1e-12
    assert torch.linalg.eigvalsh(Kuu)[0] > -1e-13 * Kuu.diagonal().max()


def test_gradients_match_finite_differences():
    kernel = matern(1.5, lengthscale=0.9)
    ivars = HiPPOInducingVariables(7, "legs", t=12.0, jitter=0.0)
    # two panels of width 6 (8 ℓ rounded to fit [0, 12]): 6.0 sits on the panel edge and 12.0 at t,
    # where a split of the own panel would be degenerate (this test caught a lost x-derivative there)
    x = torch.tensor([1.1, 6.0, 11.7, 12.0, 13.0], dtype=DT)[:, None].requires_grad_(True)
    weights = torch.randn(7, 7, generator=torch.Generator().manual_seed(0), dtype=DT)

    def loss():
        return (ivars.Kuu(kernel).to_dense() * weights).sum() + ivars.Kuf(kernel, x).sin().sum()

    parameters = [kernel.raw_outputscale, kernel.base_kernel.raw_lengthscale, x]
    grads = torch.autograd.grad(loss(), parameters)
    for parameter, grad in zip(parameters, grads):
        with torch.no_grad():
            flat = parameter.view(-1)
            for i in range(flat.numel()):
                h = 1e-6 * max(1.0, abs(float(flat[i])))
                flat[i] += h
                up = loss()
                flat[i] -= 2 * h
                down = loss()
                flat[i] += h
                assert float(grad.view(-1)[i]) == pytest.approx(float((up - down) / (2 * h)), rel=1e-6, abs=1e-8)


def test_float32_close_to_float64():
    kernel64 = matern(2.5, lengthscale=0.5)
    ivars = HiPPOInducingVariables(20, "legs", t=40.0, jitter=0.0)
    x = torch.linspace(0.0, 45.0, 50, dtype=DT)[:, None]
    K64, F64 = ivars.Kuu(kernel64).to_dense(), ivars.Kuf(kernel64, x)
    kernel32 = matern(2.5, lengthscale=0.5, dtype=torch.float32)
    K32, F32 = ivars.Kuu(kernel32).to_dense(), ivars.Kuf(kernel32, x.float())
    assert K32.dtype == F32.dtype == torch.float32
    # float32 round-off on entries summed over ~10^3 nodes, relative to the largest entry
    assert rel(K32.double(), K64) < 1e-5 and rel(F32.double(), F64) < 1e-5
