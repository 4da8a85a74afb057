"""Covariance dispatch by registration (gpytorch_hippo.inducing.covariances): a kernel class the package
does not know gets exact HiPPO covariances from one registration alone.

References: the quadrature backend (exact in time, any kernel; tested against adaptive quadrature in
test_inducing_hippo_variables.py), SciPy's adaptive quadrature for the spectral density written here, and the
built-in Matérn-1/2 kernel for a re-registered spec.
"""

import copy
import pickle

import gpytorch
import numpy as np
import pytest
import scipy.integrate
import torch

from gpytorch_hippo import HiPPOInducingVariables
from gpytorch_hippo.inducing.banded import BandedBackend
from gpytorch_hippo.inducing.covariances import (
    MATERN_SPECS,
    CovarianceBackend,
    StationaryKernelSpec,
    kernel_parts,
    register_stationary_kernel,
    supported_kernels,
    unregister_stationary_kernel,
)
from gpytorch_hippo.inducing.fourier import FourierInducingVariables
from gpytorch_hippo.inducing.hippo_backends import PathBackend, QuadratureBackend, RecurrenceBackend, SpectralBackend
from gpytorch_hippo.inducing.lyapunov import LyapunovBackend

DT = torch.float64


class CauchyKernel(gpytorch.kernels.Kernel):
    """``k(r) = 1 / (1 + r²/ℓ²)``: spectral density ``ℓ/2 e^{-ℓ|ω|}`` (exponential decay), algebraic decay in ``r``."""

    has_lengthscale = True

    def forward(self, x1, x2, diag=False, **params):
        r = self.covar_dist(x1.div(self.lengthscale), x2.div(self.lengthscale), diag=diag, **params)
        return 1 / (1 + r**2)


class ExponentialKernel(gpytorch.kernels.Kernel):
    """``k(r) = e^{-|r|/ℓ}`` (Matérn-1/2 written out, not a MaternKernel)."""

    has_lengthscale = True

    def forward(self, x1, x2, diag=False, **params):
        return torch.exp(-self.covar_dist(x1.div(self.lengthscale), x2.div(self.lengthscale), diag=diag, **params))


def cauchy_values(r, outputscale, lengthscale):
    return outputscale / (1 + (r.to(lengthscale.dtype) / lengthscale) ** 2)


def cauchy_density(omega, outputscale, lengthscale):
    ell = lengthscale.reshape(()).double()
    return outputscale.double() * ell / 2 * torch.exp(-ell * omega.abs())


# e^{-46} = 1e-20: the density is zero in float64 beyond Ω = 46/ℓ
CAUCHY = StationaryKernelSpec("cauchy", cauchy_values, spectral_density=cauchy_density, spectral_cutoff=46.0)


@pytest.fixture
def registered():
    register_stationary_kernel(CauchyKernel, CAUCHY)
    register_stationary_kernel(ExponentialKernel, MATERN_SPECS[0.5])
    try:
        yield
    finally:
        unregister_stationary_kernel(CauchyKernel)
        unregister_stationary_kernel(ExponentialKernel)


def make(kernel_class, lengthscale=0.5, outputscale=1.7, scaled=True):
    base = kernel_class().to(DT)
    base.lengthscale = lengthscale
    if not scaled:
        return base
    kernel = gpytorch.kernels.ScaleKernel(base).to(DT)
    kernel.outputscale = outputscale
    return kernel


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def test_the_registered_spectral_density_is_the_kernels(registered):
    kernel = make(CauchyKernel, scaled=False)
    _, outputscale, lengthscale, _ = kernel_parts(make(CauchyKernel))  # the ScaleKernel looked through
    assert float(outputscale.detach()) == pytest.approx(1.7) and float(lengthscale.detach()) == pytest.approx(0.5)
    one, half = torch.tensor(1.0, dtype=DT), torch.tensor([0.5], dtype=DT)
    density = lambda w: float(cauchy_density(torch.tensor(w, dtype=DT), one, half))  # noqa: E731
    for r in (0.0, 0.3, 2.0):
        # a Fourier integral (QAWF) for r > 0
        value = 2 * (scipy.integrate.quad(density, 0, np.inf, weight="cos", wvar=r) if r else scipy.integrate.quad(density, 0, np.inf))[0]
        exact = kernel(torch.tensor([[0.0]], dtype=DT), torch.tensor([[r]], dtype=DT)).to_dense().item()
        assert value == pytest.approx(exact, rel=1e-9)
        assert float(cauchy_values(torch.tensor(r, dtype=DT), one, half)) == pytest.approx(exact)


def test_an_unregistered_kernel_keeps_the_named_errors():
    kernel = make(CauchyKernel)
    ivars = HiPPOInducingVariables(12, "legs", t=4.0, method="spectral", jitter=0.0)
    with pytest.raises(TypeError, match="RBFKernel, MaternKernel"):
        ivars.Kuu(kernel)
    with pytest.raises(TypeError, match="RBFKernel, MaternKernel"):
        HiPPOInducingVariables(12, "legs", t=4.0, method="lyapunov").Kuu(kernel)
    auto = HiPPOInducingVariables(12, "legs", t=4.0, jitter=0.0)
    assert auto.backend_for(kernel).name == "quadrature"  # any kernel: exact quadrature in time


@pytest.mark.parametrize("measure, t", [("legs", 8.0), ("legt", 8.0)])
def test_a_registered_kernel_gets_the_spectral_backend_exact_against_quadrature(registered, measure, t):
    kernel = make(CauchyKernel)
    assert "CauchyKernel" in supported_kernels()
    spectral = HiPPOInducingVariables(16, measure, t=t, theta=3.0, method="spectral", jitter=0.0)
    quadrature = HiPPOInducingVariables(16, measure, t=t, theta=3.0, method="quadrature", jitter=0.0)
    assert spectral.backend_for(kernel).name == "spectral"
    assert HiPPOInducingVariables(16, measure, t=t, theta=3.0).backend_for(kernel).name == "spectral"  # auto
    assert rel(spectral.Kuu(kernel).to_dense(), quadrature.Kuu(kernel).to_dense()) < 1e-10
    x = torch.linspace(-2.0, t + 3.0, 41, dtype=DT)  # inside and outside the support
    assert rel(spectral.Kuf(kernel, x), quadrature.Kuf(kernel, x)) < 1e-10
    later_s, later_q = copy.deepcopy(spectral), copy.deepcopy(quadrature)
    later_s.advance(t + 0.7)
    later_q.advance(t + 0.7)
    scale = quadrature.Kuu(kernel).to_dense().abs().max()
    assert ((spectral.Kuu_cross(later_s, kernel) - quadrature.Kuu_cross(later_q, kernel)).abs().max() / scale) < 1e-10
    # no Matérn nu, no reach: the backends that need them say so
    with pytest.raises(TypeError, match="lyapunov"):
        HiPPOInducingVariables(16, "legs", t=t, method="lyapunov").Kuu(kernel)
    with pytest.raises(TypeError, match="Fourier features"):
        HiPPOInducingVariables(16, "legs", t=t, method="recurrence", num_rff=64).Kuu(kernel)


def test_a_kernel_registered_with_the_matern_spec_gets_banded_lyapunov_and_vff(registered):
    kernel, matern = make(ExponentialKernel), gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=0.5)).to(DT)
    matern.base_kernel.lengthscale, matern.outputscale = 0.5, 1.7
    x = torch.linspace(-1.0, 9.0, 37, dtype=DT)
    # the kernel is the built-in Matérn-1/2 (whose banded covariances test_inducing_banded.py checks against
    # adaptive quadrature): the registration tells the truth
    pairs = torch.rand(50, 1, dtype=DT) * 6
    assert rel(kernel(pairs, x[:, None]).to_dense(), matern(pairs, x[:, None]).to_dense()) < 1e-10  # GPyTorch's distances
    auto = HiPPOInducingVariables(16, "legs", t=8.0, jitter=0.0)
    assert auto.backend_for(kernel).name == "banded"
    reference, reference_kuf = auto.Kuu(matern).to_dense(), auto.Kuf(matern, x)
    assert rel(auto.Kuu(kernel).to_dense(), reference) < 1e-13
    assert rel(auto.Kuf(kernel, x), reference_kuf) < 1e-13
    # quadrature in time (the kernel's own forward, no registration) converges slowly at the kink: close only
    quadrature = HiPPOInducingVariables(16, "legs", t=8.0, method="quadrature", jitter=0.0)
    assert rel(quadrature.Kuu(kernel).to_dense(), reference) < 1e-3
    lyapunov = HiPPOInducingVariables(16, "legs", t=4.0, method="lyapunov", jitter=0.0)
    with torch.no_grad():
        lyapunov.Kuu(kernel)
        lyapunov.advance(8.0)  # carried by the Lyapunov step
        assert rel(lyapunov.Kuu(kernel).to_dense(), reference) < 1e-10
        assert rel(lyapunov.Kuf(kernel, x), reference_kuf) < 1e-10
    vff = FourierInducingVariables(4, -1.0, 9.0, jitter=0.0)
    assert rel(vff.Kuu(kernel).to_dense(), vff.Kuu(matern).to_dense()) < 1e-14


def test_every_backend_has_the_declared_interface():
    for backend in (
        SpectralBackend(),
        BandedBackend(),
        QuadratureBackend(),
        RecurrenceBackend("random", "rff"),
        PathBackend("random"),
        LyapunovBackend(),
    ):
        assert isinstance(backend, CovarianceBackend)
        assert isinstance(backend.name, str)
    ivars = HiPPOInducingVariables(8, "legs", t=2.0)
    assert all(isinstance(b, CovarianceBackend) for b in ivars.backends.values())


def test_the_path_kernel_is_a_declared_reference_not_state():
    kernel = gpytorch.kernels.RBFKernel(ard_num_dims=2).to(DT)
    ivars = HiPPOInducingVariables(8, input_dim=2, num_rff=64)
    assert ivars._last_kernel is None
    ivars.append_path(torch.randn(5, 2, dtype=DT))
    ivars.Kuu(kernel)
    assert ivars._last_kernel is kernel and "_last_kernel" not in dict(ivars.named_modules())
    assert not any(key.startswith("_last_kernel") for key in ivars.state_dict())
    assert copy.deepcopy(ivars)._last_kernel is None and pickle.loads(pickle.dumps(ivars))._last_kernel is None
    ivars.append_path(torch.randn(4, 2, dtype=DT))  # folds the first task with the remembered kernel
    assert ivars.path_memory.shape[-1] == 8 and ivars.path_lengthscale.numel() == 2
    with pytest.raises(ValueError, match="kernel is required"):  # a copy forgot it: the default is explicit
        copy.deepcopy(ivars).append_path(torch.randn(3, 2, dtype=DT))


def seasonal_kernel(periodic_only=False, batch=torch.Size([]), weekly=False):
    """Hourly data with a daily season: PeriodicKernel, or Matérn-3/2 x periodic (the forecaster's kernel), or daily x
    weekly periodic (a product no flat-cost backend takes)."""
    periodic = gpytorch.kernels.PeriodicKernel(batch_shape=batch)
    periodic.period_length = 24.0
    if periodic_only:
        return gpytorch.kernels.ScaleKernel(periodic, batch_shape=batch).to(DT)
    if weekly:
        week = gpytorch.kernels.PeriodicKernel()
        periodic.lengthscale, week.period_length, week.lengthscale = 2.0, 168.0, 2.0
        return gpytorch.kernels.ScaleKernel(periodic * week).to(DT)
    matern = gpytorch.kernels.MaternKernel(nu=1.5, batch_shape=batch)
    matern.lengthscale = 2.0
    return gpytorch.kernels.ScaleKernel(matern * periodic, batch_shape=batch).to(DT)


def hourly_task(day, streams=None):
    hours = torch.arange(24 * day, 24 * day + 24, dtype=DT) + 0.5
    x = hours.unsqueeze(-1) if streams is None else hours.expand(streams, 24).unsqueeze(-1)
    return x, torch.sin(2 * torch.pi * x[..., 0] / 24)


@pytest.mark.parametrize("streams", [None, 3])
def test_matern_times_periodic_under_lyapunov_is_taken_also_per_stream(streams):
    """Matérn x periodic (the forecaster's quasi-periodic kernel) is taken by method='lyapunov', with a batch shape too
    (each stream's slice is one quasi-periodic kernel); the periodic kernel alone is taken by its spectral lines."""
    from gpytorch_hippo import OnlineSGPR

    batch = torch.Size([]) if streams is None else torch.Size([streams])

    def model(method, periodic_only=False):
        ivars = HiPPOInducingVariables(16, "legs", t=24.0, method=method, batch_shape=batch if streams else None)
        likelihood = gpytorch.likelihoods.GaussianLikelihood(batch_shape=batch).to(DT)
        return OnlineSGPR(ivars, seasonal_kernel(periodic_only, batch), likelihood, captured_variance_warning=None)

    x, _ = hourly_task(0, streams)
    if streams:
        x = x + 0.1 * torch.arange(streams, dtype=DT)[:, None, None]  # each stream its own hours
    y = torch.sin(2 * torch.pi * x[..., 0] / 24)
    taken = model("lyapunov")
    taken.update(x, y)
    taken.eval()
    with torch.no_grad():
        assert bool(torch.isfinite(taken(x).mean).all())
    if streams is None:
        assert taken.inducing_variables.backend_for(taken.covar_module).name == "lyapunov"
        periodic = model("lyapunov", periodic_only=True)
        assert periodic.inducing_variables.backend_for(periodic.covar_module).name == "spectral"
        periodic.update(x, y)


def test_the_cost_error_of_a_product_only_quadrature_takes_gives_advice_for_that_kernel(monkeypatch):
    """Only the quadrature backend takes daily x weekly periodic, and on LegS bases over [0, t] its work grows with the
    stream; the error names the periodic factor and a fix that applies (not the times' offset or unit, nor a length
    scale collapsing: here neither is the cause). Following it (a window, theta) runs the same stream."""
    from gpytorch_hippo import OnlineSGPR
    from gpytorch_hippo.inducing import cost

    monkeypatch.setattr(cost, "MAX_ENTRIES", 2**20)  # the 1 GiB default is reached after about 40 days

    def stream(measure, **window):
        model = OnlineSGPR(
            HiPPOInducingVariables(16, measure, t=24.0, **window),
            seasonal_kernel(weekly=True),
            gpytorch.likelihoods.GaussianLikelihood().to(DT),
            captured_variance_warning=None,
        )
        for day in range(6):
            x, y = hourly_task(day)
            if day:
                model.inducing_variables.advance(24.0 * (day + 1))
            model.update(x, y)

    with pytest.raises(cost.CovarianceCostError) as error:
        stream("legs")
    message = str(error.value)
    assert "PeriodicKernel" in message and "method='quadrature'" in message and "theta" in message
    assert "ScaleKernel(MaternKernel()) + ScaleKernel(PeriodicKernel())" in message  # the flat-cost form of the kernel
    assert "GreaterThan" not in message and "Unix timestamps" not in message
    stream("legt", theta=48.0)  # the advised window: its bases cover [t - theta, t], the work stays bounded
