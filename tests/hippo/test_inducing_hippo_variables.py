"""HiPPO interdomain inducing variables against independent references:
adaptive/fixed high-order quadrature written here with scipy special functions, the
recurrence's convergence as dt -> 0, Monte-Carlo rates of random features, exact path integrals."""

import copy
import math

import gpytorch
import numpy as np
import pytest
import scipy.integrate
import scipy.special
import torch

from gpytorch_hippo.hippo import HiPPO
from gpytorch_hippo.inducing import HiPPOInducingVariables, InducingPoints


@pytest.fixture(autouse=True)
def float64_by_default():
    """float64 for this module only (a module-level switch would leak into other test files)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def rbf(lengthscale=0.4, outputscale=1.3):
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())
    kernel.base_kernel.lengthscale = lengthscale
    kernel.outputscale = outputscale
    return kernel


def legs_phi(m, s, t):
    """phi_m^{(t)}(s) = sqrt(2m+1) P_m(2s/t - 1) / t on [0, t] (thesis §2.1.2), written independently."""
    return math.sqrt(2 * m + 1) * scipy.special.eval_legendre(m, 2 * s / t - 1) / t


def test_quadrature_kuf_equals_adaptive_quadrature():
    t, ell, sf2 = 2.0, 0.4, 1.3
    x = torch.tensor([[0.3], [1.1], [2.5]])
    ivars = HiPPOInducingVariables(5, "legs", t=t)
    Kuf = ivars.Kuf(rbf(ell, sf2), x)
    for m in range(5):
        for n in range(3):
            xn = x[n, 0].item()
            ref, _ = scipy.integrate.quad(
                lambda s: sf2 * math.exp(-((xn - s) ** 2) / (2 * ell**2)) * legs_phi(m, s, t),
                0,
                t,
                epsabs=1e-14,
                epsrel=1e-14,
                limit=200,
            )
            assert abs(Kuf[m, n].item() - ref) < 1e-10


def test_quadrature_kuu_equals_high_order_double_quadrature():
    t, ell, sf2, M = 3.0, 0.5, 0.7, 6
    z, w = np.polynomial.legendre.leggauss(600)
    s, ws = t * (z + 1) / 2, w * t / 2
    phi = np.stack([legs_phi(m, s, t) for m in range(M)])  # (M, Q)
    K = sf2 * np.exp(-((s[:, None] - s[None, :]) ** 2) / (2 * ell**2))
    reference = (phi * ws) @ K @ (phi * ws).T
    ivars = HiPPOInducingVariables(M, "legs", t=t, jitter=0.0)
    Kuu = ivars.Kuu(rbf(ell, sf2)).to_dense()
    np.testing.assert_allclose(Kuu.detach().numpy(), reference, rtol=0, atol=1e-10)
    assert torch.linalg.eigvalsh(Kuu).min() > -1e-12


def test_recurrence_kuf_converges_to_quadrature_at_second_order():
    kernel = rbf()
    x = torch.linspace(0, 2.4, 9)[:, None]
    exact = HiPPOInducingVariables(6, "legs", t=2.0).Kuf(kernel, x)
    errors = []
    for dt in (0.02, 0.01, 0.005):
        Kuf = HiPPOInducingVariables(6, "legs", t=2.0, method="recurrence", dt=dt, kuf="ode").Kuf(kernel, x)
        errors.append((Kuf - exact).abs().max().item())
    rates = [math.log2(a / b) for a, b in zip(errors, errors[1:])]
    assert all(abs(r - 2) < 0.2 for r in rates), (errors, rates)


def test_rff_kuu_error_shrinks_like_inverse_sqrt_num_rff():
    kernel = rbf()
    exact = HiPPOInducingVariables(5, "legs", t=2.0, jitter=0.0).Kuu(kernel).to_dense()
    rms = []
    for R in (100, 400, 1600):
        errs = [
            (
                HiPPOInducingVariables(5, "legs", t=2.0, method="recurrence", dt=0.005, num_rff=R, seed=seed, jitter=0.0)
                .Kuu(kernel)
                .to_dense()
                - exact
            )
            .pow(2)
            .mean()
            .item()
            for seed in range(12)
        ]
        rms.append(math.sqrt(sum(errs) / len(errs)))
    ratios = [a / b for a, b in zip(rms, rms[1:])]  # 4x features -> 2x smaller error
    assert all(1.5 < r < 2.7 for r in ratios), (rms, ratios)


@pytest.mark.parametrize("nu", [0.5, 1.5, 2.5])
def test_matern_spectral_samples_reproduce_the_kernel(nu):
    # RFF with the Matern spectral density (Student-t frequencies) reproduce k(r) on average
    kernel = gpytorch.kernels.MaternKernel(nu=nu)
    kernel.lengthscale = 0.7
    ivars = HiPPOInducingVariables(3, "legs", t=1.0, method="recurrence", num_rff=200_000, seed=3)
    r = torch.tensor([[0.0], [0.3], [1.0]])
    features = ivars.backends["recurrence"].features(ivars, kernel, r)  # sqrt(1/R) [cos, sin]
    approx = features @ features[:1].mT
    exact = kernel(r, r[:1]).to_dense()
    assert (approx - exact).abs().max() < 0.01


def test_advance_carries_the_recurrence_state():
    kernel = rbf()
    carried = HiPPOInducingVariables(6, "legs", t=1.0, method="recurrence", dt=0.01, num_rff=300)
    with torch.no_grad():
        carried.Kuu(kernel)
        carried.advance(1.7)
        carried.Kuu(kernel)
        carried.advance(2.5)
        K_carried = carried.Kuu(kernel).to_dense()
    fresh = copy.deepcopy(carried)
    fresh._make_backends()  # drop the carried memory: recompute it from the start of the stream
    with torch.no_grad():
        K_fresh = fresh.Kuu(kernel).to_dense()
    torch.testing.assert_close(K_carried, K_fresh, rtol=1e-10, atol=1e-12)


def test_cross_covariance_between_times_and_with_points():
    kernel = rbf()
    old = HiPPOInducingVariables(5, "legs", t=1.0)
    new = copy.deepcopy(old)
    torch.testing.assert_close(old.Kuu_cross(new, kernel), old.Kuu(kernel).to_dense())
    new.advance(2.0)
    cross = old.Kuu_cross(new, kernel)
    # independent reference: double Gauss-Legendre over [0,1] x [0,2]
    z, w = np.polynomial.legendre.leggauss(300)
    s1, w1 = (z + 1) / 2, w / 2
    s2, w2 = z + 1, w
    K = 1.3 * np.exp(-((s1[:, None] - s2[None, :]) ** 2) / (2 * 0.4**2))
    phi1 = np.stack([legs_phi(m, s1, 1.0) for m in range(5)]) * w1
    phi2 = np.stack([legs_phi(m, s2, 2.0) for m in range(5)]) * w2
    np.testing.assert_allclose(cross.detach().numpy(), phi1 @ K @ phi2.T, atol=1e-10)
    points = InducingPoints(torch.tensor([[0.2], [0.9]]))
    torch.testing.assert_close(new.Kuu_cross(points, kernel), new.Kuf(kernel, points.points))


def test_multidimensional_path_memory_matches_exact_path_integral():
    torch.manual_seed(0)
    kernel = gpytorch.kernels.RBFKernel(ard_num_dims=2)
    kernel.lengthscale = torch.tensor([[0.8, 1.2]])
    path = torch.randn(40, 2) * 0.5
    ivars = HiPPOInducingVariables(6, "legs", input_dim=2, dt=0.05, num_rff=40_000, seed=1)
    ivars.append_path(path[:25])
    ivars.append_path(path[25:], kernel=kernel)  # folds task 1 into the RFF memory, keeps task 2
    # reference: thesis eq. multi_dim_hippo_kfu with the exact kernel along the stored path
    times = 0.05 * torch.arange(1, 41, dtype=torch.float64)
    x_new = torch.randn(5, 2)
    exact_kfu = HiPPO("legs", 6).final_state(kernel(x_new, path).to_dense(), times)
    assert (ivars.Kuf(kernel, x_new).mT - exact_kfu).abs().max() < 0.02
    # appending in two tasks equals one pass over the whole path (state carried, nothing stored)
    single = HiPPOInducingVariables(6, "legs", input_dim=2, dt=0.05, num_rff=40_000, seed=1)
    single.append_path(path)
    torch.testing.assert_close(ivars.Kuu(kernel).to_dense(), single.Kuu(kernel).to_dense(), rtol=1e-9, atol=1e-11)
    assert ivars.path_pending.shape[0] == 15  # only the current task's inputs are kept
    with torch.no_grad():
        kernel.lengthscale = torch.tensor([[0.5, 1.2]])
    with pytest.raises(RuntimeError, match="length scale changed"):
        ivars.Kuu(kernel)


def test_path_step_multiple_uses_every_kth_input():
    kernel = gpytorch.kernels.RBFKernel(ard_num_dims=2)
    path = torch.randn(20, 2)
    strided = HiPPOInducingVariables(4, input_dim=2, dt=0.1, num_rff=500)
    strided.append_path(path, step=2)
    manual = HiPPOInducingVariables(4, input_dim=2, dt=0.2, num_rff=500)
    manual.append_path(path[::2])
    torch.testing.assert_close(strided.Kuu(kernel).to_dense(), manual.Kuu(kernel).to_dense())
    assert strided.t == pytest.approx(2.0)


def test_bad_input_and_unsupported_kernels():
    with pytest.raises(ValueError, match="method"):
        HiPPOInducingVariables(4, method="exact")
    with pytest.raises(ValueError, match="measure"):
        HiPPOInducingVariables(4, measure="legx")
    with pytest.raises(ValueError, match="M"):
        HiPPOInducingVariables(0)
    with pytest.raises(ValueError, match="t must be greater"):
        HiPPOInducingVariables(4, t=0.0)
    ivars = HiPPOInducingVariables(4, t=1.0, method="recurrence")
    with pytest.raises(TypeError, match="Fourier features need.*method='spectral'"):  # the periodic kernel's lines
        ivars.Kuu(gpytorch.kernels.PeriodicKernel())
    with pytest.raises(ValueError, match="t_new"):
        ivars.advance(0.5)
    with pytest.raises(ValueError, match="x must have shape"):
        ivars.Kuf(rbf(), torch.zeros(3, 2))
    with pytest.raises(ValueError, match="NaN"):
        ivars.Kuf(rbf(), torch.tensor([[float("nan")]]))
    # quadrature needs no spectral density: any 1-D kernel works
    periodic = HiPPOInducingVariables(4, t=1.0).Kuu(gpytorch.kernels.PeriodicKernel()).to_dense()
    assert torch.linalg.eigvalsh(periodic).min() > 0
    multi = HiPPOInducingVariables(4, input_dim=2)
    with pytest.raises(RuntimeError, match="append_path"):
        multi.Kuu(gpytorch.kernels.RBFKernel())


@pytest.mark.parametrize("nu, panels, tolerance", [(0.5, None, 3e-4), (0.5, 160, 1e-6), (2.5, None, 1e-8)])
def test_quadrature_with_matern_kernels(nu, panels, tolerance):
    # Matern kernels have a kink (nu = 1/2) or a jump in a higher derivative at x_n, so the
    # composite rule converges algebraically in the number of panels (second order for nu = 1/2);
    # the reference is adaptive quadrature told where the kink is.
    t, ell = 2.0, 0.4
    kernel = gpytorch.kernels.MaternKernel(nu=nu)
    kernel.lengthscale = ell
    x = torch.tensor([[0.3], [1.37]])
    Kuf = HiPPOInducingVariables(4, "legs", t=t, num_panels=panels).Kuf(kernel, x)
    for m in range(4):
        for n in range(2):
            xn = x[n, 0].item()

            def integrand(s):
                return kernel(torch.tensor([[xn]]), torch.tensor([[s]])).to_dense().item() * legs_phi(m, s, t)

            ref, _ = scipy.integrate.quad(integrand, 0, t, points=[xn], epsabs=1e-13, limit=200)
            assert abs(Kuf[m, n].item() - ref) < tolerance


def test_state_dict_round_trip_after_the_stream_has_grown():
    kernel = rbf()
    for method in ("quadrature", "recurrence"):
        trained = HiPPOInducingVariables(5, "legs", t=1.0, method=method, num_rff=200)
        trained.advance(2.0)
        trained.advance(3.5)
        fresh = HiPPOInducingVariables(5, "legs", t=1.0, method=method, num_rff=200)
        fresh.load_state_dict(trained.state_dict())
        assert fresh.t == 3.5
        torch.testing.assert_close(fresh.Kuu(kernel).to_dense(), trained.Kuu(kernel).to_dense())
    kernel2 = gpytorch.kernels.RBFKernel(ard_num_dims=2)
    path = HiPPOInducingVariables(4, input_dim=2, num_rff=200)
    path.append_path(torch.randn(10, 2))
    path.append_path(torch.randn(6, 2), kernel=kernel2)
    restored = HiPPOInducingVariables(4, input_dim=2, num_rff=200)
    restored.load_state_dict(path.state_dict())
    torch.testing.assert_close(
        restored.Kuf(kernel2, torch.randn(3, 2, generator=torch.Generator().manual_seed(0))),
        path.Kuf(kernel2, torch.randn(3, 2, generator=torch.Generator().manual_seed(0))),
    )


def test_rff_kuf_keeps_the_nystrom_residual_nonnegative():
    # k(x,x) - diag(Kfu Kuu^{-1} Kuf) must be >= 0.  With few features the thesis's ODE Kfu and the
    # RFF Kuu disagree enough to break it; Kfu from the same features keeps it (up to the jitter).
    kernel = rbf(lengthscale=0.2, outputscale=1.0)
    x = torch.linspace(0, 6, 200)[:, None]

    def residual(kuf):
        ivars = HiPPOInducingVariables(40, "legs", t=6.0, method="recurrence", dt=0.01, num_rff=100, kuf=kuf, jitter=1e-8)
        Kuf = ivars.Kuf(kernel, x)
        chol = torch.linalg.cholesky(ivars.Kuu(kernel).to_dense())
        v = torch.linalg.solve_triangular(chol, Kuf, upper=False)
        return (kernel(x, diag=True) - v.pow(2).sum(0)).detach()

    assert residual("ode").min() < -1e-3
    assert residual("rff").min() > -1e-6
    with pytest.raises(ValueError, match="kuf"):
        HiPPOInducingVariables(4, kuf="rff")
