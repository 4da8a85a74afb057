"""Fitting ``OnlineGPModel``: the collapsed bound against ``SingleTaskGP``'s fit, refits on the online bound, roll-backs."""

import copy

import pytest
import torch
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from gpytorch.mlls import ExactMarginalLogLikelihood
from test_botorch_models import DOUBLE, data, exact_log_marginal

from gpytorch_hippo import InducingPoints, OnlineSGPR
from gpytorch_hippo.botorch import OnlineCollapsedMLL, OnlineGPModel

# the few points of these toy models capture too little of the prior where the data are: not what these tests check
pytestmark = pytest.mark.filterwarnings("ignore::gpytorch_hippo.botorch.InducingApproximationWarning")


@pytest.mark.filterwarnings("ignore:Data \\(outcome observations\\) is not standardized")
def test_first_batch_fit_matches_single_task_gp_fit():
    # With Z = X the collapsed bound is the exact log marginal likelihood, and the default priors
    # are SingleTaskGP's: fit_gpytorch_mll must reach the same optimum.
    x, y = data(15, 7)
    model = OnlineGPModel(x, y, InducingPoints(x, learn=False, jitter=1e-10), fit_maxiter=100, outcome_transform=None)
    gp = SingleTaskGP(x, y, outcome_transform=None)
    fit_gpytorch_mll(ExactMarginalLogLikelihood(gp.likelihood, gp), optimizer_kwargs={"options": {"maxiter": 100}})
    # the objective itself: OnlineSGPR's bound at SingleTaskGP's optimum is the exact evidence there
    twin = OnlineSGPR(InducingPoints(x, learn=False, jitter=1e-10), gp.covar_module, gp.likelihood, gp.mean_module)
    with torch.no_grad():
        bound = twin.log_bound(x, y[:, 0])
    evidence = exact_log_marginal(gp.covar_module, gp.likelihood, gp.mean_module, x, y[:, 0])
    evidence_no_prior = torch.distributions.MultivariateNormal(
        gp.mean_module(x).detach(), (gp.covar_module(x).to_dense() + gp.likelihood.noise * torch.eye(15, dtype=DOUBLE)).detach()
    ).log_prob(y[:, 0])
    torch.testing.assert_close(bound, evidence_no_prior, rtol=0, atol=1e-6)
    # both optimisers stop at L-BFGS-B's tolerance: same optimum value, hyperparameters within 2%
    ours = exact_log_marginal(model.covar_module, model.likelihood, model.mean_module, x, y[:, 0])
    assert abs(ours - evidence) < 1e-3 * 15, (ours, evidence)
    torch.testing.assert_close(model.covar_module.lengthscale, gp.covar_module.lengthscale, rtol=2e-2, atol=0)
    torch.testing.assert_close(model.likelihood.noise, gp.likelihood.noise, rtol=5e-2, atol=1e-6)
    torch.testing.assert_close(model.mean_module.constant, gp.mean_module.constant, rtol=2e-2, atol=1e-3)
    assert not model.mean_module.constant.requires_grad  # fixed after the first batch


@pytest.mark.filterwarnings("ignore::gpytorch_hippo.inducing.CapturedVarianceWarning")  # few inducing variables, to be fast
def test_refit_every_refreshes_hyperparameters_on_the_online_bound():
    x, y = data(30, 11)
    z = torch.rand(8, 2, dtype=DOUBLE, generator=torch.Generator().manual_seed(0))
    model = OnlineGPModel(x[:15], y[:15], InducingPoints(z), fit_maxiter=20, refit_every=1, outcome_transform=None)
    ivs = model.inducing_variables
    bound_before = OnlineCollapsedMLL(model, x[15:], y[15:, 0])().item()
    updated = model.observe(x[15:], y[15:])
    assert not torch.equal(updated.covar_module.lengthscale, model.covar_module.lengthscale)
    # the refreshed hyperparameters raise the online bound of the new batch over the old summary
    refreshed = copy.deepcopy(model)
    refreshed.online.load_state_dict(
        {k: v for k, v in updated.online.state_dict().items() if not k.startswith("posterior") and k != "num_tasks"},
        strict=False,
    )
    assert OnlineCollapsedMLL(refreshed, x[15:], y[15:, 0])().item() > bound_before
    assert model.inducing_variables is ivs and updated.num_updates == 2
    never = OnlineGPModel(x[:15], y[:15], InducingPoints(z.clone()), fit_maxiter=0, outcome_transform=None)
    assert torch.equal(never.observe(x[15:], y[15:]).covar_module.lengthscale, never.covar_module.lengthscale)


@pytest.mark.filterwarnings("ignore::gpytorch_hippo.inducing.CapturedVarianceWarning")  # few inducing variables, to be fast
def test_a_fit_that_lowers_the_bound_is_rolled_back(monkeypatch):
    # L-BFGS-B can stop "ABNORMAL" at a worse point (seen for 2 of 30 random inducing inputs in the
    # test above); a stand-in optimiser that ruins the lengthscale must leave the model as it was.
    import gpytorch_hippo.botorch.fit as online_botorch

    x, y = data(30, 11)
    model = OnlineGPModel(x[:15], y[:15], InducingPoints(x[:8].clone()), fit_maxiter=0, outcome_transform=None)
    lengthscale = model.covar_module.lengthscale.clone()

    def ruin(mll, **kwargs):
        mll.model.covar_module.lengthscale = 1e-3

    monkeypatch.setattr(online_botorch, "fit_gpytorch_mll", ruin)
    model.fit_hyperparameters(x[15:], y[15:, 0], maxiter=5)  # no transforms: the model space is the data's
    assert torch.equal(model.covar_module.lengthscale, lengthscale)


@pytest.mark.filterwarnings("ignore::gpytorch_hippo.inducing.CapturedVarianceWarning")  # few inducing variables, to be fast
def test_a_refit_that_fails_in_observe_is_rolled_back_with_a_warning(monkeypatch):
    # a long stream with refit_every=10 met a refit whose every attempt failed (ModelFittingError after 379
    # updates); as documented, the refit is rolled back: the batch is absorbed with the former hyperparameters
    from botorch.exceptions.errors import ModelFittingError

    import gpytorch_hippo.botorch.fit as online_botorch
    from gpytorch_hippo.botorch import OnlineGPModelWarning

    x, y = data(30, 11)
    model = OnlineGPModel(x[:15], y[:15], InducingPoints(x[:8].clone()), fit_maxiter=0, refit_every=1, outcome_transform=None)
    lengthscale = model.covar_module.lengthscale.clone()

    def fail(mll, **kwargs):
        mll.model.covar_module.lengthscale = 1e-3
        raise ModelFittingError("All attempts to fit the model have failed.")

    monkeypatch.setattr(online_botorch, "fit_gpytorch_mll", fail)
    with pytest.warns(OnlineGPModelWarning, match="keeps the hyperparameters"):
        updated = model.observe(x[15:], y[15:])
    assert torch.equal(updated.covar_module.lengthscale, lengthscale) and updated.num_updates == 2
    reference = model.condition_on_observations(x[15:], y[15:])  # the same batch without a refit
    torch.testing.assert_close(updated.posterior(x).mean, reference.posterior(x).mean, rtol=0, atol=1e-12)


def subsample_fit_reference(x, y, indices, start=None, maxiter=None, mean=None):
    """SingleTaskGP fitted on the kept points ``indices`` from ``start``'s hyperparameters (``None``: its own start), its
    mean fixed at ``mean`` (``None``: learned), as BoTorch's tutorials fit it."""
    from test_botorch_dropin import same_hyperparameters

    gp = SingleTaskGP(x[indices], y[indices], outcome_transform=None)
    if start is not None:
        same_hyperparameters(gp, start).train()
    if mean is not None:
        gp.mean_module.constant = mean
        gp.mean_module.raw_constant.requires_grad_(False)
    options = {} if maxiter is None else {"optimizer_kwargs": {"options": {"maxiter": maxiter}}}
    fit_gpytorch_mll(ExactMarginalLogLikelihood(gp.likelihood, gp), **options)
    return gp


def assert_same_hyperparameters(model, gp, atol=1e-6):
    torch.testing.assert_close(model.covar_module.lengthscale, gp.covar_module.lengthscale, rtol=0, atol=atol)
    torch.testing.assert_close(model.likelihood.noise, gp.likelihood.noise, rtol=0, atol=atol)
    torch.testing.assert_close(model.mean_module.constant, gp.mean_module.constant, rtol=0, atol=atol)


def test_an_exact_fit_past_exact_fit_size_is_single_task_gps_fit_of_the_subsample_and_the_posterior_all_datas():
    """BoTorch's loop fits a streamed model with fit_gpytorch_mll(ExactMarginalLogLikelihood): past exact_fit_size kept
    points it maximises the exact marginal likelihood of a deterministic subsample (the exact_fit_size // 4 best targets
    and the most recent others, recorded), as SingleTaskGP fitted on that subsample does, at O(exact_fit_size^3); the
    posterior is then the one of all kept data (with as many inducing points as data: the exact GP of all of it)."""
    from test_botorch_dropin import same_hyperparameters

    from gpytorch_hippo.botorch.fit import exact_fit_indices

    x, y = data(60, 12)
    model = OnlineGPModel(x[:20], y[:20], num_inducing=64, exact_fit_size=24, fit_maxiter=0, outcome_transform=None)
    for start in range(20, 60, 8):
        model = model.condition_on_observations(x[start : start + 8], y[start : start + 8])
    fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
    indices = model.hyperparameter_record.exact_fit_indices
    best = torch.argsort(y[:, 0], descending=True)[:6]
    recent = [i for i in range(60) if i not in best.tolist()][-18:]
    assert set(indices.tolist()) == set(best.tolist()) | set(recent) and indices.shape == (24,)
    assert torch.equal(indices, exact_fit_indices(y[:, 0], 24)) and model.train_inputs[0].shape == (60, 2)
    assert_same_hyperparameters(model, subsample_fit_reference(x, y, indices, mean=model.mean_module.constant.detach()))
    gp = same_hyperparameters(SingleTaskGP(x, y, outcome_transform=None), model)
    test = torch.rand(9, 2, generator=torch.Generator().manual_seed(3), dtype=DOUBLE)
    torch.testing.assert_close(model.posterior(test).mean, gp.posterior(test).mean, rtol=0, atol=1e-4)
    torch.testing.assert_close(model.posterior(test).variance, gp.posterior(test).variance, rtol=0, atol=1e-4)


def test_observe_with_refit_every_refits_on_the_kept_data_subsample():
    """A stream with refit_every=k and the default points refits every k-th batch on the exact marginal likelihood of the
    kept-data subsample, that batch included (it refitted on the batch's online bound alone), as a SingleTaskGP that
    BoTorch's loops rebuild on the same points: from its own initial values, not from the stream's hyperparameters
    (a refit from those stayed in the first batch's optimum: ARD length scales at their bounds in 20 dimensions, where
    TuRBO's Thompson samples then found nothing); the posterior is then all kept data's."""
    x, y = data(44, 13)
    model = OnlineGPModel(x[:20], y[:20], num_inducing=64, exact_fit_size=32, fit_maxiter=15, refit_every=2, outcome_transform=None)
    updated = model.observe(x[20:28], y[20:28])  # the second batch: refitted
    assert updated.hyperparameter_record.exact_fit_indices is None  # 28 kept points, within exact_fit_size: all of them
    mean = model.mean_module.constant.detach()
    assert_same_hyperparameters(updated, subsample_fit_reference(x[:28], y[:28], torch.arange(28), None, 15, mean))
    later = updated.observe(x[28:36], y[28:36]).observe(x[36:44], y[36:44])  # the fourth: 44 points, a subsample of 32
    indices = later.hyperparameter_record.exact_fit_indices
    assert indices.shape == (32,)
    assert_same_hyperparameters(later, subsample_fit_reference(x, y, indices, None, 15, mean))


def test_observe_refits_each_of_the_first_refit_every_batches_then_every_kth_and_a_reload_keeps_the_schedule():
    """With the default points and kept data, refit_every=k refits each of the first k streaming batches (SingleTaskGP
    refits in every iteration, and a schedule that waited k batches left the stream k batches behind it while the data
    are few), then every k-th: batches 1, 2, 3 and 7 of k = 4 here, and no other; the schedule comes from the batch
    counter, so a model reloaded from its state_dict refits on the same batches."""
    x, y = data(76, 21)
    model = OnlineGPModel(x[:12], y[:12], num_inducing=64, fit_maxiter=15, refit_every=4, outcome_transform=None)
    mean = model.mean_module.constant.detach()
    refitted = []
    for batch in range(1, 9):
        before = model.covar_module.lengthscale.detach().clone()
        model = model.observe(x[4 + 8 * batch : 12 + 8 * batch], y[4 + 8 * batch : 12 + 8 * batch])
        if not torch.equal(before, model.covar_module.lengthscale):
            refitted.append(batch)
            n = 12 + 8 * batch
            assert_same_hyperparameters(model, subsample_fit_reference(x[:n], y[:n], torch.arange(n), None, 15, mean))
        if batch == 4:
            reloaded = OnlineGPModel.from_state_dict(model.state_dict(), fit_maxiter=15, refit_every=4, outcome_transform=None)
            assert int(reloaded.num_updates) == int(model.num_updates)
    assert refitted == [1, 2, 3, 7], refitted


def test_the_constructor_on_more_than_exact_fit_size_points_fits_their_subsample():
    """The class swap of BoTorch's tutorials builds the model on all n points every iteration: past exact_fit_size its
    fit is the subsample's exact one (it fitted the sparse bound on all n points), SingleTaskGP's on those points, and an
    exact fit_gpytorch_mll after it does not warn."""
    import warnings

    from botorch.exceptions.warnings import OptimizationWarning

    from gpytorch_hippo.botorch import OnlineGPModelWarning
    from gpytorch_hippo.botorch.fit import exact_fit_indices

    x, y = data(60, 14)
    model = OnlineGPModel(x, y, num_inducing=16, exact_fit_size=24, outcome_transform=None)
    indices = exact_fit_indices(y[:, 0], 24)
    assert_same_hyperparameters(model, subsample_fit_reference(x, y, indices, maxiter=100))
    with warnings.catch_warnings():
        warnings.simplefilter("error", OnlineGPModelWarning)
        warnings.simplefilter("ignore", OptimizationWarning)  # L-BFGS-B starts at its optimum: BoTorch may say "ABNORMAL"
        fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
