"""``gpytorch_hippo`` follows the device and dtype of its inputs and modules.

Every test builds the same seeded problem twice -- in float64 on the CPU (the reference) and on
``device`` in ``device_dtype`` (fixtures of ``tests/conftest.py``: float64 on CUDA where a GPU is
available, float32 on the CPU) -- and checks that the results live on ``device``, have its dtype, and
equal the reference.  Tolerances on CUDA: the HiPPO recurrences and covariances are sums of a few
hundred float64 products, whose order differs between CPU and CUDA kernels (round-off ``~1e-14``
relative, checked at ``1e-10``); the GP posteriors go through Cholesky factors of ``Kuu`` whose
condition number is at most ``M / jitter ~ 1e7`` with the relative jitter, which can amplify that
round-off to ``~1e-9`` (checked at ``1e-7`` relative).  In float32 on the CPU: the memories and
covariances agree to a few float32 round-offs (``~5e-7``, checked at ``2e-5`` relative, ``2e-6``
absolute); the online models keep their summary in float64, so their float32 outputs differ from
the float64 ones by the float32 inputs and kernel matrices (``4e-5`` relative for the random-feature
recurrence, checked at ``2e-4``).  Point and Fourier inducing variables get one jitter in both
dtypes.  The cache tests check that a cache built for one device/dtype is not reused for another.
"""

import copy

import gpytorch
import pytest
import torch

from gpytorch_hippo import (
    FourierInducingVariables,
    HiPPO,
    HiPPOInducingVariables,
    InducingPoints,
    InterdomainVariationalStrategy,
    OnlineELBO,
    OnlineSGPR,
    order_inputs,
    sample_reconstruction,
)
from gpytorch_hippo.metrics import gaussian_nlpd, interval_ece, rmse

DT = torch.float64
CPU = torch.device("cpu")
EXACT = dict(rtol=1e-10, atol=1e-12)
POSTERIOR = dict(rtol=1e-7, atol=1e-9)
FLOAT32 = dict(rtol=2e-5, atol=2e-6)
FLOAT32_POSTERIOR = dict(rtol=2e-4, atol=1e-5)
JITTER = 1e-4  # point and Fourier inducing variables: one jitter in both dtypes (GPyTorch's: 1e-4 in float32, 1e-6 in float64)


def make_kernel(where, nu=None, dims=1, dtype=DT):
    base = gpytorch.kernels.RBFKernel() if nu is None else gpytorch.kernels.MaternKernel(nu=nu)
    if dims > 1:
        base = gpytorch.kernels.RBFKernel(ard_num_dims=dims)
    kernel = gpytorch.kernels.ScaleKernel(base).to(dtype)
    kernel.base_kernel.lengthscale = 0.5
    kernel.outputscale = 1.3
    return kernel.to(where)


def make_likelihood(where, dtype=DT):
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(dtype)
    likelihood.noise = 0.05
    return likelihood.to(where)


def stream(n=60, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.sort(torch.rand(n, generator=generator, dtype=DT) * 3).values
    return x, torch.sin(2 * x) + 0.1 * torch.randn(n, generator=generator, dtype=DT)


@pytest.mark.parametrize("measure", ["legs", "legt", "lagt", "fout"])
def test_hippo_scan_step_and_final_state_on_device(device, device_dtype, assert_matches_cpu, measure):
    def run(where, dtype):
        memory = HiPPO(measure, 9, theta=0.8).to(where)
        times = torch.linspace(0.05, 2.0, 50, dtype=dtype, device=where)
        signal = torch.stack([torch.sin(3 * times), times**2, torch.cos(times)])
        state = memory.initial_state(signal[:, 0], float(times[0]))
        for k in range(1, times.shape[0]):
            state = memory.step(state, signal[:, k], float(times[k - 1]), float(times[k]), f_prev=signal[:, k - 1])
        kernel = memory.kernel(times)
        assert kernel.dtype == DT  # float64 by design, whatever the signal's dtype
        return memory.scan(signal, times), memory.final_state(signal, times), state, kernel.to(dtype)

    assert_matches_cpu(run(device, device_dtype), run(CPU, DT), **EXACT, float32=FLOAT32)


def test_hippo_grid_cache_is_rebuilt_for_another_device_and_dtype(device):
    """The per-grid caches (step matrices, the HiPPO kernel) built on the CPU for float32 signals are
    not reused after ``.to(device)`` with float64 signals: results equal a fresh memory's."""
    times = torch.linspace(0.0, 1.0, 40, dtype=DT)
    signal = torch.randn(2, 40, generator=torch.Generator().manual_seed(1), dtype=DT)
    memory = HiPPO("legs", 8)
    memory.scan(signal.float(), times)
    memory.final_state(signal.float(), times)
    memory.to(device)
    got = memory.scan(signal.to(device), times.to(device)), memory.final_state(signal.to(device), times.to(device))
    fresh = HiPPO("legs", 8).to(device)
    expected = fresh.scan(signal.to(device), times.to(device)), fresh.final_state(signal.to(device), times.to(device))
    for value, want in zip(got, expected):
        assert value.device.type == device.type and value.dtype == DT
        torch.testing.assert_close(value, want, rtol=1e-13, atol=1e-15)


def _hippo(method, **options):
    return lambda: HiPPOInducingVariables(8, "legs", t=1.5, method=method, **options)


def _moved_hippo(ivars, where, dtype):
    old = copy.deepcopy(ivars)
    ivars.advance(2.5)
    return old


def _moved_points(ivars, where, dtype):
    return InducingPoints(ivars.points.detach() + 0.1, jitter=JITTER)


def _points_for_fourier(ivars, where, dtype):
    return InducingPoints(torch.linspace(0.2, 2.8, 5, dtype=dtype)[:, None], jitter=JITTER).to(where)


BACKENDS = {
    # name: (make the variables, kernel nu, how to get a second set for Kuu_cross)
    "points": (lambda: InducingPoints(torch.linspace(0, 3, 7, dtype=DT)[:, None], jitter=JITTER), None, _moved_points),
    "hippo-quadrature": (_hippo("quadrature"), None, _moved_hippo),
    "hippo-spectral": (_hippo("spectral"), None, _moved_hippo),
    "hippo-banded": (_hippo("spectral"), 1.5, _moved_hippo),  # Matérn: the banded backend
    "hippo-recurrence": (_hippo("recurrence", num_rff=200, dt=0.01), None, _moved_hippo),
    "fourier": (lambda: FourierInducingVariables(3, 0.0, 3.0, jitter=JITTER), 1.5, _points_for_fourier),
}


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_inducing_variable_covariances_on_device(device, device_dtype, assert_matches_cpu, backend):
    make, nu, second_set = BACKENDS[backend]

    def run(where, dtype):
        kernel = make_kernel(where, nu, dtype=dtype)
        ivars = make().to(dtype).to(where)
        x = torch.linspace(0.1, 2.9, 23, dtype=dtype, device=where)[:, None]
        before = ivars.Kuu(kernel).to_dense(), ivars.Kuf(kernel, x)
        other = second_set(ivars, where, dtype)
        return before, ivars.Kuu(kernel).to_dense(), ivars.Kuf(kernel, x), ivars.Kuu_cross(other, kernel)

    if backend == "hippo-banded":
        assert type(make().backend_for(make_kernel(CPU, nu))).__name__ == "BandedBackend"
    assert_matches_cpu(run(device, device_dtype), run(CPU, DT), **EXACT, float32=FLOAT32)


def test_path_inducing_variables_on_device(device, device_dtype, assert_matches_cpu):
    """Multidimensional inputs (thesis §4.4): the random-feature path memory, folded across two tasks."""

    def run(where, dtype):
        kernel = make_kernel(where, dims=2, dtype=dtype)
        generator = torch.Generator().manual_seed(2)
        first, second = (torch.rand(15, 2, generator=generator, dtype=DT).to(where, dtype) for _ in range(2))
        ivars = HiPPOInducingVariables(6, "legs", input_dim=2, num_rff=150).to(where)
        ivars.append_path(first)
        old = copy.deepcopy(ivars)
        ivars.append_path(second, kernel=kernel)
        x = torch.rand(9, 2, generator=generator, dtype=DT).to(where, dtype)
        return ivars.Kuu(kernel).to_dense(), ivars.Kuf(kernel, x), ivars.Kuu_cross(old, kernel)

    assert_matches_cpu(run(device, device_dtype), run(CPU, DT), **EXACT, float32=FLOAT32)


@pytest.mark.parametrize("method", ["quadrature", "spectral", "recurrence", "lyapunov"])
def test_inducing_variable_caches_are_not_reused_across_devices_and_dtypes(device, method):
    """Covariances cached while a float32 kernel was used on the CPU are rebuilt after moving the
    variables and the kernel to ``device`` in float64 (they equal a fresh set's)."""
    options = dict(num_rff=200, dt=0.01) if method == "recurrence" else {}
    x = torch.linspace(0.1, 1.4, 11, dtype=DT)[:, None]
    with torch.no_grad():
        ivars = HiPPOInducingVariables(8, "legs", t=1.5, method=method, **options)
        kernel32 = make_kernel(CPU, dtype=torch.float32)
        ivars.Kuu(kernel32), ivars.Kuf(kernel32, x.float())
        ivars.to(device)
        kernel = make_kernel(device)
        got = ivars.Kuu(kernel).to_dense(), ivars.Kuf(kernel, x.to(device))
        fresh = HiPPOInducingVariables(8, "legs", t=1.5, method=method, **options).to(device)
        expected = fresh.Kuu(kernel).to_dense(), fresh.Kuf(kernel, x.to(device))
    for value, want in zip(got, expected):
        assert value.device.type == device.type and value.dtype == DT
        torch.testing.assert_close(value, want, rtol=1e-12, atol=1e-14)


def _online_variables(method):
    if method == "points":
        return InducingPoints(torch.linspace(0, 3, 10, dtype=DT)[:, None], jitter=JITTER)
    options = dict(num_rff=300, dt=0.01) if method == "recurrence" else {}
    return HiPPOInducingVariables(10, "legs", t=1.5, method=method, **options)


@pytest.mark.parametrize("method", ["points", "quadrature", "recurrence", "lyapunov"])
def test_online_sgpr_updates_predictions_and_samples_on_device(device, device_dtype, assert_matches_cpu, method):
    """OHSGPR/OSGPR over two tasks: bounds, predictive moments, metrics, and reconstructions drawn
    with a seeded CPU generator (the draws are made where the generator lives, then moved)."""

    def run(where, dtype):
        x, y = (v.to(where, dtype) for v in stream())
        model = OnlineSGPR(
            _online_variables(method).to(dtype).to(where),
            make_kernel(where, dtype=dtype),
            make_likelihood(where, dtype),
            captured_variance_warning=None,
        )
        first = x < 1.5
        bounds = [model.update(x[first], y[first])]
        if method != "points":
            model.inducing_variables.advance(3.0)
        bounds.append(model.update(x[~first], y[~first]))
        model.eval()
        grid = torch.linspace(0.0, 3.0, 31, dtype=dtype, device=where)
        with torch.no_grad():
            prediction = model.likelihood(model(grid))
        mean, variance = prediction.mean, prediction.variance
        truth = torch.sin(2 * grid)
        samples = mean + variance.sqrt() * torch.randn(200, 31, generator=torch.Generator().manual_seed(3), dtype=DT).to(where, dtype)
        metrics = rmse(mean, truth), gaussian_nlpd(mean, variance, truth), interval_ece(samples, truth)
        result = [bounds, mean, variance, metrics]
        if method != "points":
            # float64 whatever the model's dtype: the draws come from the stored float64 summary
            result.append(sample_reconstruction(model, grid[1:], 3, generator=torch.Generator().manual_seed(4)).to(dtype))
        return result

    assert_matches_cpu(run(device, device_dtype), run(CPU, DT), **POSTERIOR, float32=FLOAT32_POSTERIOR)


@pytest.mark.parametrize("rbf", [True, False], ids=["batched-lyapunov-engine", "per-stream-backends"])
def test_batched_streams_update_and_predict_on_device(device, device_dtype, assert_matches_cpu, rbf):
    """Three LegS streams with their own clocks and kernels as one batched model (RBF: the batched Lyapunov
    engine forms every stream's covariances where the kernel lives; Matérn: each stream's own backend)."""
    streams = torch.Size([3])

    def run(where, dtype):
        base = gpytorch.kernels.RBFKernel(batch_shape=streams) if rbf else gpytorch.kernels.MaternKernel(nu=1.5, batch_shape=streams)
        kernel = gpytorch.kernels.ScaleKernel(base, batch_shape=streams).to(device=where, dtype=dtype)
        kernel.base_kernel.lengthscale = torch.tensor([0.4, 0.7, 1.1], dtype=dtype, device=where).view(3, 1, 1)
        likelihood = gpytorch.likelihoods.GaussianLikelihood(batch_shape=streams).to(device=where, dtype=dtype)
        starts = torch.tensor([1.0, 1.5, 2.0], dtype=dtype)
        variables = HiPPOInducingVariables(10, "legs", t=starts, method="lyapunov", batch_shape=streams).to(dtype).to(where)
        model = OnlineSGPR(variables, kernel, likelihood, captured_variance_warning=None)
        generator = torch.Generator().manual_seed(5)
        bounds = []
        for k in range(3):
            if k > 0:
                model.inducing_variables.advance(starts + k)
            x = (starts + k - 1)[:, None] + torch.rand(3, 12, generator=generator, dtype=DT).to(dtype)
            y = torch.sin(2 * x) + 0.1 * torch.randn(3, 12, generator=generator, dtype=DT).to(dtype)
            bounds.append(model.update(x.to(where).unsqueeze(-1), y.to(where)))
        model.eval()
        grid = torch.linspace(0.5, 4.0, 9, dtype=dtype).expand(3, -1).unsqueeze(-1).to(where)
        with torch.no_grad():
            prediction = model(grid)
        return bounds, prediction.mean, prediction.variance

    assert_matches_cpu(run(device, device_dtype), run(CPU, DT), **POSTERIOR, float32=FLOAT32_POSTERIOR)


class OHSVGP(gpytorch.models.ApproximateGP):
    def __init__(self, inducing_variables):
        q = gpytorch.variational.NaturalVariationalDistribution(inducing_variables.num_inducing)
        super().__init__(InterdomainVariationalStrategy(self, inducing_variables, q, whitened=False))
        self.mean_module = gpytorch.means.ZeroMean()
        self.covar_module = make_kernel(CPU)

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def test_interdomain_strategy_with_online_elbo_on_device(device, device_dtype, assert_matches_cpu):
    """OHSVGP trained by natural gradients on the online ELBO over two tasks (``end_task``, ``advance``)."""

    def run(where, dtype):
        x, y = (v.to(where, dtype) for v in stream())
        torch.manual_seed(0)  # q(u)'s initial noise, drawn on the CPU before the move
        model = OHSVGP(HiPPOInducingVariables(10, "legs", t=1.5)).to(dtype).to(where).train()
        elbo = OnlineELBO(make_likelihood(where, dtype), model, num_data=int((x < 1.5).sum()))
        values = []
        for index, mask in enumerate([x < 1.5, x >= 1.5]):
            if index == 1:
                elbo.end_task(num_data=int(mask.sum()))
                model.variational_strategy.advance(3.0)
            optimizer = gpytorch.optim.NGD(model.variational_parameters(), num_data=int(mask.sum()), lr=1.0)
            for _ in range(2):
                optimizer.zero_grad()
                loss = -elbo(model(x[mask]), y[mask])
                loss.backward()
                optimizer.step()
                values.append(loss.detach())
        model.eval()
        with torch.no_grad():
            posterior = model(torch.linspace(0, 3, 21, dtype=dtype, device=where))
        return values, posterior.mean, posterior.variance

    assert_matches_cpu(run(device, device_dtype), run(CPU, DT), **POSTERIOR, float32=FLOAT32_POSTERIOR)


def test_strategy_eval_cache_is_rebuilt_for_another_dtype_and_device(device):
    """The eval-mode caches (``chol(Kuu)``, ``q(u)``) of a float32 CPU model are not reused once the
    model is moved to ``device`` in float64: predictions equal a fresh float64 model's.  (An earlier
    fingerprint compared values only -- ``torch.equal`` calls float32 and float64
    copies equal -- and the float32 Cholesky factor was reused; across devices it raised.)"""
    torch.manual_seed(0)
    model = OHSVGP(InducingPoints(torch.linspace(0, 3, 6)[:, None])).float().eval()
    x = torch.linspace(0, 3, 9)[:, None]
    with torch.no_grad():
        model(x)
        state = copy.deepcopy(model.state_dict())
        model.to(device=device, dtype=DT)
        got = model(x.to(device, DT))
        fresh = OHSVGP(InducingPoints(torch.zeros(6, 1))).float()
        fresh.load_state_dict(state)
        expected = fresh.to(device=device, dtype=DT).eval()(x.to(device, DT))
        torch.testing.assert_close(got.mean, expected.mean, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(got.covariance_matrix, expected.covariance_matrix, rtol=1e-12, atol=1e-14)
        # a fingerprint taken on another device (simulated by the meta device) invalidates the cache
        strategy = model.variational_strategy
        strategy._cache_fingerprint = [t.to("meta") for t in strategy._cache_fingerprint]
        again = model(x.to(device, DT))
    torch.testing.assert_close(again.mean, expected.mean, rtol=1e-12, atol=1e-14)
    assert again.mean.device.type == device.type


def test_order_inputs_on_device(device, device_dtype, assert_matches_cpu):
    """The random order from a seeded CPU generator and the greedy kernel orders, for inputs on ``device``."""

    def run(where, dtype):
        x = torch.rand(30, 2, generator=torch.Generator().manual_seed(5), dtype=DT).to(where, dtype)
        kernel = make_kernel(where, dims=2, dtype=dtype)
        return (
            order_inputs(x, "random", generator=torch.Generator().manual_seed(6)),
            order_inputs(x, "kernel_max", kernel=kernel),
            order_inputs(x, "kernel_min", kernel=kernel),
        )

    assert_matches_cpu(run(device, device_dtype), run(CPU, DT), rtol=0, atol=0)
