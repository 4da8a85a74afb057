"""The covariance backends of HiPPO inducing variables: the backend choice, relative jitter, caches, gradients,
features, blocks and periodic kernels.

References: the quadrature backend (exact in time, tested against adaptive quadrature in
test_inducing_hippo_variables.py); SciPy's Bessel functions; dense closed-form SGPR posteriors written here.
"""

import copy
import dataclasses

import gpytorch
import numpy as np
import pytest
import scipy.special
import torch

from gpytorch_hippo import HiPPOInducingVariables, OnlineSGPR

DT = torch.float64


def scaled_rbf(lengthscale=0.5, outputscale=1.7, dtype=DT):
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).to(dtype)
    kernel.base_kernel.lengthscale = lengthscale
    kernel.outputscale = outputscale
    return kernel


def pair(measure, t, theta=3.0, M=None, **kwargs):
    M = M or (15 if measure == "fout" else 16)
    make = lambda method: HiPPOInducingVariables(M, measure, t=t, theta=theta, method=method, jitter=0.0, **kwargs)  # noqa: E731
    return make("spectral"), make("quadrature")


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def test_spectral_gradients_equal_quadrature_gradients():
    grads = []
    for method in ("spectral", "quadrature"):
        kernel = scaled_rbf()
        ivars = HiPPOInducingVariables(10, "legs", t=6.0, method=method, jitter=0.0)
        x = torch.linspace(0.3, 5.5, 7, dtype=DT, requires_grad=True)
        loss = ivars.Kuu(kernel).to_dense().square().sum() + ivars.Kuf(kernel, x).sin().sum()
        grads.append(torch.autograd.grad(loss, [kernel.raw_outputscale, kernel.base_kernel.raw_lengthscale, x]))
    for spectral_grad, quadrature_grad in zip(*grads):
        assert rel(spectral_grad, quadrature_grad) < 1e-10


def test_backend_choice_and_fallbacks():
    rbf = scaled_rbf()
    matern = gpytorch.kernels.MaternKernel(nu=1.5).to(DT)
    auto = HiPPOInducingVariables(8, "legs", t=4.0)
    assert auto.backend_for(rbf).name == "spectral"
    assert auto.backend_for(matern).name == "banded"
    assert HiPPOInducingVariables(8, "legs", t=4.0, method="spectral").backend_for(matern).name == "banded"
    assert auto.backend_for(gpytorch.kernels.PeriodicKernel().to(DT)).name == "spectral"  # its lines
    assert auto.backend_for(gpytorch.kernels.PeriodicKernel().to(DT) * matern).name == "banded"  # quasi-periodic
    assert auto.backend_for(gpytorch.kernels.RBFKernel().to(DT) * matern).name == "quadrature"
    batched = gpytorch.kernels.RBFKernel(batch_shape=torch.Size([3])).to(DT)  # e.g. inside LMC: exact quadrature
    assert auto.backend_for(batched).name == "quadrature"
    with pytest.raises(ValueError, match="batched"):
        HiPPOInducingVariables(8, "legs", t=4.0, method="spectral").Kuu(batched)
    with pytest.raises(TypeError, match="ProductKernel.*method='quadrature'"):
        HiPPOInducingVariables(8, "legs", t=4.0, method="spectral").Kuu(gpytorch.kernels.RBFKernel().to(DT) * matern)
    # LegT window clipped by the stream start: no closed form, exact quadrature instead
    clipped, quadrature = pair("legt", 2.0, theta=3.0)
    assert clipped.backend_for(rbf).name == "quadrature"
    torch.testing.assert_close(clipped.Kuu(rbf).to_dense(), quadrature.Kuu(rbf).to_dense())
    # the online update crosses a clipped (quadrature) and an unclipped (spectral) window
    unclipped_s, unclipped_q = pair("legt", 2.0, theta=3.0)
    unclipped_s.advance(4.0)
    unclipped_q.advance(4.0)
    torch.testing.assert_close(clipped.Kuu_cross(unclipped_s, rbf), quadrature.Kuu_cross(unclipped_q, rbf))
    with pytest.raises(ValueError, match="needs method='recurrence'"):
        HiPPOInducingVariables(4, kuf="ode")
    with pytest.raises(ValueError, match="features"):
        HiPPOInducingVariables(4, method="recurrence", features="sobol")


@pytest.mark.parametrize("ratio", [20, 200])
def test_float32_bound_agrees_with_float64_on_long_streams(ratio):
    # with an absolute 1e-4 jitter float32 and float64 bounds differed by ~20% at t/l = 50
    t = float(ratio)
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(300, generator=gen, dtype=DT) * t
    y = torch.sin(x) + 0.3 * torch.randn(300, generator=gen, dtype=DT)
    bounds = []
    for dtype in (torch.float64, torch.float32):
        likelihood = gpytorch.likelihoods.GaussianLikelihood().to(dtype)
        likelihood.noise = 0.09
        ivars = HiPPOInducingVariables(40, "legs", t=t)  # the bound in two dtypes, not the coverage: no warning
        model = OnlineSGPR(ivars, scaled_rbf(1.0, 1.0, dtype), likelihood, captured_variance_warning=None).to(dtype)
        bounds.append(model.update(x.to(dtype), y.to(dtype)).double())
    assert abs(bounds[0] - bounds[1]) / abs(bounds[0]) < 2e-3


def test_feature_cache_is_keyed_on_the_kernel_not_only_its_lengthscale():
    rbf = gpytorch.kernels.RBFKernel().to(DT)
    matern = gpytorch.kernels.MaternKernel(nu=0.5).to(DT)
    rbf.lengthscale = matern.lengthscale = 0.4
    ivars = HiPPOInducingVariables(6, "legs", t=2.0, method="recurrence", num_rff=300, dt=0.01)
    with torch.no_grad():
        K_rbf = ivars.Kuu(rbf).to_dense()
        K_matern = ivars.Kuu(matern).to_dense()
        fresh = HiPPOInducingVariables(6, "legs", t=2.0, method="recurrence", num_rff=300, dt=0.01).Kuu(matern).to_dense()
    torch.testing.assert_close(K_matern, fresh)
    assert (K_rbf - K_matern).abs().max() > 1e-2
    # a dtype change drops the cache too: the float32 matrix is computed in float32, not cast
    ivars.float()
    with torch.no_grad():
        K32 = ivars.Kuu(matern.float()).to_dense()
    assert K32.dtype == torch.float32
    torch.testing.assert_close(K32.double(), fresh, rtol=1e-4, atol=1e-5)


def test_quadrature_features_make_the_recurrence_deterministic_and_convergent():
    # the thesis's random frequencies replaced by Gauss-Legendre nodes over frequency
    kernel = scaled_rbf(lengthscale=0.5, outputscale=1.0)
    exact = HiPPOInducingVariables(8, "legs", t=4.0, jitter=0.0).Kuu(kernel).to_dense()
    errors = {}
    for features in ("random", "quadrature"):
        ivars = HiPPOInducingVariables(8, "legs", t=4.0, method="recurrence", features=features, num_rff=200, dt=0.001, jitter=0.0)
        errors[features] = rel(ivars.Kuu(kernel).to_dense().detach(), exact)
    assert errors["quadrature"] < 1e-5  # only the recurrence's O(dt^2) error is left
    assert errors["random"] > 10 * errors["quadrature"]  # Monte-Carlo error O(1/sqrt(R))


@pytest.mark.parametrize("nu", [0.5, 2.5])
def test_matern_quadrature_features_reproduce_the_kernel(nu):
    kernel = gpytorch.kernels.MaternKernel(nu=nu).to(DT)
    kernel.lengthscale = 0.7
    ivars = HiPPOInducingVariables(3, "legs", t=1.0, method="recurrence", features="quadrature", num_rff=4000)
    r = torch.tensor([[0.0], [0.3], [1.0], [2.5]], dtype=DT)
    psi = ivars.backends["recurrence"].features(ivars, kernel, r)
    # the tan map leaves an algebraic tail error: about 1e-4 for nu = 1/2, far less for 5/2
    tolerance = 2e-3 if nu == 0.5 else 1e-6
    assert (psi @ psi[:1].mT - kernel(r, r[:1]).to_dense()).abs().max() < tolerance


def dense_sgpr(Kuu, Kux, Kut, Ktt, y, noise):
    """Titsias' optimal q(u) given data (Kux, y), pushed to test points (Kut, Ktt): the closed form, dense."""
    Sigma = Kuu + Kux @ Kux.mT / noise
    mean = Kut.mT @ torch.linalg.solve(Sigma, Kux @ y) / noise
    covar = Ktt - Kut.mT @ torch.linalg.solve(Kuu, Kut) + Kut.mT @ torch.linalg.solve(Sigma, Kut)
    return mean, covar


@pytest.mark.parametrize("method", ["spectral", "recurrence"])
def test_online_sgpr_with_each_backend_equals_the_dense_closed_form(method):
    # fixed hyperparameters and variables: after two tasks the online posterior is batch SGPR on all data
    kernel = scaled_rbf(lengthscale=0.6, outputscale=1.3)
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(DT)
    likelihood.noise = 0.05
    gen = torch.Generator().manual_seed(1)
    x = torch.sort(torch.rand(120, generator=gen, dtype=DT) * 5).values
    y = torch.cos(2 * x) + 0.2 * torch.randn(120, generator=gen, dtype=DT)
    kwargs = dict(method="recurrence", features="quadrature", num_rff=200, dt=0.01) if method == "recurrence" else {}
    ivars = HiPPOInducingVariables(20, "legs", t=5.0, **kwargs)
    model = OnlineSGPR(ivars, kernel, likelihood)
    model.update(x[:60], y[:60])
    model.update(x[60:], y[60:])
    x_test = torch.linspace(0, 5, 30, dtype=DT)
    with torch.no_grad():
        predictive = model(x_test)
        Kuu = ivars.Kuu(kernel).to_dense()
        Kuf = ivars.Kuf(kernel, torch.cat([x, x_test]))
        mean, covar = dense_sgpr(Kuu, Kuf[:, :120], Kuf[:, 120:], kernel(x_test).to_dense(), y, 0.05)
    torch.testing.assert_close(predictive.mean, mean, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(predictive.covariance_matrix, covar, rtol=1e-5, atol=1e-7)


def test_online_sgpr_predictive_covariance_is_low_rank():
    # variances at many points must not build an N x N matrix
    kernel = scaled_rbf()
    model = OnlineSGPR(HiPPOInducingVariables(16, "legs", t=4.0), kernel, gpytorch.likelihoods.GaussianLikelihood().to(DT))
    x = torch.linspace(0, 4, 50, dtype=DT)
    model.update(x, torch.sin(x))
    x_many = torch.linspace(0, 4, 100_000, dtype=DT)
    with torch.no_grad():
        predictive = model(x_many)
        variance = predictive.variance  # O(N M) memory; a dense covariance would be 80 GB
        small = model(x_many[::5000])
    assert variance.shape == (100_000,)
    torch.testing.assert_close(variance[::5000], small.covariance_matrix.diagonal(), rtol=1e-10, atol=1e-12)
    assert (variance > 0).all()


def test_to_dtype_deepcopy_and_state_dict_round_trip_for_every_backend():
    kernel = scaled_rbf()
    for method in ("spectral", "quadrature", "recurrence"):
        ivars = HiPPOInducingVariables(6, "legs", t=3.0, method=method, num_rff=64)
        ivars.advance(4.0)
        with torch.no_grad():
            reference = ivars.Kuu(kernel).to_dense()
        torch.testing.assert_close(copy.deepcopy(ivars).Kuu(kernel).to_dense().detach(), reference)
        fresh = HiPPOInducingVariables(6, "legs", t=1.0, method=method, num_rff=64)
        fresh.load_state_dict(ivars.state_dict())
        torch.testing.assert_close(fresh.Kuu(kernel).to_dense().detach(), reference)
        K32 = copy.deepcopy(ivars).float().Kuu(scaled_rbf(dtype=torch.float32)).to_dense().detach()
        assert K32.dtype == torch.float32
        torch.testing.assert_close(K32.double(), reference, rtol=2e-4, atol=1e-5)


def test_default_quadrature_resolves_high_order_bases_on_short_streams():
    # M = 150 basis functions over only 8 length scales: the old rule (2 panels per length scale,
    # 12 nodes each) missed Kuu by 27%; a 200-panel, 20-node rule is the reference here
    kernel = scaled_rbf(lengthscale=1.0, outputscale=1.0)
    default = HiPPOInducingVariables(150, "legs", t=8.0, method="quadrature", jitter=0.0).Kuu(kernel).to_dense()
    fine = HiPPOInducingVariables(150, "legs", t=8.0, method="quadrature", jitter=0.0, num_panels=200, num_nodes=20)
    assert rel(default, fine.Kuu(kernel).to_dense()) < 1e-11


def test_quadrature_features_for_the_multidimensional_path_beat_random_ones():
    # the path memory with a 2-D tensor-product frequency rule (~1600 nodes) vs 40,000 random features,
    # both against thesis eq. multi_dim_hippo_kfu with the exact kernel along the stored path
    from gpytorch_hippo import HiPPO

    gen = torch.Generator().manual_seed(0)
    kernel = gpytorch.kernels.RBFKernel(ard_num_dims=2).to(DT)
    kernel.lengthscale = torch.tensor([[0.8, 1.2]], dtype=DT)
    path = torch.randn(40, 2, generator=gen, dtype=DT) * 0.5
    x_new = torch.randn(5, 2, generator=gen, dtype=DT)
    exact = HiPPO("legs", 6).final_state(kernel(x_new, path).to_dense(), 0.05 * torch.arange(1, 41, dtype=DT))
    errors = {}
    for features, num_rff in (("quadrature", 1600), ("random", 40_000)):
        ivars = HiPPOInducingVariables(6, "legs", input_dim=2, dt=0.05, num_rff=num_rff, features=features, seed=1)
        ivars.append_path(path[:25])
        ivars.append_path(path[25:], kernel=kernel)
        with torch.no_grad():
            errors[features] = (ivars.Kuf(kernel, x_new).mT - exact).abs().max().item()
    assert errors["quadrature"] < 1e-8
    assert errors["random"] > 1e-4
    with pytest.raises(TypeError, match="product spectral density"):
        matern = HiPPOInducingVariables(6, "legs", input_dim=2, num_rff=100, features="quadrature")
        matern.append_path(path)
        matern.Kuu(gpytorch.kernels.MaternKernel(nu=1.5, ard_num_dims=2).to(DT))


def test_spectral_kuf_in_blocks_equals_one_block():
    # more inputs than one 2^24-entry block of features holds: the blocks must join seamlessly
    kernel = scaled_rbf(lengthscale=0.02)  # t/l = 400: ~1000 frequency nodes, so ~8,000 inputs per block
    ivars = HiPPOInducingVariables(8, "legs", t=8.0)
    x = torch.linspace(0, 8, 20_001, dtype=DT)
    with torch.no_grad():
        blocked = ivars.Kuf(kernel, x)
        single = torch.cat([ivars.Kuf(kernel, x[i : i + 5000]) for i in range(0, 20_001, 5000)], dim=-1)
    torch.testing.assert_close(blocked, single, rtol=1e-12, atol=1e-14)
    quadrature = HiPPOInducingVariables(8, "legs", t=8.0, method="quadrature").Kuf(kernel, x[::2000]).detach()
    assert rel(blocked[:, ::2000], quadrature) < 1e-10


def test_quadrature_kuf_in_blocks_equals_one_block(monkeypatch):
    """Blocks of k(x, nodes) (batched inputs too) join seamlessly: compare with one block."""
    from gpytorch_hippo.inducing import hippo_backends

    kernel = scaled_rbf(lengthscale=0.5)
    ivars = HiPPOInducingVariables(6, "legs", t=4.0, method="quadrature")
    x = torch.rand(2, 37, 1, generator=torch.Generator().manual_seed(0), dtype=DT) * 5
    with torch.no_grad():
        single = ivars.Kuf(kernel, x)
        monkeypatch.setattr(hippo_backends, "QUADRATURE_CHUNK_ENTRIES", 10 * ivars.backends["quadrature"].rule(ivars, kernel)[0].shape[0])
        blocked = ivars.Kuf(kernel, x)  # blocks of 10 inputs: 4 blocks, the last one short
    assert blocked.shape == (2, 6, 37)
    torch.testing.assert_close(blocked, single, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("features", ["quadrature", "random"])
def test_path_features_bound_gradient_equals_finite_differences(features):
    """The collapsed bound on path variables (three input dimensions): its autograd gradient in every
    hyperparameter equals central differences. (With the quadrature nodes held fixed while the length
    scales moved, the length-scale gradients were off by up to 9x and L-BFGS stopped ABNORMAL.)"""
    from gpytorch_hippo.ordering import order_inputs

    generator = torch.Generator().manual_seed(0)
    x = torch.rand(10, 3, generator=generator, dtype=DT)
    y = torch.sin(3 * x.sum(-1))
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=3)).to(DT)
    kernel.base_kernel.lengthscale = torch.tensor([0.4, 0.7, 1.1], dtype=DT)
    ivars = HiPPOInducingVariables(16, "legs", input_dim=3, features=features, num_rff=1000)
    model = OnlineSGPR(ivars, kernel, gpytorch.likelihoods.GaussianLikelihood(), gpytorch.means.ConstantMean()).to(DT)
    ivars.append_path(x[order_inputs(x, "kernel_max", kernel=kernel)], kernel=kernel)
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    gradients = torch.autograd.grad(model.log_bound(x, y), [p for _, p in named])
    step = 1e-5
    for (name, parameter), gradient in zip(named, gradients):
        for i in range(parameter.numel()):
            with torch.no_grad():
                parameter.view(-1)[i] += step
                up = model.log_bound(x, y)
                parameter.view(-1)[i] -= 2 * step
                down = model.log_bound(x, y)
                parameter.view(-1)[i] += step
            assert gradient.view(-1)[i].item() == pytest.approx(((up - down) / (2 * step)).item(), rel=1e-4, abs=1e-6), name


def seasonal(trend=None, period=24.0, ell=0.8):
    """``ScaleKernel(PeriodicKernel())``, plus a scaled trend kernel if one is given (a forecaster's additive kernel)."""
    periodic = gpytorch.kernels.ScaleKernel(gpytorch.kernels.PeriodicKernel()).to(DT)
    periodic.base_kernel.period_length, periodic.base_kernel.lengthscale, periodic.outputscale = period, ell, 1.3
    if trend is None:
        return periodic
    trend = gpytorch.kernels.ScaleKernel(trend).to(DT)
    trend.base_kernel.lengthscale, trend.outputscale = 30.0, 0.5
    return trend + periodic


def test_periodic_lines_truncation_bound():
    """The lines are e^{-a} I_k(a) (SciPy) and reproduce the kernel within the stated bound, 2e-16 sigma^2 per value."""
    from gpytorch_hippo.inducing.covariances import periodic_lines

    r = torch.linspace(0, 100, 2001, dtype=DT)
    for ell in (1e-3, 0.05, 0.8, 100.0):
        omega, q = periodic_lines(torch.tensor(1.0, dtype=DT), torch.tensor([ell], dtype=DT), torch.tensor(24.0))
        reference = scipy.special.ive(np.arange(q.numel()), 1 / ell) * np.where(np.arange(q.numel()) > 0, 2, 1)
        assert np.abs(q.numpy() - reference).max() < 1e-15
        dense = torch.exp(-2 * torch.sin(torch.pi * r / 24) ** 2 / ell)  # GPyTorch's formula (its distances lose 1e-8)
        lines = (q[:, None] * torch.cos(omega[:, None] * r)).sum(0)
        assert (lines - dense).abs().max() < 1e-13  # round-off of cos at large arguments; the truncation is below 2e-16
        assert q.numel() < 300


@pytest.mark.parametrize("measure", ["legs", "legt", "fout", "lagt"])
def test_periodic_kernel_by_its_spectral_lines_equals_quadrature_in_time(measure):
    """Kuu, Kuf and the cross covariance of an online update: the spectral lines against quadrature in time."""
    t = 300.0 if measure == "lagt" else 60.0
    spectral, quadrature = pair(measure, t, theta=30.0 if measure != "lagt" else 2.0)
    kernel = seasonal()
    assert spectral.backend_for(kernel).name == "spectral"
    x = torch.linspace(-5, t + 20, 50, dtype=DT)[:, None]
    assert rel(spectral.Kuu(kernel).to_dense(), quadrature.Kuu(kernel).to_dense()) < 1e-10
    assert rel(spectral.Kuf(kernel, x), quadrature.Kuf(kernel, x)) < 1e-10
    later_s, later_q = copy.deepcopy(spectral), copy.deepcopy(quadrature)
    later_s.advance(t + 10.0)
    later_q.advance(t + 10.0)
    assert rel(spectral.Kuu_cross(later_s, kernel), quadrature.Kuu_cross(later_q, kernel)) < 1e-10


def test_periodic_kernel_gradients_in_period_and_lengthscale_equal_quadrature_gradients():
    spectral, quadrature = pair("legs", 40.0)
    x = torch.linspace(0, 45, 20, dtype=DT)[:, None]
    grads = []
    for ivars in (spectral, quadrature):
        kernel = seasonal(period=7.0)
        (ivars.Kuu(kernel).to_dense().sum() + ivars.Kuf(kernel, x).sum()).backward()
        grads.append(torch.stack([p.grad.reshape(()) for p in kernel.parameters()]))
    assert rel(grads[0], grads[1]) < 1e-8


@pytest.mark.parametrize("trend", ["rbf", "matern"])
def test_trend_plus_season_streams_at_a_flat_cost_and_equals_the_dense_reference(trend, monkeypatch):
    """Matern/RBF trend + periodic season under method='lyapunov': each part by its own exact backend with a cost per task
    that does not grow (the Lyapunov state and the periodic lines; no quadrature in time is formed), the same
    predictions as the model whose covariances come from quadrature in time with the same kernel."""
    from gpytorch_hippo.inducing.hippo_backends import QuadratureBackend

    base = gpytorch.kernels.RBFKernel() if trend == "rbf" else gpytorch.kernels.MaternKernel(nu=2.5)
    test_x = torch.linspace(0, 150, 101, dtype=DT)[:, None]

    def stream(method):
        likelihood = gpytorch.likelihoods.GaussianLikelihood().to(DT)
        likelihood.noise = 0.01
        model = OnlineSGPR(
            HiPPOInducingVariables(48, "legs", t=24.0, method=method),
            seasonal(copy.deepcopy(base)),
            likelihood,
            captured_variance_warning=None,
        )
        for day in range(5):
            x = torch.arange(24 * day, 24 * day + 24, dtype=DT)[:, None] + 0.5
            if day:
                model.inducing_variables.advance(24.0 * (day + 1))
            model.update(x, torch.sin(2 * torch.pi * x[:, 0] / 24) + 0.01 * x[:, 0])
        model.eval()
        with torch.no_grad():
            posterior = model(test_x)
        return posterior.mean, posterior.variance

    reference = stream("quadrature")
    with monkeypatch.context() as patched:
        patched.setattr(QuadratureBackend, "cross", lambda *args: pytest.fail("quadrature in time on the flat-cost path"))
        ours = stream("lyapunov")
    assert HiPPOInducingVariables(8, "legs", t=24.0, method="lyapunov").backend_for(seasonal(base)).name == "additive"
    assert (ours[0] - reference[0]).abs().max() < 1e-5 and (ours[1] - reference[1]).abs().max() < 1e-5


def test_a_collapsing_periodic_length_scale_is_a_named_cost_error():
    """A periodic length scale driven towards 0 (e.g. by a fit) would need ever more harmonics: the named error, saying
    what to constrain, instead of a loop that exhausts the memory."""
    from gpytorch_hippo.inducing.cost import CovarianceCostError

    kernel = seasonal(ell=1e-6)
    with pytest.raises(CovarianceCostError, match="GreaterThan"):
        HiPPOInducingVariables(8, "legs", t=4.0).Kuu(kernel)


def quasi_periodic(envelope="matern", period=24.0, ell=6.0):
    """``ScaleKernel(PeriodicKernel() * MaternKernel())`` (or RBF): a season whose shape drifts over ``ell``."""
    decay = gpytorch.kernels.MaternKernel(nu=2.5) if envelope == "matern" else gpytorch.kernels.RBFKernel()
    periodic = gpytorch.kernels.PeriodicKernel()
    kernel = gpytorch.kernels.ScaleKernel(periodic * decay).to(DT)
    periodic.period_length, periodic.lengthscale, decay.lengthscale, kernel.outputscale = period, 0.8, ell, 1.3
    return kernel


@pytest.mark.parametrize("envelope", ["matern", "rbf"])
def test_quasi_periodic_product_streams_at_a_flat_cost_and_equals_the_reference(envelope, monkeypatch):
    """Matérn/RBF x periodic under method='lyapunov', streamed in daily tasks: the kernel values each task evaluates
    stop growing once the stream is longer than the kernel's reach (no quadrature in time over [0, t]), and the
    predictions equal those of the same stream whose covariances come from quadrature in time with the same kernel."""
    from gpytorch.kernels import ProductKernel

    from gpytorch_hippo.inducing import covariances
    from gpytorch_hippo.inducing.hippo_backends import QuadratureBackend

    evaluated = [0]

    def counting(spec):
        def values(r, outputscale, lengthscale):
            evaluated[-1] += r.numel()
            return spec.values(r, outputscale, lengthscale)

        return None if spec is None else dataclasses.replace(spec, values=values)

    days = 6
    x = torch.arange(24 * days, dtype=DT)[:, None] + 0.5
    noise = 0.1 * torch.randn(x.shape[0], generator=torch.Generator().manual_seed(0), dtype=DT)
    y = torch.sin(2 * torch.pi * x[:, 0] / 24) * torch.cos(x[:, 0] / 40) + noise
    test_x = torch.linspace(0, 24 * days + 10, 61, dtype=DT)[:, None]

    def stream(method):
        likelihood = gpytorch.likelihoods.GaussianLikelihood().to(DT)
        likelihood.noise = 0.01
        model = OnlineSGPR(HiPPOInducingVariables(32, "legs", t=24.0, method=method), quasi_periodic(envelope, ell=3.0), likelihood)
        for day in range(days):
            if day:
                model.inducing_variables.advance(24.0 * (day + 1))
            evaluated.append(0)
            model.update(x[24 * day : 24 * day + 24], y[24 * day : 24 * day + 24])
        model.eval()
        with torch.no_grad():
            posterior = model(test_x)
        return model, posterior.mean, posterior.variance

    reference = stream("quadrature")
    with monkeypatch.context() as patched:
        registered = covariances._REGISTRY.get(ProductKernel, lambda kernel: None)
        patched.setitem(covariances._REGISTRY, ProductKernel, lambda kernel: counting(registered(kernel)))
        patched.setattr(QuadratureBackend, "cross", lambda *args: pytest.fail("quadrature in time on the flat-cost path"))
        evaluated = [0]
        ours = stream("lyapunov")
    assert ours[0].inducing_variables.backend_for(ours[0].covar_module).name == "lyapunov"
    per_task = evaluated[1:]
    # Matérn-5/2 with l = 3 h reaches 65 h (RBF: 28 h): from the fourth day on a task's work does not depend on t
    assert max(per_task[-3:]) <= 1.15 * min(per_task[-3:]), per_task  # panel edges move with t: +-6 %
    assert (ours[1] - reference[1]).abs().max() < 1e-6 and (ours[2] - reference[2]).abs().max() < 1e-6


@pytest.mark.parametrize("envelope", ["matern", "rbf"])
def test_quasi_periodic_product_on_small_data_equals_the_exact_gp(envelope):
    """On half a day of data, 64 LegS variables with a small jitter capture the quasi-periodic GP: the predictions of
    OnlineSGPR (method='lyapunov') equal GPyTorch's ExactGP with the same kernel."""

    class ExactGP(gpytorch.models.ExactGP):
        def __init__(self, x, y, likelihood, kernel):
            super().__init__(x, y, likelihood)
            self.mean_module, self.covar_module = gpytorch.means.ZeroMean(), kernel

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    x = torch.linspace(0.25, 11.75, 24, dtype=DT)[:, None]
    y = torch.sin(2 * torch.pi * x[:, 0] / 24) + 0.1 * torch.randn(24, generator=torch.Generator().manual_seed(0), dtype=DT)
    likelihoods = [gpytorch.likelihoods.GaussianLikelihood().to(DT) for _ in range(2)]
    for likelihood in likelihoods:
        likelihood.noise = 0.01
    ivars = HiPPOInducingVariables(64, "legs", t=12.0, method="lyapunov", jitter=1e-11)
    model = OnlineSGPR(ivars, quasi_periodic(envelope), likelihoods[0], captured_variance_warning=None)
    model.update(x, y)
    exact = ExactGP(x[:, 0], y, likelihoods[1], quasi_periodic(envelope))
    model.eval()
    exact.eval()
    test_x = torch.linspace(0, 12, 41, dtype=DT)
    with torch.no_grad(), gpytorch.settings.fast_computations(False, False, False):
        ours, dense = model(test_x[:, None]), exact(test_x)
    assert (ours.mean - dense.mean).abs().max() < 1e-6 and (ours.variance - dense.variance).abs().max() < 1e-6


def test_quasi_periodic_gradients_equal_quadrature_gradients():
    """Gradients of Kuu and Kuf in every hyperparameter (both length scales, the period, the output scale): the flat-cost
    backend (its exact restart, banded in time) against quadrature in time."""
    x = torch.linspace(0, 45, 20, dtype=DT)[:, None]
    grads = []
    for method in ("lyapunov", "quadrature"):
        ivars = HiPPOInducingVariables(16, "legs", t=40.0, method=method, jitter=0.0)
        kernel = quasi_periodic(period=7.0)
        (ivars.Kuu(kernel).to_dense().sum() + ivars.Kuf(kernel, x).sum()).backward()
        grads.append(torch.stack([p.grad.reshape(()) for p in kernel.parameters()]))
    assert grads[0].abs().min() > 0 and rel(grads[0], grads[1]) < 1e-8


def test_a_product_the_backends_cannot_take_is_a_named_error_naming_the_backend_that_can():
    """RBF x Matérn (no periodic factor) under method='lyapunov': the named error says which kernels it takes (a Matérn
    or RBF kernel times a periodic one) and that method='quadrature' takes any kernel."""
    from gpytorch_hippo.inducing import UnsupportedKernelError

    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel() * gpytorch.kernels.MaternKernel()).to(DT)
    with pytest.raises(UnsupportedKernelError, match="method='lyapunov' does not take") as error:
        HiPPOInducingVariables(8, "legs", t=4.0, method="lyapunov").Kuu(kernel)
    assert "method='quadrature'" in str(error.value) and "PeriodicKernel() * MaternKernel()" in str(error.value)
    assert HiPPOInducingVariables(8, "legs", t=4.0).backend_for(kernel).name == "quadrature"
