"""Bad input at the entry points of the HiPPO memory and the inducing variables: NaN/Inf, integer
and float32 inputs, times that cannot be represented, evaluations too large to run (they must
raise at once, before allocating), forecasts far past ``t`` with every backend, and saved states
loaded into differently configured objects."""

import json
import math
import os
import subprocess
import sys
import textwrap

import gpytorch
import pytest
import torch

from gpytorch_hippo._validation import floating_dtype
from gpytorch_hippo.hippo import HiPPO
from gpytorch_hippo.inducing import FourierInducingVariables, HiPPOInducingVariables, InducingPoints
from gpytorch_hippo.inducing.banded import BandedBackend
from gpytorch_hippo.inducing.cost import kernel_reach


@pytest.fixture(autouse=True)
def float64_by_default():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def rbf(lengthscale=0.4, outputscale=1.3, dtype=torch.float64):
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).to(dtype)
    kernel.base_kernel.lengthscale, kernel.outputscale = lengthscale, outputscale
    return kernel


def matern(nu=1.5, lengthscale=0.4, outputscale=1.3):
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=nu)).double()
    kernel.base_kernel.lengthscale, kernel.outputscale = lengthscale, outputscale
    return kernel


#: (method, kernel factory): every 1-D backend (spectral with a Matérn kernel is the banded rule)
BACKENDS = [
    ("spectral", rbf),
    ("spectral", matern),
    ("lyapunov", rbf),
    ("lyapunov", matern),
    ("quadrature", rbf),
    ("recurrence", rbf),
]
IDS = [f"{method}-{make.__name__}" for method, make in BACKENDS]


def variables(method, M=8, t=3.0, **options):
    if method == "recurrence":
        options.setdefault("num_rff", 64)
    return HiPPOInducingVariables(M, "legs", t=t, method=method, **options)


# ----------------------------------------------------------------------------- the shared validator
def test_floating_dtype_is_the_modules():  # tensor arguments: tests/test_shared_infrastructure.py
    assert floating_dtype(rbf(dtype=torch.float32)) == torch.float32
    assert floating_dtype(None, torch.float32) == torch.float32


# ----------------------------------------------------------------------------- the HiPPO memory
def test_scan_and_final_state_reject_nan_signals():
    memory = HiPPO("legs", 4)
    times = torch.linspace(0, 1, 5)
    signal = torch.tensor([0.0, 1.0, math.nan, 1.0, 0.0])
    with pytest.raises(ValueError, match="signal contains NaN"):
        memory.scan(signal, times)
    with pytest.raises(ValueError, match="signal contains NaN"):
        memory.final_state(signal, times)
    with pytest.raises(ValueError, match="initial_state contains infinite"):
        memory.final_state(torch.ones(5), times, initial_state=torch.full((4,), math.inf))


def test_step_with_an_integer_state_steps_in_floating_point():
    memory = HiPPO("legs", 4)
    expected = memory.step(torch.tensor([1.0, 0.0, 0.0, 0.0]), 1.0, 0.5, 1.0, f_prev=1.0)
    result = memory.step(torch.tensor([1, 0, 0, 0]), 1, 0.5, 1.0, f_prev=1)
    assert result.dtype == torch.float64 and expected.abs().sum() > 0
    torch.testing.assert_close(result, expected, rtol=0, atol=0)


@pytest.mark.parametrize("t_prev, t, name", [(0.5, math.inf, "t"), (math.nan, 1.0, "t_prev")])
def test_step_rejects_nonfinite_times(t_prev, t, name):
    with pytest.raises(ValueError, match=f"^{name} must be a finite number"):
        HiPPO("legt", 4).step(torch.zeros(4), 1.0, t_prev, t, f_prev=1.0)


def test_step_rejects_nonfinite_samples():
    memory = HiPPO("legt", 4)
    with pytest.raises(ValueError, match="f contains NaN"):
        memory.step(torch.zeros(4), math.nan, 0.5, 1.0, f_prev=1.0)
    with pytest.raises(ValueError, match="f_prev contains infinite"):
        memory.step(torch.zeros(4), 1.0, 0.5, 1.0, f_prev=math.inf)
    with pytest.raises(ValueError, match="x contains NaN"):
        memory.basis(torch.tensor([0.1, math.nan]), 1.0)


# ----------------------------------------------------------------------------- NaN inputs to Kuu/Kuf
NAN_X = torch.tensor([[0.1], [math.nan]])


@pytest.mark.parametrize("method, make", BACKENDS, ids=IDS)
def test_hippo_kuf_rejects_nan_inputs_with_every_backend(method, make):
    with pytest.raises(ValueError, match="x contains NaN"):
        variables(method).Kuf(make(), NAN_X)


def test_inducing_points_and_fourier_reject_nan_inputs():
    points = InducingPoints(torch.linspace(0, 1, 3))
    with pytest.raises(ValueError, match="x contains NaN"):
        points.Kuf(rbf(), NAN_X)
    with pytest.raises(ValueError, match="x contains NaN"):
        FourierInducingVariables(3, -1.0, 3.0).Kuf(matern(), NAN_X)
    with pytest.raises(ValueError, match="points contains NaN"):
        InducingPoints(torch.tensor([0.0, math.nan]))
    with torch.no_grad():
        points.points[1, 0] = math.nan  # a trained point that diverged
    with pytest.raises(ValueError, match="points contains NaN"):
        points.Kuu(rbf())


def test_kuu_rejects_a_diverged_lengthscale():
    kernel = rbf()
    with torch.no_grad():
        kernel.base_kernel.raw_lengthscale.fill_(math.nan)
    with pytest.raises(ValueError, match="lengthscale must be finite and positive"):
        variables("spectral").Kuu(kernel)


# ----------------------------------------------------------------------------- integer and float32 inputs
@pytest.mark.parametrize("method, make", BACKENDS, ids=IDS)
def test_integer_and_float32_inputs_are_promoted_to_the_kernel_dtype(method, make):
    ivars, kernel = variables(method), make()
    reference = ivars.Kuf(kernel, torch.tensor([[0.0], [1.0], [2.0]]))
    for x in (torch.tensor([[0], [1], [2]]), torch.tensor([[0.0], [1.0], [2.0]], dtype=torch.float32)):
        result = ivars.Kuf(kernel, x)
        assert result.dtype == torch.float64
        torch.testing.assert_close(result, reference, rtol=1e-12, atol=1e-14)


def test_inducing_points_accept_integer_points_and_inputs():
    kernel = rbf()
    reference = InducingPoints(torch.tensor([0.0, 1.0, 2.0]))
    integer = InducingPoints(torch.tensor([0, 1, 2]))
    assert integer.points.dtype == torch.get_default_dtype()
    torch.testing.assert_close(integer.Kuu(kernel).to_dense(), reference.Kuu(kernel).to_dense())
    x = torch.tensor([[1.0], [3.0]])
    for other in (torch.tensor([[1], [3]]), x.float()):
        result = reference.Kuf(kernel, other)
        assert result.dtype == torch.float64
        torch.testing.assert_close(result, reference.Kuf(kernel, x))


def test_fourier_features_accept_integer_inputs_in_the_kernel_dtype():
    features, kernel = FourierInducingVariables(3, -1.0, 3.0), matern()
    result = features.Kuf(kernel, torch.tensor([[0], [2]]))
    assert result.dtype == torch.float64
    torch.testing.assert_close(result, features.Kuf(kernel, torch.tensor([[0.0], [2.0]])))


@pytest.mark.parametrize(
    "variables_factory",
    [
        lambda: HiPPOInducingVariables(12, "legs", t=40.0, method="quadrature"),
        lambda: HiPPOInducingVariables(12, "legs", t=40.0, method="recurrence", num_rff=200),
        lambda: InducingPoints(torch.linspace(0.0, 40.0, 12)),
    ],
    ids=["quadrature", "recurrence", "points"],
)
def test_prediction_with_integer_and_float32_inputs(variables_factory):
    from gpytorch_hippo import OnlineSGPR

    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=1.5))
    kernel.base_kernel.lengthscale, kernel.outputscale = 5.0, 1.0
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    likelihood.noise = 0.1
    model = OnlineSGPR(variables_factory(), kernel, likelihood).double()
    x = torch.arange(40, dtype=torch.float64)
    model.update(x, torch.sin(x / 6), num_iter=0)
    model.eval()
    with torch.no_grad():
        reference = model(x).mean
        for inputs in (torch.arange(40), x.float()):
            torch.testing.assert_close(model(inputs).mean, reference, rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------- times that cannot be represented
@pytest.mark.parametrize(
    "options, message",
    [
        ({"t": math.inf}, "t must be a finite number"),
        ({"t": math.nan}, "t must be a finite number"),
        ({"t": 1e300}, "t must have magnitude at most"),
        ({"t": 1.0, "start": math.nan}, "start must be a finite number"),
        ({"t": 1.0, "dt": math.inf, "method": "recurrence"}, "dt must be a finite number"),
        ({"t": 1.0, "dt": 0.0, "method": "recurrence"}, "dt must be > 0"),
    ],
)
def test_constructor_rejects_nonfinite_times_at_once(options, message):
    with pytest.raises(ValueError, match=message):
        HiPPOInducingVariables(6, **options)


@pytest.mark.parametrize("t_new, message", [(math.inf, "t_new must be a finite number"), (1e300, "t_new must have magnitude at most")])
def test_advance_rejects_nonfinite_or_huge_times_at_once(t_new, message):
    ivars = HiPPOInducingVariables(6, t=1.0)
    with pytest.raises(ValueError, match=message):
        ivars.advance(t_new)
    assert ivars.t == 1.0  # nothing changed


# ----------------------------------------------------------------------------- cost guards (no hang, no runaway memory)
GUARD_SCRIPT = textwrap.dedent(r"""
    import json, resource, sys, time, warnings
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # 3 GiB: a runaway allocation fails here, not the machine
    warnings.simplefilter("ignore")
    import gpytorch, torch
    from gpytorch_hippo import HiPPOInducingVariables, OnlineSGPR
    torch.set_default_dtype(torch.float64)

    def kernel(kind, lengthscale):
        base = gpytorch.kernels.RBFKernel() if kind == "rbf" else gpytorch.kernels.MaternKernel(nu=1.5)
        k = gpytorch.kernels.ScaleKernel(base)
        k.base_kernel.lengthscale = lengthscale
        return k

    def readme_unix(lengthscale):  # the README's OHSGPR pattern with Unix timestamps (seconds) and start=0
        times = 1.7e9 + 86400.0 * torch.arange(365.0)
        k = kernel("matern", lengthscale)
        likelihood = gpytorch.likelihoods.GaussianLikelihood()
        model = OnlineSGPR(HiPPOInducingVariables(48, "legs", t=float(times[36])), k, likelihood).double()
        model.update(times[:36], torch.sin(times[:36] / 86400.0 / 20), num_iter=0)
        model.eval()
        return model(times[:40]).mean

    def case(name):
        kind, method, what, value = name.split(":")
        value = float(value)
        if what == "unix":  # t / lengthscale = 5.7e6
            ivars = HiPPOInducingVariables(20, "legs", t=1.7e9, method=method)
            return ivars.Kuu(kernel(kind, 300.0))
        if what == "lengthscale":  # a collapsed length scale
            ivars = HiPPOInducingVariables(20, "legs", t=10.0, method=method)
            return ivars.Kuu(kernel(kind, value))
        ivars = HiPPOInducingVariables(20, "legs", t=10.0, method=method)  # forecast far past t
        return ivars.Kuf(kernel(kind, 1.0), torch.tensor([[value]]))

    results = {}
    for name in sys.argv[1:]:
        start = time.perf_counter()
        try:
            if name.startswith("readme"):  # the README's lengthscale 10.0 (meant in days), or 10 days in seconds
                value = readme_unix(10.0 if name == "readme" else 864000.0)
            else:
                value = case(name)
            outcome = ["ok", float(value.abs().max()) if isinstance(value, torch.Tensor) else None]
        except Exception as error:
            outcome = [type(error).__name__, str(error)]
        results[name] = outcome + [time.perf_counter() - start]
    print(json.dumps(results))
""")


def run_guarded(cases, timeout=150):
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    completed = subprocess.run([sys.executable, "-c", GUARD_SCRIPT, *cases], capture_output=True, text=True, timeout=timeout, env=env)
    assert completed.returncode == 0, completed.stderr[-2000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


RAISING = [
    "rbf:spectral:unix:0",
    "matern:spectral:unix:0",
    "rbf:lyapunov:unix:0",
    "matern:lyapunov:unix:0",
    "rbf:quadrature:unix:0",
    "rbf:spectral:lengthscale:1e-8",
    "matern:spectral:lengthscale:1e-8",
    "rbf:lyapunov:lengthscale:1e-8",
    "rbf:quadrature:lengthscale:1e-8",
    "matern:quadrature:lengthscale:1e-8",
    "rbf:spectral:lengthscale:1e-4",
    "rbf:quadrature:lengthscale:1e-4",
    "readme",
]
FAR = [
    "rbf:spectral:far:1e5",
    "rbf:spectral:far:1e8",
    "rbf:lyapunov:far:1e8",
    "matern:lyapunov:far:1e3",
    "rbf:quadrature:far:1e8",
    "rbf:recurrence:far:1e8",
]


def test_oversized_evaluations_raise_at_once_with_advice_and_far_forecasts_cost_nothing():
    results = run_guarded(RAISING + FAR + ["readme-seconds"])
    for name in RAISING:
        kind, message, seconds = results[name]
        assert kind == "CovarianceCostError", (name, kind, message)
        assert "Shift the times" in message and "length scales" in message and "GreaterThan" in message, message
        assert seconds < 5, (name, seconds)
    assert "1.7e+08 kernel length scales" in results["readme"][1]
    # with the length scale in the same unit as the times (10 days in seconds, t/ℓ ≈ 2,000) it just works
    kind, value, seconds = results["readme-seconds"]
    assert kind == "ok" and math.isfinite(value) and seconds < 30, (kind, value, seconds)
    for name in FAR:
        kind, value, seconds = results[name]
        assert kind == "ok" and value == 0.0 and seconds < 5, (name, kind, value, seconds)


# ----------------------------------------------------------------------------- forecasts with every backend
def adaptive_kuf(kernel, t, M, times):
    """``∫_0^t k(x - s) φ_m(s) ds`` with ``φ_m = √(2m+1) P_m(2s/t - 1)/t`` by scipy's adaptive quadrature."""
    import scipy.integrate
    import scipy.special

    out = torch.zeros(M, times.shape[0])
    for n, x in enumerate(times.tolist()):

        def k(s):
            with torch.no_grad():
                return float(kernel(torch.tensor([[x]]), torch.tensor([[s]])).to_dense())

        for m in range(M):

            def integrand(s):
                return k(s) * math.sqrt(2 * m + 1) * scipy.special.eval_legendre(m, 2 * s / t - 1) / t

            points = [x] if 0 < x < t else None
            out[m, n] = scipy.integrate.quad(integrand, 0, t, points=points, epsabs=1e-13, limit=200)[0]
    return out


@pytest.mark.parametrize("method, make", BACKENDS, ids=IDS)
def test_every_backend_gives_zero_cross_covariance_beyond_the_kernels_reach(method, make):
    ivars, kernel = variables(method), make()
    reach = kernel_reach(kernel)
    far = torch.tensor([[ivars.t + 1.01 * reach], [ivars.t + 3 * reach], [ivars.t + 1e6]])
    assert torch.equal(ivars.Kuf(kernel, far), torch.zeros(8, 3))
    # the exact covariance there is below round-off: quadrature, which integrates every input, agrees
    reference = variables("quadrature").Kuf(kernel, far)
    assert reference.abs().max() < 1e-15


@pytest.mark.parametrize("method, make", BACKENDS, ids=IDS)
def test_mixtures_of_near_and_far_inputs(method, make):
    ivars, kernel = variables(method), make()
    reach = kernel_reach(kernel)
    near = torch.tensor([[0.2], [1.7], [ivars.t + 0.5]])
    mixed = torch.tensor([[0.2], [ivars.t + 5 * reach], [1.7], [ivars.t + 0.5], [-4 * reach]])
    expected = torch.zeros(8, 5)
    expected[:, [0, 2, 3]] = ivars.Kuf(kernel, near)
    torch.testing.assert_close(ivars.Kuf(kernel, mixed), expected, rtol=1e-9, atol=1e-12)
    if method != "recurrence":  # exact backends: against adaptive quadrature, split at the kernel's kink
        torch.testing.assert_close(ivars.Kuf(kernel, mixed), adaptive_kuf(kernel, ivars.t, 8, mixed[:, 0]), rtol=0, atol=1e-10)
    # batched inputs keep their shape
    batched = mixed.expand(2, 5, 1)
    torch.testing.assert_close(ivars.Kuf(kernel, batched), expected.expand(2, 8, 5), rtol=1e-9, atol=1e-12)


def test_far_forecast_keeps_gradients_of_the_near_inputs():
    ivars, kernel = variables("spectral"), rbf()
    x = torch.tensor([[1.0], [100.0]], requires_grad=True)
    ivars.Kuf(kernel, x).sum().backward()
    assert x.grad[0, 0] != 0 and x.grad[1, 0] == 0


def test_banded_local_rule_with_no_panel_in_reach():
    ivars, kernel = variables("lyapunov"), matern()
    out = BandedBackend().local_kuf(ivars, kernel, torch.tensor([ivars.t + 1e3]), torch.float64)
    assert torch.equal(out, torch.zeros(1, 8))


# ----------------------------------------------------------------------------- the saved state
@pytest.mark.parametrize(
    "saved_options, loaded_options, name",
    [
        ({"method": "lyapunov"}, {"method": "spectral"}, "method='lyapunov'"),
        ({"measure": "legt"}, {"measure": "legs"}, "measure='legt'"),
        ({"num_inducing": 6}, {"num_inducing": 5}, "num_inducing=6"),
        ({"jitter": 1e-3}, {}, "jitter=0.001"),
        ({"start": -1.0}, {}, "start=-1.0"),
    ],
)
def test_loading_a_state_into_a_differently_built_object_raises(saved_options, loaded_options, name):
    def build(options):
        options = {"num_inducing": 6, "measure": "legs", "t": 2.0, **options}
        return HiPPOInducingVariables(options.pop("num_inducing"), **options)

    saved = build(saved_options)
    saved.advance(3.0)
    with pytest.raises(ValueError, match=name.replace("(", r"\(")):
        build(loaded_options).load_state_dict(saved.state_dict())


def test_matching_and_older_states_load():
    saved = HiPPOInducingVariables(6, "legs", t=2.0, method="lyapunov")
    saved.advance(3.0)
    fresh = HiPPOInducingVariables(6, "legs", t=1.0, method="lyapunov")
    fresh.load_state_dict(saved.state_dict())
    assert fresh.t == 3.0
    kernel = rbf()
    torch.testing.assert_close(fresh.Kuu(kernel).to_dense(), saved.Kuu(kernel).to_dense())
    older = saved.state_dict()
    older["_extra_state"] = {"dt": older["_extra_state"]["dt"]}  # a state saved before the settings were recorded
    HiPPOInducingVariables(6, "legs", t=1.0, method="spectral").load_state_dict(older)
