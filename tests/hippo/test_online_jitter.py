"""The Kuu jitter in online updates: white noise on the inducing variables, never information about f.

References (the smoothed ratio itself: test_collapsed.py): the exact GP's log marginal likelihood
and posterior, and the same stream with the jitter passed on as information (the former update),
which ends confidently wrong about the first task.
"""

import math

import gpytorch
import pytest
import torch

from gpytorch_hippo import HiPPOInducingVariables, InducingPoints, OnlineSGPR
from gpytorch_hippo.inducing.base import InducingVariables

DT = torch.float64


def _rff_stream(num_tasks, size, lengthscale, noise, seed=0):
    """A stationary RBF-GP draw (4,096 random Fourier features) observed with noise, in tasks."""
    generator = torch.Generator().manual_seed(seed)
    R = 4096
    omega = torch.randn(R, generator=generator, dtype=DT) / lengthscale
    phase = 2 * math.pi * torch.rand(R, generator=generator, dtype=DT)
    weights = torch.randn(R, generator=generator, dtype=DT)

    def f(x):
        return math.sqrt(2.0 / R) * (torch.cos(x[:, None] * omega + phase) @ weights)

    x = torch.arange(num_tasks * size, dtype=DT) + 0.5
    y = f(x) + math.sqrt(noise) * torch.randn(len(x), generator=generator, dtype=DT)
    x_test = torch.rand(200, generator=generator, dtype=DT) * size
    y_test = f(x_test) + math.sqrt(noise) * torch.randn(200, generator=generator, dtype=DT)
    return x, y, x_test, y_test


def _kernel_and_likelihood(lengthscale, noise):
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).to(DT)
    kernel.base_kernel.lengthscale, kernel.outputscale = lengthscale, 1.0
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(DT)
    likelihood.noise = noise
    return kernel, likelihood


def _nlpd(predictive, y):
    mean, variance = predictive.mean, predictive.variance
    return (0.5 * torch.log(2 * math.pi * variance) + 0.5 * (y - mean).square() / variance).mean().item()


def _stream_task_one_nlpd(monkeypatch=None, num_tasks=100, size=200, lengthscale=100.0, noise=1e-4, M=100):
    """Task 1's test NLPD after tasks 2 and ``num_tasks`` of an OHSGPR stream (LegS, lyapunov), and
    the final predictive."""
    x, y, x_test, y_test = _rff_stream(num_tasks, size, lengthscale, noise)
    kernel, likelihood = _kernel_and_likelihood(lengthscale, noise)
    variables = HiPPOInducingVariables(M, "legs", t=size, method="lyapunov")
    model = OnlineSGPR(variables, kernel, likelihood, captured_variance_warning=None)
    values = {}
    for task in range(num_tasks):
        if task > 0:
            variables.advance(size * (task + 1))
        model.update(x[task * size : (task + 1) * size], y[task * size : (task + 1) * size])
        if task + 1 in (2, num_tasks):
            with torch.no_grad():
                predictive = likelihood(model(x_test))
            values[task + 1] = _nlpd(predictive, y_test)
    return values, predictive, (x, y, x_test, y_test)


def test_long_low_noise_stream_keeps_the_first_task():
    """100 tasks, noise 1e-4, M = 100 LegS bases over t / ℓ = 200: task 1 stays within 0.5 nats of
    its NLPD after task 2 and within a few predictive standard deviations of the exact GP's mean.
    Passing the jitter on as information (the former update) ends at an NLPD above +10 here."""
    values, predictive, (x, y, x_test, y_test) = _stream_task_one_nlpd()
    assert values[100] < values[2] + 0.5
    kernel, likelihood = _kernel_and_likelihood(100.0, 1e-4)
    near = x < 1000  # the exact GP on everything within 8 length scales of task 1 (the rest adds < 1e-13)
    exact = gpytorch.models.ExactGP(x[near], y[near], likelihood)
    exact.mean_module, exact.covar_module = gpytorch.means.ZeroMean(), kernel
    exact.forward = lambda z: gpytorch.distributions.MultivariateNormal(exact.mean_module(z), exact.covar_module(z))
    exact.eval()
    with torch.no_grad(), gpytorch.settings.fast_computations(False, False, False):
        exact_predictive = likelihood(exact(x_test))
    assert abs(values[2] - _nlpd(exact_predictive, y_test)) < 0.05
    z = (predictive.mean - exact_predictive.mean) / predictive.variance.sqrt()
    assert z.abs().max() < 3.0
    assert (predictive.variance >= exact_predictive.variance * (1 - 1e-6)).all()  # on this stream forgetting only widens


def test_passing_the_jitter_on_as_information_loses_the_first_task(monkeypatch):
    """The reference failure: with no jitter noise averaged out, the same stream ends far below the
    prior on task 1 (predictive variance at the noise level around a wrong mean)."""
    monkeypatch.setattr(InducingVariables, "unshared_jitter", lambda self, other, kuu: torch.zeros(kuu.shape[:-1], dtype=kuu.dtype))
    values, _, _ = _stream_task_one_nlpd()
    assert values[100] > 10.0


@pytest.mark.parametrize("variables", ["hippo", "points"])
def test_online_bounds_sum_below_the_log_marginal_likelihood_and_above_the_unsmoothed_ones(variables, monkeypatch):
    """The per-task bounds add up to a lower bound of ``log p(y_1, ..., y_T)`` (exact GP), and averaging the
    stored ratio over the jitter (Jensen) gives a bound at least as tight as passing the jitter on."""
    x, y, _, _ = _rff_stream(4, 40, 10.0, 1e-2, seed=1)
    kernel, likelihood = _kernel_and_likelihood(10.0, 1e-2)

    def stream_bound():
        if variables == "hippo":
            ivs = HiPPOInducingVariables(20, "legs", t=40, jitter=1e-4)
        else:
            ivs = InducingPoints(torch.linspace(0, 40, 8, dtype=DT), learn=False, jitter=1e-4)
        model = OnlineSGPR(ivs, kernel, likelihood, captured_variance_warning=None)
        total = 0.0
        for task in range(4):
            if task > 0 and variables == "hippo":
                model.inducing_variables.advance(40 * (task + 1))
            elif task > 0:  # half of the points kept, half moved to the new task
                kept = model.inducing_variables.points[::2, 0]
                model.inducing_variables = InducingPoints(
                    torch.cat([kept, torch.linspace(40 * task, 40 * (task + 1), 4, dtype=DT)]), learn=False, jitter=1e-4
                )
            total += model.update(x[task * 40 : (task + 1) * 40], y[task * 40 : (task + 1) * 40]).item()
        return total

    smoothed = stream_bound()
    covariance = kernel(x.unsqueeze(-1)).to_dense() + 1e-2 * torch.eye(len(x), dtype=DT)
    log_marginal = torch.distributions.MultivariateNormal(torch.zeros_like(y), covariance).log_prob(y).item()
    monkeypatch.setattr(InducingVariables, "unshared_jitter", lambda self, other, kuu: torch.zeros(kuu.shape[:-1], dtype=kuu.dtype))
    unsmoothed = stream_bound()
    assert smoothed <= log_marginal + 1e-8
    assert smoothed >= unsmoothed - 1e-8
