"""HiPPO memory against independent references: hand-written thesis matrices, scipy
special functions and adaptive quadrature, scipy's ODE solver, and the recurrence's own
convergence order."""

import math

import numpy as np
import pytest
import scipy.integrate
import scipy.special
import torch

from gpytorch_hippo.hippo import DISCRETIZATIONS, MEASURES, HiPPO, project, quadrature_rule, transition

SQ = math.sqrt


def signal(x):
    return torch.sin(3 * x) + torch.exp(-x)


# ------------------------------------------------------------------ transition matrices
def test_legs_matrices_match_thesis_for_M3():
    # eq. hippo_matrix_a / hippo_matrix_b written out by hand for M = 3
    A_ref = torch.tensor([[-1.0, 0.0, 0.0], [-SQ(3), -2.0, 0.0], [-SQ(5), -SQ(15), -3.0]], dtype=torch.float64)
    B_ref = torch.tensor([1.0, SQ(3), SQ(5)], dtype=torch.float64)
    A, B = transition("legs", 3)
    torch.testing.assert_close(A, A_ref, rtol=0, atol=1e-15)
    torch.testing.assert_close(B, B_ref, rtol=0, atol=1e-15)


def test_legt_matrices_match_thesis_for_M3():
    # App. A: A(t) = -A/theta with A_mk = sqrt((2m+1)(2k+1)) (m >= k), (-1)^(m-k) sqrt(...) (m < k)
    theta = 2.0
    A_thesis = torch.tensor([[1.0, -SQ(3), SQ(5)], [SQ(3), 3.0, -SQ(15)], [SQ(5), SQ(15), 5.0]], dtype=torch.float64)
    A, B = transition("legt", 3, theta=theta)
    torch.testing.assert_close(A, -A_thesis / theta, rtol=0, atol=1e-15)
    torch.testing.assert_close(B, torch.tensor([1.0, SQ(3), SQ(5)], dtype=torch.float64) / theta)


def test_lagt_matrices_match_thesis_for_M3():
    A, B = transition("lagt", 3)
    A_ref = -torch.tensor([[1.0, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.float64)
    torch.testing.assert_close(A, A_ref, rtol=0, atol=0)
    torch.testing.assert_close(B, torch.ones(3, dtype=torch.float64), rtol=0, atol=0)


def test_fout_real_form_is_the_thesis_complex_system():
    # Thesis App. A: A_mk = -1/theta (m != k), (2 pi i m - 1)/theta (m = k), B_m = 1/theta for the
    # coefficients z_m of exp(2 pi i m s/theta).  For a real signal z_{-m} = conj(z_m), so the
    # real form with K cos/sin pairs must equal that complex ODE on frequencies m = -K..K under
    # z_0 = c_0, z_m = (c_{2m-1} + i c_{2m})/sqrt2.
    theta, K = 1.5, 3
    M = 2 * K + 1
    A, B = transition("fout", M, theta=theta)
    freqs = list(range(-K, K + 1))
    Ac = torch.full((M, M), -1 / theta, dtype=torch.complex128)
    Ac.diagonal().copy_(torch.tensor([(2j * math.pi * m - 1) / theta for m in freqs], dtype=torch.complex128))
    Bc = torch.full((M,), 1 / theta, dtype=torch.complex128)

    def to_complex(c):
        z = {0: complex(c[0])}
        for m in range(1, K + 1):
            z[m] = complex(c[2 * m - 1], c[2 * m]) / SQ(2)
            z[-m] = z[m].conjugate()
        return torch.tensor([z[m] for m in freqs], dtype=torch.complex128)

    rng = torch.Generator().manual_seed(0)
    for _ in range(3):
        c = torch.randn(M, generator=rng, dtype=torch.float64)
        f = torch.randn(1, generator=rng, dtype=torch.float64).item()
        torch.testing.assert_close(to_complex(A @ c + B * f), Ac @ to_complex(c) + Bc * f, rtol=0, atol=1e-12)


# ------------------------------------------------------------------ bases and projection
@pytest.mark.parametrize("measure", MEASURES)
def test_bases_orthonormal_under_measure(measure):
    hippo = HiPPO(measure, 7, theta=0.8)
    nodes, weights = quadrature_rule(measure, 2.0, theta=0.8, num_nodes=64, start=-math.inf)
    g = hippo.basis(nodes, 2.0)
    gram = g.T @ (weights[:, None] * g)
    torch.testing.assert_close(gram, torch.eye(7, dtype=torch.float64), rtol=0, atol=1e-12)


def test_bases_equal_scipy_special_functions():
    x = torch.linspace(0.05, 1.95, 13, dtype=torch.float64)
    t, theta = 2.0, 0.9
    xs = x.numpy()
    for m in range(6):
        legs = SQ(2 * m + 1) * scipy.special.eval_legendre(m, 2 * xs / t - 1)
        legt = SQ(2 * m + 1) * scipy.special.eval_legendre(m, 2 * (xs - t) / theta + 1)
        lagt = scipy.special.eval_laguerre(m, (t - xs) / theta)
        np.testing.assert_allclose(HiPPO("legs", 6).basis(x, t)[:, m], legs, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(HiPPO("legt", 6, theta).basis(x, t)[:, m], legt, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(HiPPO("lagt", 6, theta).basis(x, t)[:, m], lagt, rtol=1e-12, atol=1e-12)


def test_high_degree_bases_equal_scipy_and_fold_a_row_scale():
    """M = 400 (the rescaled recurrence's coefficients over many degrees) against scipy's P_n, and the
    quadrature rules' folded row scale equal to scaling afterwards (a wrong c_n or γ_n shows at 1e-3)."""
    t, M = 3.0, 400
    x = torch.linspace(0.0, t, 257, dtype=torch.float64)
    z = (2 * x / t - 1).numpy()
    reference = np.stack([SQ(2 * m + 1) * scipy.special.eval_legendre(m, z) for m in range(M)], axis=-1)
    hippo = HiPPO("legs", M)
    np.testing.assert_allclose(hippo.basis(x, t).numpy(), reference, rtol=0, atol=1e-10 * np.abs(reference).max())
    scale = torch.rand(257, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    scaled = hippo.basis(x, t) * scale[:, None]
    torch.testing.assert_close(hippo.basis_at_nodes(x, t, scale), scaled, rtol=0, atol=1e-12 * float(scaled.abs().max()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("measure", ["legs", "legt"])
def test_bases_without_autograd_equal_the_differentiable_path(measure, dtype):
    # Without autograd the Legendre recurrence runs in NumPy (hippo._legendre); with a leaf that
    # requires grad it runs in torch. Same operations: the values must agree to the bit, keep the
    # dtype and shape (batched t), and the torch path must still carry gradients.
    hippo = HiPPO(measure, 9, theta=0.7)
    x = torch.linspace(0.05, 1.95, 11, dtype=dtype)
    t = torch.tensor([[2.0], [1.5]], dtype=dtype)
    fast = hippo.basis(x, t)
    x_grad = x.clone().requires_grad_(True)
    slow = hippo.basis(x_grad, t)
    assert fast.dtype == dtype and fast.shape == (2, 1, 11, 9) and not fast.requires_grad
    assert torch.equal(fast, slow.detach())
    with torch.no_grad():
        assert torch.equal(hippo.basis(x_grad, t), fast)
    if dtype == torch.float64:
        torch.autograd.gradcheck(lambda v: hippo.basis(v, t), (x_grad,))


@pytest.mark.parametrize("measure", MEASURES)
def test_project_equals_adaptive_quadrature(measure):
    t, theta, M = 2.0, 0.9, 5
    hippo = HiPPO(measure, M, theta)
    coeffs = project(signal, t, M, measure, theta)
    for m in range(M):

        def integrand(x):
            xt = torch.tensor([x], dtype=torch.float64)
            return float(signal(xt) * hippo.basis(xt, t)[0, m] * hippo.measure_density(xt, t)[0])

        lower = 0.0 if measure in ("legs", "lagt") else t - theta
        ref, _ = scipy.integrate.quad(integrand, lower, t, epsabs=1e-13, epsrel=1e-13, limit=200)
        assert abs(coeffs[m].item() - ref) < 1e-10


def test_project_lagt_laguerre_rule_over_infinite_past():
    # Gauss-Laguerre branch: exp(x/2) on (-inf, t]; c_m = int exp(x/2) L_m(t-x) e^{-(t-x)} dx
    t = 1.0
    coeffs = project(lambda x: torch.exp(x / 2), t, 4, "lagt", start=-math.inf, num_nodes=60)
    for m in range(4):
        ref, _ = scipy.integrate.quad(
            lambda s: math.exp((t - s) / 2) * scipy.special.eval_laguerre(m, s) * math.exp(-s),
            0,
            math.inf,
            epsabs=1e-13,
        )
        assert abs(coeffs[m].item() - ref) < 1e-10


# ------------------------------------------------------------------ convergence of the recurrence
ORDER = {"forward_euler": 1, "backward_euler": 1, "bilinear": 2, "zoh": 2}


def _ode_reference(measure, M, theta, t_end):
    """Tight-tolerance solution of dc/dt = A c + B f(t) from c(0)=0 (the continuous LegT/FouT ODE)."""
    A, B = (m.numpy() for m in transition(measure, M, theta))
    f = lambda t: math.sin(3 * t) + math.exp(-t)
    sol = scipy.integrate.solve_ivp(lambda t, c: A @ c + B * f(t), (0.0, t_end), np.zeros(M), method="DOP853", rtol=1e-12, atol=1e-14)
    return torch.from_numpy(sol.y[:, -1])


@pytest.mark.parametrize("discretization", DISCRETIZATIONS)
@pytest.mark.parametrize("measure", MEASURES)
def test_scan_converges_at_expected_order(measure, discretization):
    M, theta, t_end = 7, 1.0, 2.0
    if measure in ("legs", "lagt"):
        reference = project(signal, t_end, M, measure, theta)  # exact ODEs: converge to projection
    else:
        reference = _ode_reference(measure, M, theta, t_end)  # window ODEs: converge to the ODE
    errors = []
    # first-order schemes need smaller steps to reach their asymptotic regime on FouT (|A| ~ M/theta)
    steps = [400, 800, 1600] if ORDER[discretization] == 2 else [1600, 3200, 6400]
    for n in steps:
        times = torch.linspace(0.0, t_end, n + 1, dtype=torch.float64)
        c = HiPPO(measure, M, theta, discretization).scan(signal(times), times)
        errors.append((c[-1] - reference).norm().item())
    rates = [math.log2(errors[i] / errors[i + 1]) for i in range(len(errors) - 1)]
    expected = ORDER[discretization]
    assert all(abs(r - expected) < 0.15 for r in rates), (errors, rates)


@pytest.mark.parametrize("measure", ["legt", "fout"])
def test_window_ode_gap_to_exact_projection(measure):
    # The LegT/FouT ODEs replace f(t - theta) by the memory's reconstruction, so their exact
    # solution differs from the exact window projection.  Measured gap (M = 7, theta = 1, t = 2,
    # f = sin 3t + e^-t): LegT ~2e-4, FouT ~0.45 (the Fourier reconstruction at the window edge
    # converges to the mean of f(t) and f(t - theta), Gibbs).  See docs/project_results.md.
    M, theta, t_end = 7, 1.0, 2.0
    gap = (_ode_reference(measure, M, theta, t_end) - project(signal, t_end, M, measure, theta)).norm().item()
    bounds = {"legt": (1e-5, 1e-3), "fout": (0.1, 1.0)}[measure]
    assert bounds[0] < gap < bounds[1]


def test_legs_first_step_from_zero_is_finite_and_exact_for_linear_signals():
    # A linear signal lies in the span of the first two Legendre bases, so every scheme's first
    # step from t = 0 (the exact projection of the linear interpolant) equals project().
    times = torch.tensor([0.0, 0.5], dtype=torch.float64)
    lin = lambda x: 2.0 - 3.0 * x
    for disc in DISCRETIZATIONS:
        c = HiPPO("legs", 4, discretization=disc).scan(lin(times), times)
        assert torch.isfinite(c).all()
        torch.testing.assert_close(c[-1], project(lin, 0.5, 4, "legs"), rtol=0, atol=1e-13)


# ------------------------------------------------------------------ streaming, fast paths
@pytest.mark.parametrize("discretization", DISCRETIZATIONS)
@pytest.mark.parametrize("measure", MEASURES)
def test_step_stream_equals_scan_and_final_state(measure, discretization):
    rng = torch.Generator().manual_seed(1)
    times = torch.cumsum(torch.rand(60, generator=rng, dtype=torch.float64) * 0.05 + 0.01, 0)
    times = torch.cat([torch.zeros(1, dtype=torch.float64), times])  # starts at 0, non-uniform
    values = signal(times) + 0.1 * torch.randn(3, times.shape[0], generator=rng, dtype=torch.float64)
    hippo = HiPPO(measure, 5, theta=0.7, discretization=discretization)
    states = hippo.scan(values, times)
    c = hippo.initial_state(values[:, 0], times[0].item())
    for k in range(1, times.shape[0]):
        c = hippo.step(c, values[:, k], times[k - 1].item(), times[k].item(), f_prev=values[:, k - 1])
        torch.testing.assert_close(c, states[:, k], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(hippo.final_state(values, times), states[:, -1], rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("measure", MEASURES)
def test_final_state_continues_from_a_carried_state(measure):
    times = torch.linspace(0.0, 3.0, 301, dtype=torch.float64)
    hippo = HiPPO(measure, 5, theta=0.7)
    whole = hippo.final_state(signal(times), times)
    first = HiPPO(measure, 5, theta=0.7).final_state(signal(times[:120]), times[:120])
    rest = times[119:]
    resumed = HiPPO(measure, 5, theta=0.7).final_state(signal(rest), rest, initial_state=first)
    torch.testing.assert_close(resumed, whole, rtol=1e-10, atol=1e-12)


def test_scan_float32_batched_matches_float64():
    times = torch.linspace(0, 5, 500, dtype=torch.float64)
    values = torch.stack([signal(times), torch.cos(times)]).reshape(2, 1, -1)
    hippo = HiPPO("legs", 16)
    c64 = hippo.scan(values, times)
    c32 = hippo.scan(values.float(), times)
    assert c32.dtype == torch.float32 and c32.shape == (2, 1, 500, 16)
    torch.testing.assert_close(c32.double(), c64, rtol=0, atol=2e-5)
    torch.testing.assert_close(hippo.final_state(values.float(), times).double(), c64[..., -1, :], rtol=0, atol=2e-5)


# ------------------------------------------------------------------ memory behaviour
def test_reconstruction_error_decreases_with_order():
    # spectral convergence of the optimal projection of a smooth signal, and the scan's
    # reconstruction agrees with it up to the discretisation error
    times = torch.linspace(0, 4, 4001, dtype=torch.float64)
    x = torch.linspace(0, 4, 400, dtype=torch.float64)
    errors = []
    for M in (4, 8, 12, 16, 24):
        hippo = HiPPO("legs", M)
        exact = project(signal, 4.0, M, "legs")
        errors.append((hippo.reconstruct(exact, x, 4.0) - signal(x)).pow(2).mean().sqrt().item())
        scanned = hippo.scan(signal(times), times)[-1]
        assert (hippo.reconstruct(scanned, x, 4.0) - hippo.reconstruct(exact, x, 4.0)).abs().max() < 1e-5
    assert all(a > 4 * b for a, b in zip(errors, errors[1:])), errors
    assert errors[-1] < 1e-9


def test_legs_remembers_the_start_while_window_and_decay_measures_forget():
    # thesis App. C "Comparison of basis-measure variants": a bump at the start of a long signal
    t_end = 20.0
    times = torch.linspace(0, t_end, 4001, dtype=torch.float64)
    bump = lambda x: torch.exp(-((x - 1.0) ** 2) / 0.5) + 0.2 * torch.sin(x)
    early = torch.linspace(0.0, 2.0, 50, dtype=torch.float64)
    errors = {}
    for measure, M in [("legs", 33), ("legt", 33), ("lagt", 33), ("fout", 33)]:
        hippo = HiPPO(measure, M, theta=4.0)
        c = hippo.final_state(bump(times), times)
        errors[measure] = (hippo.reconstruct(c, early, t_end) - bump(early)).abs().max().item()
    assert errors["legs"] < 0.02, errors
    for measure in ("legt", "lagt", "fout"):
        assert errors[measure] > 0.5, errors


# ------------------------------------------------------------------ bad input
def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="measure"):
        HiPPO("legx", 4)
    with pytest.raises(ValueError, match="M"):
        HiPPO("legs", 0)
    with pytest.raises(ValueError, match="M must be odd"):
        HiPPO("fout", 4)
    with pytest.raises(ValueError, match="discretization"):
        HiPPO("legs", 4, discretization="rk4")
    with pytest.raises(ValueError, match="theta"):
        HiPPO("legt", 4, theta=-1.0)
    hippo = HiPPO("legs", 4)
    with pytest.raises(ValueError, match="strictly increasing"):
        hippo.scan(torch.zeros(3), torch.tensor([0.0, 0.2, 0.2]))
    with pytest.raises(ValueError, match="signal"):
        hippo.scan(torch.zeros(4), torch.tensor([0.0, 0.1, 0.2]))
    with pytest.raises(ValueError, match="f_prev"):
        hippo.step(torch.zeros(4), 1.0, 0.1, 0.2)
    with pytest.raises(ValueError, match="t must be greater"):
        hippo.step(torch.zeros(4), 1.0, 0.2, 0.2, f_prev=0.0)
    with pytest.raises(ValueError, match="times must be >= 0"):
        hippo.scan(torch.zeros(2), torch.tensor([-1.0, 0.0]))
    with pytest.raises(ValueError, match="c must have"):
        hippo.reconstruct(torch.zeros(3), torch.zeros(2), 1.0)


@pytest.mark.parametrize("measure", ["legs", "legt"])
def test_growing_grid_reuses_cached_prefix(measure):
    # a stream that grows: the cached kernel of the prefix is extended, not recomputed
    times = torch.linspace(0.0, 3.0, 301, dtype=torch.float64)
    grown = HiPPO(measure, 6, theta=0.8)
    grown.final_state(signal(times[:100]), times[:100])
    grown.final_state(signal(times[:220]), times[:220])
    c = grown.final_state(signal(times), times)
    fresh = HiPPO(measure, 6, theta=0.8).final_state(signal(times), times)
    torch.testing.assert_close(c, fresh, rtol=1e-11, atol=1e-13)
    torch.testing.assert_close(grown.scan(signal(times), times)[-1], fresh, rtol=1e-10, atol=1e-12)
