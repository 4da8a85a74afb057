"""Independent streams with HiPPO bases as one batched ``OnlineSGPR``, each stream with its own clock:
each stream equals its own single-stream model (lyapunov and spectral backends) through ragged tasks,
a stream without points, per-stream ``advance`` and a ``state_dict`` reload."""

import copy
import importlib.util
import pathlib
import warnings

import gpytorch
import pytest
import torch

from gpytorch_hippo import HiPPOInducingVariables, InputsOutsideSupportError, OnlineSGPR
from gpytorch_hippo.inducing.batched import BatchedInducingVariables

DT = torch.float64
S, M = 3, 12
LENGTHSCALES = torch.tensor([0.6, 1.0, 2.0], dtype=DT)
NOISES = torch.tensor([0.01, 0.03, 0.1], dtype=DT)
STARTS = torch.tensor([2.0, 3.0, 2.5], dtype=DT)  # each stream's first clock


def kernel(batch=torch.Size([]), rbf=False):
    base = gpytorch.kernels.RBFKernel(batch_shape=batch) if rbf else gpytorch.kernels.MaternKernel(nu=1.5, batch_shape=batch)
    return gpytorch.kernels.ScaleKernel(base, batch_shape=batch).double()


def batched_model(method, rbf=False):
    k = kernel(torch.Size([S]), rbf)
    k.base_kernel.lengthscale = LENGTHSCALES.view(S, 1, 1)
    likelihood = gpytorch.likelihoods.GaussianLikelihood(batch_shape=torch.Size([S])).double()
    likelihood.noise = NOISES.view(S, 1)
    ivs = HiPPOInducingVariables(M, "legs", t=STARTS, method=method, batch_shape=torch.Size([S]))
    return OnlineSGPR(ivs, k, likelihood, captured_variance_warning=None)


def single_model(s, method, rbf=False):
    k = kernel(rbf=rbf)
    k.base_kernel.lengthscale = LENGTHSCALES[s]  # a float64 tensor: a Python float goes through float32
    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    likelihood.noise = NOISES[s]
    return OnlineSGPR(HiPPOInducingVariables(M, "legs", t=STARTS[s].item(), method=method), k, likelihood, captured_variance_warning=None)


def ragged_tasks(num_tasks=4, size=10, seed=0):
    """Stream s's task k lies in (clock_{k-1}, clock_k]; random points missing; stream 1 has no point in
    task 2 (its clock stays)."""
    generator = torch.Generator().manual_seed(seed)
    clocks, tasks = STARTS.clone(), []
    for k in range(num_tasks):
        ends = clocks + (0 if k == 0 else 1.5 + torch.arange(S, dtype=DT) * 0.5)
        mask = torch.rand(S, size, generator=generator) > 0.3
        if k == 2:
            mask[1] = False
            ends[1] = clocks[1]
        starts = torch.where(torch.full((S,), k == 0), torch.zeros(S, dtype=DT), clocks)
        x = starts.view(S, 1) + (ends - starts).view(S, 1) * torch.rand(S, size, generator=generator, dtype=DT)
        y = torch.sin(2 * x) + 0.05 * torch.randn(S, size, generator=generator, dtype=DT)
        tasks.append((ends.clone(), x.unsqueeze(-1), torch.where(mask, y, torch.nan), mask))
        clocks = ends
    return tasks


def assert_streams_equal_their_models(batched, singles, times) -> None:
    """Each stream's predictive mean and variance at ``times`` equal its single-stream model's to 1e-8."""
    test = times.expand(len(singles), len(times)).unsqueeze(-1)
    batched.eval()
    with torch.no_grad():
        joint = batched(test)
        for s, single in enumerate(singles):
            single.eval()
            alone = single(test[s])
            torch.testing.assert_close(joint.mean[s], alone.mean, rtol=0, atol=1e-8)
            torch.testing.assert_close(joint.variance[s], alone.variance, rtol=0, atol=1e-8)


@pytest.mark.parametrize("method, rbf", [("lyapunov", False), ("lyapunov", True), ("spectral", False)])
def test_each_stream_equals_its_own_model_with_its_own_clock(method, rbf):
    """With an RBF kernel the lyapunov streams' covariances come from one batched engine (the streams' own backends
    stay unused); with a Matérn kernel, stream by stream."""
    batched = batched_model(method, rbf)
    singles = [single_model(s, method, rbf) for s in range(S)]
    tasks = ragged_tasks()
    for k, (ends, x, y, mask) in enumerate(tasks):
        if k > 0:
            batched.inducing_variables.advance(ends)
            for s in range(S):
                if ends[s] > singles[s].inducing_variables.t:
                    singles[s].inducing_variables.advance(ends[s].item())
        before = [t.clone() for t in batched._stored_task()[2:]] if batched.has_posterior else None
        batched.update(x, y, mask=mask)
        for s in range(S):
            if mask[s].any():
                singles[s].update(x[s][mask[s]], y[s][mask[s]])
        if k == 2:  # stream 1 saw nothing: its stored posterior is exactly what it was
            assert all(torch.equal(old[1], new[1]) for old, new in zip(before, batched._stored_task()[2:]))
        if k == 1:  # save and reload in the middle of the stream, the single models too
            reloaded = batched_model(method, rbf)
            reloaded.load_state_dict(copy.deepcopy(batched.state_dict()))
            batched = reloaded
            for s in range(S):
                single = single_model(s, method, rbf)
                single.load_state_dict(copy.deepcopy(singles[s].state_dict()))
                singles[s] = single
    torch.testing.assert_close(batched.inducing_variables.t, torch.stack([torch.tensor(s.inducing_variables.t, dtype=DT) for s in singles]))
    assert_streams_equal_their_models(batched, singles, torch.linspace(0, 8, 30, dtype=DT))
    if method == "lyapunov":
        engine_used = all(s.backends["lyapunov"]._state is None for s in batched.inducing_variables.streams)
        assert engine_used == rbf


def test_first_task_fit_gives_each_stream_its_own_hyperparameters():
    """num_iter on the first task maximises the sum of the streams' bounds: each stream's bound and its
    gradient in that stream's hyperparameters equal those of its own model (the bounds do not interact),
    and a fit moves every stream's length scale."""
    ends, x, y, _ = ragged_tasks(1)[0]
    y = torch.sin(2 * x[..., 0]) + 0.05 * torch.randn(S, x.shape[1], generator=torch.Generator().manual_seed(1), dtype=DT)
    batched = batched_model("spectral")
    bounds = batched._bound_and_posterior(x, y)[0]
    bounds.sum().backward()
    for s in range(S):
        single = single_model(s, "spectral")
        bound = single._bound_and_posterior(x[s], y[s])[0]
        bound.backward()
        torch.testing.assert_close(bounds[s], bound, rtol=1e-10, atol=0)
        for name in ("base_kernel.raw_lengthscale", "raw_outputscale"):
            ours = batched.covar_module.get_parameter(name).grad[s].reshape(())
            theirs = single.covar_module.get_parameter(name).grad.reshape(())
            torch.testing.assert_close(ours, theirs, rtol=1e-8, atol=1e-12)
    batched.update(x, y, mask=torch.ones(S, x.shape[1], dtype=torch.bool), num_iter=10, optimizer="lbfgs")
    assert (batched.covar_module.base_kernel.lengthscale.view(S) - LENGTHSCALES).abs().min() > 1e-3


def test_errors_name_the_stream():
    batched = batched_model("lyapunov")
    ends, x, y, mask = ragged_tasks(1)[0]
    y = y.clone()
    y[2, int(mask[2].nonzero()[0])] = torch.nan
    with pytest.raises(ValueError, match=r"stream\(s\) \[2\]"):
        batched.update(x, y, mask=mask)
    late = x.clone()
    late[1, 0, 0] = STARTS[1] + 5.0  # beyond stream 1's clock (a forgotten advance)
    mask[1, 0] = True
    with pytest.raises(InputsOutsideSupportError, match="stream 1"):
        batched.update(late, torch.nan_to_num(y), mask=mask)
    with pytest.raises(ValueError, match="stream 0"):
        batched.inducing_variables.advance(torch.tensor([1.0, 9.0, 9.0], dtype=DT))  # behind stream 0's clock
    before = batched.inducing_variables.t
    with pytest.raises(ValueError, match="stream 2"):
        batched.inducing_variables.advance(torch.tensor([9.0, 9.0, float("nan")], dtype=DT))
    assert torch.equal(batched.inducing_variables.t, before)  # every stream is checked before any moves
    with pytest.raises(ValueError, match="input_dim"):
        HiPPOInducingVariables(M, "legs", input_dim=2, batch_shape=torch.Size([S]))


def test_times_of_the_targets_shape_are_one_dimensional_inputs():
    """``update(X, y)`` with ``X`` of shape ``(S, n)``, as ``y``: the same bound and posterior as ``(S, n, 1)``, and a
    forgotten ``advance`` is still caught per stream."""
    _, x, y, _ = ragged_tasks(1)[0]
    y = torch.nan_to_num(y)
    flat, column = batched_model("lyapunov"), batched_model("lyapunov")
    torch.testing.assert_close(flat.update(x[..., 0], y), column.update(x, y), rtol=0, atol=0)
    torch.testing.assert_close(flat.posterior_precision, column.posterior_precision, rtol=0, atol=0)
    late = x[..., 0].clone()
    late[2, 0] = STARTS[2] + 5.0
    with pytest.raises(InputsOutsideSupportError, match="stream 2"):
        flat.update(late, y)


def test_the_captured_variance_warning_names_the_worst_stream():
    ivs = HiPPOInducingVariables(6, "legs", t=torch.tensor([2.0, 40.0]), method="spectral", batch_shape=torch.Size([2]))
    assert isinstance(ivs, BatchedInducingVariables)
    model = OnlineSGPR(ivs, kernel(), gpytorch.likelihoods.GaussianLikelihood().double())
    x = torch.stack([torch.linspace(0, 2, 10, dtype=DT), torch.linspace(0, 40, 10, dtype=DT)]).unsqueeze(-1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.update(x, torch.sin(x[..., 0]), mask=torch.ones(2, 10, dtype=torch.bool))
    messages = [str(w.message) for w in caught if "inducing variables keep only" in str(w.message)]
    assert messages and "stream 1" in messages[0]


class _StreamsGP(gpytorch.models.ApproximateGP):
    """An SVGP of ``batch`` independent streams (GPyTorch's batch convention) on the interdomain strategy."""

    def __init__(self, variables, batch=torch.Size([])):
        from gpytorch_hippo.variational import InterdomainVariationalStrategy

        super().__init__(None)
        distribution = gpytorch.variational.CholeskyVariationalDistribution(variables.num_inducing, batch_shape=batch)
        self.variational_strategy = InterdomainVariationalStrategy(self, variables, distribution)
        self.mean_module = gpytorch.means.ZeroMean()
        self.covar_module = kernel(batch)

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


@pytest.mark.parametrize("variables", ["points", "hippo"])
def test_online_elbo_with_batched_streams_equals_each_streams_own_model(variables):
    """OHSVGP/OSVGP (OnlineELBO) on GPyTorch's batch shapes: the per-stream ELBOs do not interact, so SGD on
    their sum moves each stream as its own model; HiPPO bases move with per-stream clocks through the
    strategy's advance (which carries q(u))."""
    from gpytorch_hippo import InducingPoints, OnlineELBO

    generator = torch.Generator().manual_seed(0)
    points = 4 * torch.rand(S, 6, 1, generator=generator, dtype=DT)
    tasks = [(1.0 + torch.rand(S, 15, 1, generator=generator, dtype=DT) * STARTS.view(S, 1, 1), None)]
    for k in (1, 2):
        tasks.append((STARTS.view(S, 1, 1) * k + 1 + torch.rand(S, 15, 1, generator=generator, dtype=DT), None))
    clocks = [(task[0][..., 0].amax(-1) + 0.01) for task in tasks]
    tasks = [(x, torch.sin(2 * x[..., 0])) for x, _ in tasks]

    def build(stream=None):
        batch = torch.Size([S]) if stream is None else torch.Size([])
        if variables == "points":
            ivs = InducingPoints((points if stream is None else points[stream]).clone(), learn=False)
        else:
            t0 = clocks[0] if stream is None else clocks[0][stream].item()
            ivs = HiPPOInducingVariables(6, "legs", t=t0, method="spectral", batch_shape=batch if stream is None else None)
        likelihood = gpytorch.likelihoods.GaussianLikelihood(batch_shape=batch).double()
        return _StreamsGP(ivs, batch).double(), likelihood

    def learn(model, likelihood, stream=None):
        elbo = OnlineELBO(likelihood, model, num_data=15)
        for k, (x, y) in enumerate(tasks):
            if stream is not None:
                x, y = x[stream], y[stream]
            if k > 0:
                elbo.end_task()
                if variables == "hippo":
                    model.variational_strategy.advance(clocks[k] if stream is None else clocks[k][stream].item())
            optimizer = torch.optim.SGD(model.parameters(), lr=0.02)
            for _ in range(15):
                optimizer.zero_grad()
                (-elbo(model(x), y).sum()).backward()
                optimizer.step()
        return model

    batched, likelihood = build()
    batched(tasks[0][0])  # GPyTorch initialises q(u), with random noise, at the first call: copied below
    initial = copy.deepcopy(batched.state_dict())
    learn(batched, likelihood)
    test = torch.linspace(0, 8, 17, dtype=DT)
    batched.eval()
    with torch.no_grad():
        joint = batched(test.expand(S, -1).unsqueeze(-1))
    for s in range(S):
        alone, alone_likelihood = build(s)
        own = {k: v for k, v in initial.items() if ".streams." not in k or k.split(".streams.")[1].startswith(f"{s}.")}
        own = {
            k.replace(f".streams.{s}.", "."): (
                v[s] if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == S and ".streams." not in k else v
            )
            for k, v in own.items()
        }
        alone.load_state_dict(own)
        learn(alone, alone_likelihood, s)
        alone.eval()
        with torch.no_grad():
            reference = alone(test)
        torch.testing.assert_close(joint.mean[s], reference.mean, rtol=0, atol=1e-9)
        torch.testing.assert_close(joint.variance[s], reference.variance, rtol=0, atol=1e-9)


def test_streams_in_the_same_state_share_a_stored_copy_and_load_their_own_values():
    """A stored task's copy shares one set among streams with the same clock (a fleet stores them once);
    loading a state whose streams differ gives each its own values, never the last stream's."""
    ivs = HiPPOInducingVariables(6, "legs", t=torch.tensor([2.0, 2.0, 3.0]), method="spectral", batch_shape=torch.Size([3]))
    frozen = ivs.frozen_copy()
    assert frozen.streams[0] is frozen.streams[1] and frozen.streams[2] is not frozen.streams[0]
    moved = HiPPOInducingVariables(6, "legs", t=torch.tensor([2.0, 2.0, 3.0]), method="spectral", batch_shape=torch.Size([3]))
    moved.advance(torch.tensor([2.5, 4.0, 3.0], dtype=DT))
    frozen.load_state_dict(moved.state_dict())
    torch.testing.assert_close(frozen.t, torch.tensor([2.5, 4.0, 3.0], dtype=DT))
    k = kernel()
    with torch.no_grad():
        torch.testing.assert_close(frozen.Kuu(k).to_dense(), moved.Kuu(k).to_dense(), rtol=0, atol=1e-12)


def test_the_fleet_benchmark_times_each_thread_count_and_its_batched_fleet_equals_the_loop():
    """``benchmarks/fleet.py`` at a tiny size: a time and a ratio per thread count, and the batched model's
    posterior means equal to the loop's (the gap it prints)."""
    path = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "fleet.py"
    spec = importlib.util.spec_from_file_location("fleet_benchmark", path)
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    threads = torch.get_num_threads()
    try:
        argv = ["--streams", "5", "--tasks", "3", "--size", "6", "--num-inducing", "6", "--variables", "hippo", "--threads", "1", "2"]
        (row,) = benchmark.main(argv)
    finally:
        torch.set_num_threads(threads)
    assert set(row["batched_s"]) == set(row["speedup"]) == {1, 2}
    assert all(row["speedup"][n] == pytest.approx(row["loop_s"] / row["batched_s"][n]) for n in (1, 2))
    assert row["max_mean_gap"] < 1e-8
    assert row["bytes_per_stream"] == 8 * (2 * 6 * 6 + 2 * 6)  # chol, precision (M x M), shift, prior mean (M): O(M²)


@pytest.mark.parametrize("method, rbf", [("lyapunov", False), ("lyapunov", True), ("spectral", False)])
def test_a_stream_without_points_whose_clock_moves_equals_its_own_model(method, rbf):
    """A per-stream user's loop: every task advances every stream's clock, then updates with the points there are;
    some streams have none in a task (one in two tasks running). The single-stream model advances and skips its
    update; its stored posterior stays on the bases it was computed for, and so must the batched stream's (also
    through a reload)."""
    batched = batched_model(method, rbf)
    singles = [single_model(s, method, rbf) for s in range(S)]
    generator = torch.Generator().manual_seed(1)
    clocks = STARTS.clone()
    empty = {0: [2], 1: [1], 2: [1, 2], 3: [0]}  # task -> streams without points (stream 1 twice in a row, stream 2 before its first point)
    for k in range(5):
        ends = clocks + (0 if k == 0 else 1.0 + 0.5 * torch.arange(S, dtype=DT))
        starts = torch.zeros(S, dtype=DT) if k == 0 else clocks
        x = (starts.view(S, 1) + (ends - starts).view(S, 1) * torch.rand(S, 8, generator=generator, dtype=DT)).unsqueeze(-1)
        y = torch.sin(2 * x[..., 0]) + 0.05 * torch.randn(S, 8, generator=generator, dtype=DT)
        mask = torch.ones(S, 8, dtype=torch.bool)
        mask[empty.get(k, [])] = False
        if k > 0:
            batched.inducing_variables.advance(ends)  # every clock moves, with points or not
            for s in range(S):
                singles[s].inducing_variables.advance(ends[s].item())
        batched.update(x, torch.where(mask, y, torch.nan), mask=mask)
        for s in range(S):
            if mask[s].any():
                singles[s].update(x[s], y[s])
        if k == 2:  # a reload keeps each stream's stored bases at its own clock
            reloaded = batched_model(method, rbf)
            reloaded.load_state_dict(copy.deepcopy(batched.state_dict()))
            batched = reloaded
        clocks = ends
    assert_streams_equal_their_models(batched, singles, torch.linspace(0, 12, 40, dtype=DT))
