"""Independent streams as a batch dimension of one ``OnlineSGPR`` (GPyTorch's ``batch_shape``), with
inducing points: each stream equals its own single-stream model through ragged tasks and a reload."""

import copy

import gpytorch
import pytest
import torch

from gpytorch_hippo import InducingPoints, OnlineSGPR

DT = torch.float64
S, M = 4, 10
LENGTHSCALES = torch.tensor([0.4, 0.8, 1.5, 3.0], dtype=DT)
NOISES = torch.tensor([0.01, 0.02, 0.05, 0.1], dtype=DT)


def batched_model():
    batch = torch.Size([S])
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(batch_shape=batch), batch_shape=batch).double()
    kernel.base_kernel.lengthscale = LENGTHSCALES.view(S, 1, 1)
    likelihood = gpytorch.likelihoods.GaussianLikelihood(batch_shape=batch).double()
    likelihood.noise = NOISES.view(S, 1)
    points = torch.linspace(0, 12, M, dtype=DT).expand(S, M).unsqueeze(-1) + 0.1 * torch.arange(S, dtype=DT).view(S, 1, 1)
    # 10 points over the streams' ranges keep less than 90 % of the prior variance on purpose (ragged, sparse tasks)
    return OnlineSGPR(InducingPoints(points.clone(), learn=False), kernel, likelihood, captured_variance_warning=None)


def single_model(s, batched):
    """Stream ``s`` alone, unbatched, with its own hyperparameters and points."""
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).double()
    kernel.base_kernel.lengthscale = LENGTHSCALES[s]  # a float64 tensor: a Python float goes through float32
    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    likelihood.noise = NOISES[s]
    return OnlineSGPR(
        InducingPoints(batched.inducing_variables.points[s].clone(), learn=False), kernel, likelihood, captured_variance_warning=None
    )


def ragged_tasks(num_tasks=4, size=12, seed=0):
    """Tasks of ``size`` slots per stream on [3k, 3k + 3]: random points missing (NaN padding), and stream 2
    with no point at all in task 2."""
    generator = torch.Generator().manual_seed(seed)
    tasks = []
    for k in range(num_tasks):
        x = 3 * k + 3 * torch.rand(S, size, generator=generator, dtype=DT)
        y = torch.sin(x * (1 + torch.arange(S, dtype=DT).view(S, 1) / 4)) + 0.05 * torch.randn(S, size, generator=generator, dtype=DT)
        mask = torch.rand(S, size, generator=generator) > 0.3
        if k == 2:
            mask[2] = False
        tasks.append((x.unsqueeze(-1), torch.where(mask, y, torch.nan), mask))
    return tasks


def test_each_stream_equals_its_own_model_through_ragged_tasks_and_a_reload():
    """Each stream's posterior equals its own single-stream model's to 1e-8; a stream that mixed with
    another would be off by O(0.1)."""
    batched = batched_model()
    singles = [single_model(s, batched) for s in range(S)]
    tasks = ragged_tasks()
    test = torch.linspace(0, 12, 25, dtype=DT)
    for k, (x, y, mask) in enumerate(tasks):
        before = [t.clone() for t in batched._stored_task()[2:]] if batched.has_posterior else None
        batched.update(x, y, mask=mask)
        for s in range(S):
            if mask[s].any():
                singles[s].update(x[s][mask[s]], y[s][mask[s]])
        if k == 2:  # stream 2 saw nothing: its stored posterior is exactly what it was
            assert all(torch.equal(old[2], new[2]) for old, new in zip(before, batched._stored_task()[2:]))
        if k == 1:  # save and reload in the middle of the stream
            reloaded = batched_model()
            reloaded.load_state_dict(copy.deepcopy(batched.state_dict()))
            batched = reloaded
    tolerance = 1e-8
    batched.eval()
    with torch.no_grad():
        joint = batched(test.expand(S, -1).unsqueeze(-1))
        for s, single in enumerate(singles):
            single.eval()
            alone = single(test)
            torch.testing.assert_close(joint.mean[s], alone.mean, rtol=0, atol=tolerance)
            torch.testing.assert_close(joint.variance[s], alone.variance, rtol=0, atol=tolerance)
    assert joint.mean.shape == (S, 25)


def test_a_nan_in_one_stream_names_it_and_spreads_nowhere():
    batched = batched_model()
    x, y, mask = ragged_tasks(1)[0]
    y = torch.where(mask, y, 0.0)
    y[3, 0] = torch.nan
    with pytest.raises(ValueError, match=r"stream\(s\) \[3\]"):
        batched.update(x, y)
    observed = mask.clone()
    observed[3, 0] = True
    with pytest.raises(ValueError, match=r"observed entries in stream\(s\) \[3\]"):
        batched.update(x, y, mask=observed)
    assert not batched.has_posterior
    assert batched.update(x, y, mask=torch.zeros_like(mask)) is None  # no stream has a point: a no-op


def test_mask_shape_and_type_are_checked():
    batched = batched_model()
    x, y, mask = ragged_tasks(1)[0]
    with pytest.raises(TypeError, match="bool"):
        batched.update(x, y, mask=mask.int())
    with pytest.raises(ValueError, match="mask must have train_y's shape"):
        batched.update(x, y, mask=mask[:, :5])


def test_the_short_update_for_unchanged_points_equals_the_general_one(monkeypatch):
    """With the same points and ``K_uu`` as the stored task the update is ``Λ' + WWᵀ/σ²`` (``T = I``, no
    residual, no jitter to average); the general update, forced, gives the same summary and bound."""
    from gpytorch_hippo import collapsed

    calls, unchanged = [], collapsed._unchanged_points
    results = []
    for short in (True, False):
        monkeypatch.setattr(collapsed, "_unchanged_points", lambda *args: calls.append(1) or (short and unchanged(*args)))
        model = batched_model()
        model.mean_module = gpytorch.means.ConstantMean(batch_shape=torch.Size([S])).double()
        bounds = []
        for k, (x, y, mask) in enumerate(ragged_tasks()):
            model.mean_module.constant.data.fill_(0.1 * k)  # a mean that moves between tasks: μ_a - μ'_a ≠ 0
            bounds.append(model.update(x, y, mask=mask))
        results.append((torch.stack(bounds), [t.clone() for t in model._stored_task()[2:]]))
    assert len(calls) == 6  # tasks 2-4 of both runs took the test; the first run the short update
    (bounds_short, summary_short), (bounds_general, summary_general) = results
    torch.testing.assert_close(bounds_short, bounds_general, rtol=1e-12, atol=1e-9)
    for a, b in zip(summary_short, summary_general):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-9)
