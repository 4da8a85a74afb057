"""``OnlineSGPR``'s cached test-time factors, against a model that recomputes everything (``detach_test_caches``
off), after each change a cache could outlive: an optimiser step, a hyperparameter set by hand, a
``load_state_dict``, an update, moved inducing variables."""

import copy

import gpytorch
import pytest
import torch
from test_fitting import DT, hippo_model, stream

from gpytorch_hippo import InducingPoints, OnlineSGPR


def uncached(model, x):
    with gpytorch.settings.detach_test_caches(False), torch.enable_grad():
        out = model(x)
    return out.mean.detach(), out.variance.detach()


def assert_matches_uncached(model, x):
    with torch.no_grad():
        out = model(x)
    mean, variance = uncached(model, x)
    torch.testing.assert_close(out.mean, mean, rtol=0, atol=1e-12)
    torch.testing.assert_close(out.variance, variance, rtol=0, atol=1e-12)


@pytest.mark.parametrize("variables", ["points", "hippo"])
def test_the_cached_factors_never_outlive_what_they_depend_on(variables):
    if variables == "hippo":
        model = hippo_model()
    else:
        kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).double()
        model = OnlineSGPR(
            InducingPoints(torch.linspace(0, 2, 15, dtype=DT).unsqueeze(-1)), kernel, gpytorch.likelihoods.GaussianLikelihood().double()
        )
    tasks = stream(2)
    model.update(*next(tasks))
    model.eval()
    x = torch.linspace(0, 2, 40, dtype=DT)
    with torch.no_grad():
        first = model(x).mean
    assert model._prediction_cache.factors is not None
    assert_matches_uncached(model, x)
    # an optimiser step on the kernel (in place, as optimisers update parameters)
    optimizer = torch.optim.Adam(model.covar_module.parameters(), lr=0.3)
    (-model(x).mean.sum()).backward()
    optimizer.step()
    assert_matches_uncached(model, x)
    with torch.no_grad():
        assert not torch.allclose(model(x).mean, first)
    # a hyperparameter set by hand, through .data (no version counter)
    model.covar_module.base_kernel.raw_lengthscale.data.fill_(0.3)
    assert_matches_uncached(model, x)
    # a reload of another state
    other = copy.deepcopy(model)
    other.covar_module.outputscale = 2.5
    model.load_state_dict(other.state_dict())
    assert_matches_uncached(model, x)
    # an update, and moved inducing variables
    model.train()
    if variables == "hippo":
        model.inducing_variables.advance(2.0)
    model.update(*next(tasks))
    model.eval()
    assert_matches_uncached(model, x)
    if variables == "points":
        model.inducing_variables = InducingPoints(torch.linspace(0, 2, 9, dtype=DT).unsqueeze(-1))
        assert_matches_uncached(model, x)


def test_gradients_through_the_cache_follow_gpytorchs_detach_test_caches():
    """With GPyTorch's default (detached test caches) the prediction's gradient in the inputs is exact
    (finite differences); with the setting off, gradients reach the hyperparameters as without a cache."""
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).double()
    model = OnlineSGPR(
        InducingPoints(torch.linspace(0, 1, 10, dtype=DT).unsqueeze(-1)), kernel, gpytorch.likelihoods.GaussianLikelihood().double()
    )
    model.update(*next(stream(1)))
    model.eval()
    model(torch.rand(3, dtype=DT))  # fills the cache
    x = torch.tensor([0.3, 0.7], dtype=DT, requires_grad=True)
    torch.autograd.gradcheck(lambda inputs: model(inputs).mean, (x,))
    with gpytorch.settings.detach_test_caches(False):
        model(x).variance.sum().backward()
    assert kernel.raw_outputscale.grad is not None and kernel.raw_outputscale.grad.abs() > 0


def test_the_stored_factor_of_b_is_recomputed_whenever_the_stored_precision_changes():
    """``chol(I + Λ')``, kept from the update that stored ``Λ'``, against a model that never had it: after a
    reload of another state, an in-place change and an assignment, the next update's bound and the predictions
    equal those of a copy whose kept factor was dropped."""
    model = hippo_model()
    tasks = list(stream(4))
    model.update(*tasks[0])
    x = torch.linspace(0, 3, 25, dtype=DT)

    def check(task):
        fresh = copy.deepcopy(model)
        fresh._b_chol_cache.entry = None
        for m in (model, fresh):
            m.inducing_variables.advance(float(task[0].max().ceil()))
        bound, fresh_bound = model.update(*task), fresh.update(*task)
        torch.testing.assert_close(bound, fresh_bound, rtol=1e-13, atol=0)
        with torch.no_grad():
            torch.testing.assert_close(model.eval()(x).mean, fresh.eval()(x).mean, rtol=1e-12, atol=1e-13)
        model.train()

    other = copy.deepcopy(model)
    other.update(*tasks[0])  # the same task twice: another stored Λ' of the same shape
    model.load_state_dict(other.state_dict())
    check(tasks[1])
    model.posterior_precision.mul_(0.5)  # in place
    check(tasks[2])
    model.posterior_precision = 2 * model.posterior_precision  # a new tensor
    check(tasks[3])
