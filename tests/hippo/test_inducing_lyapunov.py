"""The Lyapunov backend (``method="lyapunov"``): exact LegS covariances carried across ``advance``.

References are independent of its step formula: the spectral backend (RBF, frequency domain), the
quadrature backend (time domain, double integral) and the banded backend (Matérn).  Those agree with
each other to ~1e-13 relative here; the Lyapunov steps are exact identities (module
:mod:`gpytorch_hippo.inducing.lyapunov`) evaluated by quadratures converged to round-off, and their
errors are damped from step to step (``‖Φ‖ <= sqrt(t_a/t_b)``), so 1e-10 relative leaves a margin
of ~1000 over what is seen while any wrong term (a missing cross term, a stale state) shows at 1e-3 or more.
"""

import copy
import math

import gpytorch
import pytest
import torch

from gpytorch_hippo import HiPPOInducingVariables, OnlineSGPR
from gpytorch_hippo.hippo import transition
from gpytorch_hippo.inducing.lyapunov import LyapunovBackend, propagator

TOL = 1e-10


def _kernel(nu=None, lengthscale=1.0, outputscale=1.7):
    base = gpytorch.kernels.RBFKernel() if nu is None else gpytorch.kernels.MaternKernel(nu=nu)
    kernel = gpytorch.kernels.ScaleKernel(base).double()
    kernel.base_kernel.lengthscale = lengthscale
    kernel.outputscale = outputscale
    return kernel.requires_grad_(False)


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


def _carried(M, kernel, t0, times):
    """A Lyapunov set advanced through ``times`` (Kuu at each), and the snapshot before the last step."""
    ivars = HiPPOInducingVariables(M, t=t0, method="lyapunov")
    ivars.Kuu(kernel)
    old = None
    for t in times:
        old = copy.deepcopy(ivars)
        ivars.advance(t)
        ivars.Kuu(kernel)
    return ivars, old


def _reference(M, t, method, **options):
    return HiPPOInducingVariables(M, t=t, method=method, **options)


def test_lyapunov_ode_and_flow_of_legs():
    """The derivation's two facts, with the package's own A, B: dK/dτ = AK + KAᵀ + Bkᵀ + kBᵀ
    (central differences of the spectral Kuu) and Φ = exp(A Δτ) equals the basis re-expansion."""
    M, t, h = 12, 6.0, 1e-4
    kernel = _kernel()
    A, B = transition("legs", M)
    K = {s: _reference(M, t * math.exp(s * h), "spectral").Kuu(kernel).to_dense() for s in (-1, 0, 1)}
    jitter = K[0] - _reference(M, t, "spectral", jitter=0.0).Kuu(kernel).to_dense()
    K = {s: value - jitter * math.exp(-s * h) for s, value in K.items()}  # the relative jitter ∝ mean diag, ~1/t
    k_t = _reference(M, t, "spectral").Kuf(kernel, torch.tensor([[t]], dtype=torch.float64))[:, 0]
    rhs = A @ K[0] + K[0] @ A.T + torch.outer(B, k_t) + torch.outer(k_t, B)
    assert _rel((K[1] - K[-1]) / (2 * h), rhs) < 1e-6  # O(h²) differences
    memory = _reference(M, t, "lyapunov").memory
    assert _rel(propagator(memory, 3.0, 4.5), torch.linalg.matrix_exp(A * math.log(4.5 / 3.0))) < 1e-12


@pytest.mark.parametrize("t_end, times", [(1.0, (0.6, 0.8, 1.0)), (8.0, (3.0, 5.5, 8.0)), (100.0, (30.0, 62.0, 100.0))])
def test_rbf_matches_spectral_and_quadrature(t_end, times):
    """Kuu, Kuf and the cross covariance with the previous step at t/ℓ = 1, 8, 100 (M = 16)."""
    M, kernel = 16, _kernel()
    ivars, old = _carried(M, kernel, 0.3, times)
    x = torch.linspace(-1.0, t_end + 3.0, 41, dtype=torch.float64)[:, None]
    for method in ("spectral", "quadrature"):
        ref, ref_old = _reference(M, t_end, method), _reference(M, old.t, method)
        assert _rel(ivars.Kuu(kernel).to_dense(), ref.Kuu(kernel).to_dense()) < TOL
        assert _rel(ivars.Kuf(kernel, x), ref.Kuf(kernel, x)) < TOL
        assert _rel(ivars.Kuu_cross(old, kernel), ref.Kuu_cross(ref_old, kernel)) < TOL
        assert _rel(old.Kuu_cross(ivars, kernel), ref_old.Kuu_cross(ref, kernel)) < TOL


def test_rbf_far_beyond_m_matches_spectral():
    """t/ℓ = 400 ≫ M = 16, reached in 25 steps (plus a step longer than MAX_STEP length scales)."""
    M, kernel = 16, _kernel(lengthscale=2.0)
    times = [40.0 + 30.0 * k for k in range(1, 25)] + [800.0]
    ivars, old = _carried(M, kernel, 40.0, times)
    ref, ref_old = _reference(M, 800.0, "spectral"), _reference(M, old.t, "spectral")
    x = torch.linspace(700.0, 805.0, 30, dtype=torch.float64)[:, None]
    assert _rel(ivars.Kuu(kernel).to_dense(), ref.Kuu(kernel).to_dense()) < TOL
    assert _rel(ivars.Kuf(kernel, x), ref.Kuf(kernel, x)) < TOL
    assert _rel(ivars.Kuu_cross(old, kernel), ref.Kuu_cross(ref_old, kernel)) < TOL


@pytest.mark.parametrize("nu", [None, 0.5, 2.5])
def test_kuf_at_inputs_spread_over_the_stream_matches_the_exact_backends(nu):
    """Inputs in separate groups far apart (more than four reaches), given unsorted, outside the
    support and twice the same: each group gets its own local rule (what keeps OnlineSGPR's
    whole-stream captured-variance check O(M) per point); values as the spectral/banded backend's."""
    M, lengthscale = 24, 0.5
    kernel = _kernel(nu, lengthscale=lengthscale)
    ivars, _ = _carried(M, kernel, 10.0, [200.0, 400.0, 600.0])
    groups = [
        torch.tensor([-3.0, 0.2]),
        torch.tensor([150.0, 150.3, 151.0]),
        torch.tensor([333.0]),
        torch.tensor([599.0, 600.0, 600.0, 603.0]),
    ]
    x = torch.cat(groups)[torch.randperm(10, generator=torch.Generator().manual_seed(0))].double()[:, None]
    reference = _reference(M, 600.0, "auto").Kuf(kernel, x)
    assert _rel(ivars.Kuf(kernel, x), reference) < TOL
    assert ivars.Kuf(kernel, x[:0]).shape == (M, 0)


@pytest.mark.parametrize("nu", [0.5, 1.5, 2.5])
def test_matern_matches_banded(nu):
    """Matérn at t/ℓ = 1 and 60 against the banded backend (exact, its own tests)."""
    M, kernel = 16, _kernel(nu)
    for times in ((0.6, 1.0), (20.0, 45.0, 60.0)):
        ivars, old = _carried(M, kernel, 0.4, times)
        ref, ref_old = _reference(M, ivars.t, "auto"), _reference(M, old.t, "auto")
        x = torch.linspace(-1.0, ivars.t + 5.0, 37, dtype=torch.float64)[:, None]
        assert _rel(ivars.Kuu(kernel).to_dense(), ref.Kuu(kernel).to_dense()) < TOL
        assert _rel(ivars.Kuf(kernel, x), ref.Kuf(kernel, x)) < TOL
        assert _rel(ivars.Kuu_cross(old, kernel), ref.Kuu_cross(ref_old, kernel)) < TOL


def test_matern52_matches_fine_quadrature():
    """Matérn 5/2 at t/ℓ = 8 against a refined time-domain quadrature (no banded code involved)."""
    M, kernel = 16, _kernel(2.5)
    ivars, old = _carried(M, kernel, 0.5, (3.0, 8.0))
    ref = _reference(M, 8.0, "quadrature", num_panels=36, num_nodes=32)
    ref_old = _reference(M, 3.0, "quadrature", num_panels=16, num_nodes=32)
    x = torch.linspace(0.0, 10.0, 23, dtype=torch.float64)[:, None]
    assert _rel(ivars.Kuu(kernel).to_dense(), ref.Kuu(kernel).to_dense()) < 1e-12
    assert _rel(ivars.Kuf(kernel, x), ref.Kuf(kernel, x)) < 1e-12
    assert _rel(ivars.Kuu_cross(old, kernel), ref.Kuu_cross(ref_old, kernel)) < 1e-12


def test_state_carried_over_many_advances_equals_fresh():
    """60 advances (each Kuu resumed from the cached state) against one fresh evaluation at the end."""
    M, kernel = 24, _kernel(lengthscale=0.5)
    ivars, _ = _carried(M, kernel, 2.0, [2.0 + 1.5 * k for k in range(1, 61)])
    backend = ivars.backends["lyapunov"]
    assert backend._state[1] == ivars.t  # carried, not restarted
    fresh = HiPPOInducingVariables(M, t=ivars.t, method="lyapunov")
    assert _rel(ivars.Kuu(kernel).to_dense(), fresh.Kuu(kernel).to_dense()) < TOL


def test_changed_lengthscale_invalidates_the_state():
    """A cache keyed on t alone would return the old length scale's Kuu (same t) or step from it."""
    M = 12
    kernel = _kernel(lengthscale=1.0)
    ivars, _ = _carried(M, kernel, 1.0, (3.0, 5.0))
    kernel.base_kernel.lengthscale = 0.7
    assert _rel(ivars.Kuu(kernel).to_dense(), _reference(M, 5.0, "spectral").Kuu(kernel).to_dense()) < TOL
    kernel.base_kernel.lengthscale = 1.3
    ivars.advance(7.0)
    assert _rel(ivars.Kuu(kernel).to_dense(), _reference(M, 7.0, "spectral").Kuu(kernel).to_dense()) < TOL
    kernel.outputscale = 0.4
    assert _rel(ivars.Kuu(kernel).to_dense(), _reference(M, 7.0, "spectral").Kuu(kernel).to_dense()) < TOL


@pytest.mark.parametrize("nu", [None, 1.5])
def test_equal_length_tasks_reuse_the_segment_covariance_exactly(nu):
    """Steps of one length form D = (L/t_b)² T Kuu(L) Tᵀ from a kept Kuu(L) (M = 120, t/ℓ up to 150):
    equal to the exact backend; a length within a few ulps of t (times such as 0.1 k) still reuses
    it, a changed length scale or a new length does not (a stale Kuu(L) would be off by 1e-2 or more)."""
    M, kernel = 120, _kernel(nu, lengthscale=1.0)
    ivars, old = _carried(M, kernel, 30.0, [60.0, 90.0, 120.0, 150.0])
    backend = ivars.backends["lyapunov"]
    assert backend._segment_length[2] is not None  # the kept Kuu(L) served the later steps
    ref = _reference(M, 150.0, "auto")
    assert _rel(ivars.Kuu(kernel).to_dense(), ref.Kuu(kernel).to_dense()) < TOL
    assert _rel(ivars.Kuu_cross(old, kernel), ref.Kuu_cross(_reference(M, 120.0, "auto"), kernel)) < TOL
    kernel.base_kernel.lengthscale = 0.8  # the kept Kuu(L) belongs to ℓ = 1
    for t in (180.0, 210.0, 232.0):  # two steps of 30 at the new ℓ, then a new length
        ivars.advance(t)
        assert _rel(ivars.Kuu(kernel).to_dense(), _reference(M, t, "auto").Kuu(kernel).to_dense()) < TOL
    small, _ = _carried(16, kernel, 0.1, [0.1 * k for k in range(2, 9)])  # 0.30000000000000004 - 0.2, ...
    assert small.backends["lyapunov"]._segment_length[2] is not None
    assert _rel(small.Kuu(kernel).to_dense(), _reference(16, small.t, "auto").Kuu(kernel).to_dense()) < TOL


def test_kuf_after_a_lengthscale_change_at_the_same_t_uses_new_panels():
    """The local Kuf rule keeps the panels of its last call for the next step's forcing; at the same t
    a ten times shorter length scale needs ten times narrower panels (old ones: errors of 1e-2 or more)."""
    M, kernel = 24, _kernel(lengthscale=1.0)
    ivars, _ = _carried(M, kernel, 5.0, [10.0, 15.0])
    x = torch.linspace(9.0, 15.0, 25, dtype=torch.float64)[:, None]
    ivars.Kuf(kernel, x)
    kernel.base_kernel.lengthscale = 0.1
    assert _rel(ivars.Kuf(kernel, x), _reference(M, 15.0, "spectral").Kuf(kernel, x)) < TOL


def test_cross_with_a_set_without_state_and_backwards():
    """The earlier set need not be a snapshot (no cache), and a state behind t restarts exactly."""
    M, kernel = 12, _kernel()
    later = HiPPOInducingVariables(M, t=9.0, method="lyapunov")
    earlier = HiPPOInducingVariables(M, t=4.0, method="lyapunov")
    ref = _reference(M, 9.0, "spectral").Kuu_cross(_reference(M, 4.0, "spectral"), kernel)
    assert _rel(later.Kuu_cross(earlier, kernel), ref) < TOL
    backend = LyapunovBackend()
    backend.state(later, kernel, 9.0)
    assert _rel(backend.state(earlier, kernel, 4.0), _reference(M, 4.0, "spectral", jitter=0.0).Kuu(kernel).to_dense()) < TOL


def test_gradients_match_finite_differences():
    """With gradients required Kuu and the cross covariance come from the exact backend, Kuf from
    the local rule; both match central differences of the (gradient-free, carried) values."""
    M = 10
    kernel = _kernel(lengthscale=0.8)
    ivars, old = _carried(M, kernel, 1.0, (3.0, 6.0))
    x = torch.linspace(4.0, 7.0, 9, dtype=torch.float64)[:, None]
    raw = kernel.base_kernel.raw_lengthscale
    raw.requires_grad_(True)
    total = ivars.Kuu(kernel).to_dense().sum() + ivars.Kuf(kernel, x).sum() + ivars.Kuu_cross(old, kernel).sum()
    (grad,) = torch.autograd.grad(total, raw)
    raw.requires_grad_(False)

    def value(shift):
        with torch.no_grad():
            raw.add_(shift)
            out = ivars.Kuu(kernel).to_dense().sum() + ivars.Kuf(kernel, x).sum() + ivars.Kuu_cross(old, kernel).sum()
            raw.sub_(shift)
        return float(out)

    h = 1e-5
    assert abs(float(grad) - (value(h) - value(-h)) / (2 * h)) < 1e-6 * max(1.0, abs(float(grad)))


def test_online_sgpr_matches_spectral():
    """Four tasks of OnlineSGPR: predictions with method='lyapunov' equal those with 'spectral'."""
    torch.manual_seed(0)
    kernel = _kernel(lengthscale=0.6)
    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    likelihood.noise = 0.05
    likelihood.requires_grad_(False)
    x = torch.linspace(0.0, 8.0, 400, dtype=torch.float64)[:, None]
    y = torch.sin(3 * x[:, 0]) + 0.2 * torch.randn(400, dtype=torch.float64)
    test_x = torch.linspace(0.0, 8.5, 60, dtype=torch.float64)[:, None]
    predictions = {}
    for method in ("lyapunov", "spectral"):
        model = OnlineSGPR(HiPPOInducingVariables(20, t=2.0, method=method), kernel, likelihood, captured_variance_warning=None)
        for task in range(4):
            if task:
                model.inducing_variables.advance(2.0 * (task + 1))
            model.update(x[100 * task : 100 * (task + 1)], y[100 * task : 100 * (task + 1)])
        with torch.no_grad():
            posterior = model(test_x)
            predictions[method] = (posterior.mean, posterior.variance)
    assert (predictions["lyapunov"][0] - predictions["spectral"][0]).abs().max() < 1e-6
    assert (predictions["lyapunov"][1] - predictions["spectral"][1]).abs().max() < 1e-6


def test_bad_inputs():
    with pytest.raises(ValueError, match="measure='legs'"):
        HiPPOInducingVariables(8, "legt", t=2.0, method="lyapunov")
    with pytest.raises(ValueError, match="input_dim=1"):
        HiPPOInducingVariables(8, input_dim=2, method="lyapunov")
    ivars = HiPPOInducingVariables(8, t=2.0, method="lyapunov")
    with pytest.raises(TypeError, match="does not take ProductKernel"):  # Matérn or RBF x periodic: taken (quasi-periodic)
        ivars.Kuu((gpytorch.kernels.MaternKernel() * gpytorch.kernels.RBFKernel()).double())
    with pytest.raises(TypeError, match="does not take LinearKernel"):
        ivars.Kuf(gpytorch.kernels.LinearKernel().double(), torch.ones(3, 1, dtype=torch.float64))
    with pytest.raises(ValueError, match="one length scale"):
        ivars.Kuu(gpytorch.kernels.RBFKernel(ard_num_dims=2).double())
    other = HiPPOInducingVariables(6, t=1.0, method="lyapunov")
    with pytest.raises(ValueError, match="same num_inducing"):
        ivars.Kuu_cross(other, _kernel())


def test_stream_start_after_zero_matches_quadrature():
    """``start > 0`` (the signal is zero before it): the same steps, from a clipped support."""
    M, kernel = 12, _kernel(lengthscale=0.7)
    ivars = HiPPOInducingVariables(M, t=3.0, start=0.5, method="lyapunov")
    ivars.Kuu(kernel)
    old = copy.deepcopy(ivars)
    ivars.advance(7.0)
    ivars.advance(9.0)
    ref = HiPPOInducingVariables(M, t=9.0, start=0.5, method="quadrature")
    ref_old = HiPPOInducingVariables(M, t=3.0, start=0.5, method="quadrature")
    x = torch.linspace(0.0, 10.0, 21, dtype=torch.float64)[:, None]
    assert _rel(ivars.Kuu(kernel).to_dense(), ref.Kuu(kernel).to_dense()) < TOL
    assert _rel(ivars.Kuu_cross(old, kernel), ref.Kuu_cross(ref_old, kernel)) < TOL
    assert _rel(ivars.Kuf(kernel, x), ref.Kuf(kernel, x)) < TOL


def test_online_sgpr_with_trained_hyperparameters_matches_spectral():
    """Adam steps on the bound (gradients through the exact backend, then a restarted state for the
    changed kernel) give the hyperparameters and predictions of method='spectral'."""
    torch.manual_seed(1)
    x = torch.linspace(0.0, 4.0, 200, dtype=torch.float64)[:, None]
    y = torch.sin(3 * x[:, 0]) + 0.1 * torch.randn(200, dtype=torch.float64)
    results = {}
    for method in ("lyapunov", "spectral"):
        kernel = _kernel(lengthscale=0.5, outputscale=1.0).requires_grad_(True)
        likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
        model = OnlineSGPR(HiPPOInducingVariables(16, t=2.0, method=method), kernel, likelihood, captured_variance_warning=None)
        model.update(x[:100], y[:100], num_iter=3, lr=0.05)
        model.inducing_variables.advance(4.0)
        model.update(x[100:], y[100:], num_iter=3, lr=0.05)
        with torch.no_grad():
            posterior = model(x)
        results[method] = (float(kernel.base_kernel.lengthscale.detach()), posterior.mean, posterior.variance)
    assert abs(results["lyapunov"][0] - results["spectral"][0]) < 1e-10
    assert (results["lyapunov"][1] - results["spectral"][1]).abs().max() < 1e-6
    assert (results["lyapunov"][2] - results["spectral"][2]).abs().max() < 1e-6
