"""``OnlineSGPR``'s refit policy (``refit_every``) and its cached test-time factors.

The policy is checked against the same stream with each task's ``num_iter``/``optimizer`` given by hand,
through a ``state_dict`` reload; the cache against a model that recomputes everything (``detach_test_caches``
off), after each change a cache could outlive: an optimiser step, a hyperparameter set by hand, a
``load_state_dict``, an update, moved inducing variables."""

import copy

import gpytorch
import pytest
import torch

from gpytorch_hippo import HiPPOInducingVariables, InducingPoints, OnlineSGPR

DT = torch.float64


def stream(num_tasks=5, n=30, seed=0):
    generator = torch.Generator().manual_seed(seed)
    for k in range(num_tasks):
        t = torch.sort(k + torch.rand(n, generator=generator, dtype=DT)).values
        yield t, torch.sin(3 * t) + 0.1 * torch.randn(n, generator=generator, dtype=DT)


def hippo_model(**policy):
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=1.5)).double()
    return OnlineSGPR(
        HiPPOInducingVariables(24, "legs", t=1.0),
        kernel,
        gpytorch.likelihoods.GaussianLikelihood().double(),
        gpytorch.means.ConstantMean().double(),
        **policy,
    )


def test_refit_every_fits_tasks_one_and_every_kth_after_it_as_by_hand_and_keeps_the_schedule_on_reload():
    by_policy, by_hand = hippo_model(refit_every=2, refit_iter=20), hippo_model()
    fitted = []
    for k, (t, y) in enumerate(stream()):
        for model in (by_policy, by_hand):
            if k > 0:
                model.inducing_variables.advance(float(k + 1))
        before = by_policy.last_fit
        by_policy.update(t, y)
        fitted.append(by_policy.last_fit is not before)
        if k % 2 == 0:
            if k > 0:  # HiPPO variables project f - m: the policy leaves the mean out after task 1
                by_hand.mean_module.requires_grad_(False)
            by_hand.update(t, y, num_iter=20, optimizer="lbfgs")
            by_hand.mean_module.requires_grad_(True)
        else:
            by_hand.update(t, y, num_iter=0)
        if k == 2:  # reload mid-stream: the task count, hence the schedule, is in the state_dict
            state = copy.deepcopy(by_policy.state_dict())
            by_policy = hippo_model(refit_every=2, refit_iter=20)
            by_policy.inducing_variables.advance(3.0)
            by_policy.load_state_dict(state)
    assert fitted == [True, False, True, False, True]
    assert by_policy.last_fit.status in ("success", "stopped") and by_policy.last_fit.iterations <= 20
    test = torch.linspace(0, 5, 50, dtype=DT)
    by_policy.eval(), by_hand.eval()
    with torch.no_grad():
        ours, theirs = by_policy(test), by_hand(test)
    torch.testing.assert_close(ours.mean, theirs.mean, rtol=0, atol=1e-9)
    torch.testing.assert_close(ours.variance, theirs.variance, rtol=0, atol=1e-9)
    torch.testing.assert_close(by_policy.covar_module.outputscale, by_hand.covar_module.outputscale, rtol=0, atol=1e-12)


def test_an_explicit_num_iter_overrides_the_policy_and_bad_settings_raise():
    model = hippo_model(refit_every=3)
    t, y = next(stream(1))
    model.update(t, y, num_iter=0)
    assert model.last_fit is None
    for options, message in (
        ({"refit_every": 0}, "refit_every"),
        ({"refit_iter": 0}, "refit_iter"),
        ({"refit_optimizer": "sgd"}, "refit_optimizer"),
    ):
        with pytest.raises(ValueError, match=message):
            hippo_model(**options)


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
    assert model._prediction_cache is not None
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
        fresh._b_chol_cache = None
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
