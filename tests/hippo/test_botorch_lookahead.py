"""Look-ahead acquisitions on OnlineGPModel: fantasy models are differentiable in the candidate, so
qKnowledgeGradient and qNegIntegratedPosteriorVariance optimise as they do on BoTorch's SingleTaskGP.
References: SingleTaskGP with the same hyperparameters and inducing points dense enough for the
sparse posterior to equal the exact one, and finite differences."""

import copy

import gpytorch
import pytest
import torch
from botorch.acquisition import qKnowledgeGradient
from botorch.acquisition.active_learning import qNegIntegratedPosteriorVariance
from botorch.exceptions.warnings import BotorchTensorDimensionWarning
from botorch.models import SingleTaskGP
from botorch.sampling import SobolQMCNormalSampler

from gpytorch_hippo import HiPPOInducingVariables, InducingPoints
from gpytorch_hippo.botorch import OnlineGPModel

DOUBLE = torch.float64


def twin_models():
    """A 1-D SingleTaskGP and an OnlineGPModel with the same hyperparameters and 60 inducing points on
    a grid (the sparse posterior equals the exact one to ~1e-7 at length scale 0.2)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(8, 1, generator=generator, dtype=DOUBLE)
    y = torch.sin(6 * x) + 0.05 * torch.randn(8, 1, generator=generator, dtype=DOUBLE)
    gp = SingleTaskGP(x, y, outcome_transform=None)
    gp.covar_module.lengthscale = 0.2
    gp.likelihood.noise = 1e-3
    gp.mean_module.constant = 0.1
    grid = torch.linspace(-0.1, 1.1, 60, dtype=DOUBLE).unsqueeze(-1)
    ours = OnlineGPModel(
        x,
        y,
        InducingPoints(grid, learn=False, jitter=1e-9),
        covar_module=copy.deepcopy(gp.covar_module),
        likelihood=copy.deepcopy(gp.likelihood),
        mean_module=copy.deepcopy(gp.mean_module),
        fit_maxiter=0,
        outcome_transform=None,
    )
    return gp.eval(), ours


def value_and_gradient(acquisition, X):
    X = X.clone().requires_grad_(True)
    value = acquisition(X).sum()
    value.backward()
    return value.detach(), X.grad


def test_one_shot_knowledge_gradient_value_and_gradient_equal_single_task_gp():
    gp, ours = twin_models()
    X = torch.rand(3, 1 + 4, 1, generator=torch.Generator().manual_seed(1), dtype=DOUBLE)  # q = 1 and 4 fantasies
    values = {}
    for name, model in (("exact", gp), ("online", ours)):
        sampler = SobolQMCNormalSampler(torch.Size([4]), seed=2)
        values[name] = value_and_gradient(qKnowledgeGradient(model, num_fantasies=4, sampler=sampler), X)
    (value_exact, grad_exact), (value_online, grad_online) = values["exact"], values["online"]
    torch.testing.assert_close(value_online, value_exact, rtol=0, atol=1e-5)
    assert grad_exact[:, 0].abs().max() > 1e-2  # the candidate's gradient is not trivially zero
    torch.testing.assert_close(grad_online, grad_exact, rtol=0, atol=1e-4)


def test_fantasy_gradient_matches_finite_differences():
    _, ours = twin_models()
    sampler = SobolQMCNormalSampler(torch.Size([4]), seed=2)
    kg = qKnowledgeGradient(ours, num_fantasies=4, sampler=sampler)
    X = torch.rand(1, 5, 1, generator=torch.Generator().manual_seed(3), dtype=DOUBLE)
    _, gradient = value_and_gradient(kg, X)
    step = 1e-6
    for index in range(5):
        shift = torch.zeros_like(X)
        shift[0, index, 0] = step
        with torch.no_grad():
            numeric = (kg(X + shift) - kg(X - shift)).sum() / (2 * step)
        assert abs(numeric - gradient[0, index, 0]) < 1e-5 * max(1.0, abs(numeric)), (index, numeric, gradient[0, index, 0])


def test_integrated_posterior_variance_is_differentiable_and_equals_single_task_gp():
    """Value equal to SingleTaskGP's; gradient equal to the central differences of SingleTaskGP's value.
    (SingleTaskGP's own autograd gradient of qNIPV disagrees with its finite differences here, 0.17 vs
    -0.003: its fantasy caches do not carry the gradient through the conditioning inputs.)"""
    gp, ours = twin_models()
    points = torch.linspace(0, 1, 20, dtype=DOUBLE).unsqueeze(-1)
    X = torch.rand(2, 1, 1, generator=torch.Generator().manual_seed(4), dtype=DOUBLE)
    exact = qNegIntegratedPosteriorVariance(gp, mc_points=points)
    value, gradient = value_and_gradient(qNegIntegratedPosteriorVariance(ours, mc_points=points), X)
    with torch.no_grad():
        torch.testing.assert_close(value, exact(X).sum(), rtol=0, atol=1e-6)
        step, numeric = 1e-6, torch.zeros_like(X)
        for b in range(2):
            shift = torch.zeros_like(X)
            shift[b, 0, 0] = step
            numeric[b, 0, 0] = (exact(X + shift) - exact(X - shift)).sum() / (2 * step)
    torch.testing.assert_close(gradient, numeric, rtol=0, atol=1e-6)
    assert numeric.abs().max() > 1e-4


def test_streaming_updates_stay_detached():
    _, ours = twin_models()
    new = ours.condition_on_observations(torch.tensor([[0.5]], dtype=DOUBLE), torch.tensor([[0.3]], dtype=DOUBLE))
    assert all(buffer.grad_fn is None for buffer in new.buffers())
    copy.deepcopy(new)  # plain models deep-copy as before


def test_optimize_acqf_moves_the_candidate_to_single_task_gps_optimum():
    """From the same start, L-BFGS-B on one-shot qKG ends where it ends with SingleTaskGP (before,
    the online model's zero gradient left the candidate at its start)."""
    from botorch.optim import optimize_acqf

    gp, ours = twin_models()
    bounds = torch.tensor([[0.0], [1.0]], dtype=DOUBLE)
    start = torch.rand(1, 5, 1, generator=torch.Generator().manual_seed(5), dtype=DOUBLE)
    results = {}
    for name, model in (("exact", gp), ("online", ours)):
        kg = qKnowledgeGradient(model, num_fantasies=4, sampler=SobolQMCNormalSampler(torch.Size([4]), seed=2))
        results[name] = optimize_acqf(
            kg, bounds=bounds, q=1, num_restarts=1, batch_initial_conditions=start, return_full_tree=True, options={"maxiter": 50}
        )
    (exact, exact_value), (online, online_value) = results["exact"], results["online"]
    assert (exact[..., 0, :] - start[0, 0]).abs().max() > 1e-2  # the candidate moved
    torch.testing.assert_close(online[..., 0, :], exact[..., 0, :], rtol=0, atol=1e-3)
    torch.testing.assert_close(online_value, exact_value, rtol=0, atol=1e-5)


def test_model_call_and_noise_shapes_follow_botorch():
    from botorch.exceptions.errors import BotorchTensorDimensionError

    gp, ours = twin_models()
    X = torch.rand(4, 1, dtype=DOUBLE)
    latent = ours(X)  # GPyTorch's model(X): the latent posterior, as the posterior's distribution
    torch.testing.assert_close(latent.mean, ours.posterior(X).mean[..., 0])
    torch.testing.assert_close(latent.mean, gp(X).mean, rtol=0, atol=1e-6)
    with pytest.raises(BotorchTensorDimensionError, match="observation_noise"):
        ours.posterior(X, observation_noise=torch.full((4,), 0.1, dtype=DOUBLE))  # q, not q x 1
    noisy = ours.posterior(X, observation_noise=torch.full((4, 1), 0.1, dtype=DOUBLE))
    torch.testing.assert_close(noisy.variance, ours.posterior(X).variance + 0.1)


def test_conditioning_with_per_point_noise_is_the_exact_gp_with_that_noise():
    """``condition_on_observations(X, Y, noise=...)`` (BoTorch's fixed-noise conditioning, used by the
    entropy searches on their optimal samples): with inducing points at all inputs, the exact GP whose
    new observations carry that noise, written out."""
    gp, _ = twin_models()
    x_old, y_old = gp.train_inputs[0], gp.train_targets
    x_new = torch.tensor([[0.25], [0.8]], dtype=DOUBLE)
    y_new = torch.tensor([[0.4], [-0.2]], dtype=DOUBLE)
    noise_new = torch.tensor([[1e-4], [0.3]], dtype=DOUBLE)
    X = torch.cat([x_old, x_new])
    ours = OnlineGPModel(
        x_old,
        y_old.unsqueeze(-1),
        InducingPoints(X, learn=False, jitter=1e-10),
        covar_module=copy.deepcopy(gp.covar_module),
        likelihood=copy.deepcopy(gp.likelihood),
        mean_module=copy.deepcopy(gp.mean_module),
        fit_maxiter=0,
        outcome_transform=None,
    )
    conditioned = ours.condition_on_observations(x_new, y_new, noise=noise_new)
    test = torch.linspace(0, 1, 11, dtype=DOUBLE).unsqueeze(-1)
    with torch.no_grad():
        kernel, constant = gp.covar_module, gp.mean_module.constant
        noise = torch.cat([gp.likelihood.noise.expand(len(x_old)), noise_new[:, 0]])
        K = kernel(X).to_dense() + torch.diag(noise)
        Ks = kernel(test, X).to_dense()
        mean = constant + Ks @ torch.linalg.solve(K, torch.cat([y_old, y_new[:, 0]]) - constant)
        variance = kernel(test, diag=True) - (Ks * torch.linalg.solve(K, Ks.T).T).sum(-1)
        posterior = conditioned.posterior(test)
    torch.testing.assert_close(posterior.mean[..., 0], mean, rtol=0, atol=1e-6)
    torch.testing.assert_close(posterior.variance[..., 0], variance, rtol=0, atol=1e-6)


def test_fantasies_of_no_points_keep_the_posterior_with_the_fantasy_batch_shape():
    from botorch.sampling import SobolQMCNormalSampler as Sampler

    gp, ours = twin_models()
    fantasy = ours.fantasize(torch.empty(2, 0, 1, dtype=DOUBLE), Sampler(torch.Size([3])))
    assert fantasy.batch_shape == (3, 2)
    test = torch.linspace(0, 1, 5, dtype=DOUBLE).unsqueeze(-1)
    with torch.no_grad():
        torch.testing.assert_close(fantasy.posterior(test).mean, ours.posterior(test).mean.expand(3, 2, 5, 1))
    gp.posterior(test)  # (an ExactGP fantasizes only after a prediction)
    with pytest.warns(BotorchTensorDimensionWarning):  # the reference SingleTaskGP's own check of no points (ours: none)
        reference = gp.fantasize(torch.empty(2, 0, 1, dtype=DOUBLE), Sampler(torch.Size([3])))
    assert reference.batch_shape == fantasy.batch_shape


def test_inducing_points_on_the_raw_scale_under_normalize_are_refused():
    from botorch.models.transforms import Normalize

    x = 100 * torch.rand(10, 1, dtype=DOUBLE)
    y = torch.sin(x / 20)
    with pytest.raises(ValueError, match="inducing_variables: InducingPoints must be given in the model's input space"):
        OnlineGPModel(
            x,
            y,
            InducingPoints(torch.linspace(0, 100, 8, dtype=DOUBLE), learn=False),
            input_transform=Normalize(1),
            fit_maxiter=0,
            outcome_transform=None,
        )
    OnlineGPModel(
        x,
        y,
        InducingPoints(torch.linspace(0, 1, 8, dtype=DOUBLE), learn=False),
        input_transform=Normalize(1),
        fit_maxiter=0,
        outcome_transform=None,
    )  # in the transformed space: accepted


@pytest.mark.filterwarnings("ignore::gpytorch_hippo.botorch.InducingApproximationWarning")  # few inducing points, to be fast
def test_several_outputs_through_model_list_gp():
    """m independent outputs as BoTorch's ``ModelListGP`` of online models: streaming conditioning equals
    conditioning each output's model, and multi-objective BO (qLogNEHVI) runs."""
    from botorch.acquisition.multi_objective.logei import qLogNoisyExpectedHypervolumeImprovement
    from botorch.models import ModelListGP
    from botorch.models.transforms import Standardize
    from botorch.optim import optimize_acqf

    generator = torch.Generator().manual_seed(6)
    X = torch.rand(12, 2, generator=generator, dtype=DOUBLE)
    Y = torch.stack([torch.sin(3 * X[:, 0]), 5 * torch.cos(3 * X[:, 1])], -1)
    Z = torch.rand(10, 2, generator=generator, dtype=DOUBLE)
    models = [
        OnlineGPModel(X, Y[:, i : i + 1], InducingPoints(Z, learn=False), outcome_transform=Standardize(1), fit_maxiter=10)
        for i in range(2)
    ]
    model_list = ModelListGP(*models)
    X_new, Y_new = torch.rand(3, 2, generator=generator, dtype=DOUBLE), torch.rand(3, 2, generator=generator, dtype=DOUBLE)
    conditioned = model_list.condition_on_observations([X_new, X_new], Y_new)
    test = torch.rand(5, 2, generator=generator, dtype=DOUBLE)
    with torch.no_grad():
        expected = torch.cat(
            [m.condition_on_observations(X_new, Y_new[:, i : i + 1]).posterior(test).mean for i, m in enumerate(models)], -1
        )
        # (a leading batch of 1, from ModelListGP's outcome transform of a 1-D target, as with SingleTaskGP)
        torch.testing.assert_close(conditioned.posterior(test).mean.squeeze(0), expected, rtol=0, atol=1e-10)
    acquisition = qLogNoisyExpectedHypervolumeImprovement(
        model_list, ref_point=torch.tensor([-1.0, -5.0], dtype=DOUBLE), X_baseline=X, prune_baseline=False
    )
    candidates, value = optimize_acqf(
        acquisition,
        bounds=torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=DOUBLE),
        q=2,
        num_restarts=1,
        raw_samples=16,
        options={"maxiter": 5},
    )
    assert candidates.shape == (2, 2) and torch.isfinite(value)


def test_multi_step_lookahead_gradient_equals_finite_differences():
    """qMultiStepLookahead (two stages of one point, two fantasies each): the gradient in every point of
    the tree equals central differences (SingleTaskGP's autograd gradient in the first-stage points
    does not here: -12.4 against -0.09)."""
    from botorch.acquisition.multi_step_lookahead import qMultiStepLookahead

    _, ours = twin_models()
    acquisition = qMultiStepLookahead(model=ours, batch_sizes=[1, 1], num_fantasies=[2, 2])
    X = torch.rand(1, acquisition.get_augmented_q_batch_size(1), 1, generator=torch.Generator().manual_seed(0), dtype=DOUBLE)
    value, gradient = value_and_gradient(acquisition, X)
    assert torch.isfinite(value)
    step = 1e-6
    for index in range(X.shape[1]):
        shift = torch.zeros_like(X)
        shift[0, index, 0] = step
        with torch.no_grad():
            numeric = (acquisition(X + shift) - acquisition(X - shift)).sum() / (2 * step)
        assert abs(numeric - gradient[0, index, 0]) < 1e-5 * max(1.0, abs(numeric))


def time_series_model():
    """OHSGPR on a time axis: LegS bases at t = 2, the stream's last time, and look-ahead candidates beyond it."""
    t = torch.linspace(0, 2, 30, dtype=DOUBLE).unsqueeze(-1)
    y = torch.sin(3 * t) + 0.05 * torch.randn(30, 1, generator=torch.Generator().manual_seed(4), dtype=DOUBLE)
    kernel, likelihood = gpytorch.kernels.RBFKernel(), gpytorch.likelihoods.GaussianLikelihood()
    kernel.lengthscale, likelihood.noise = 0.4, 1e-3
    return OnlineGPModel(
        t,
        y,
        HiPPOInducingVariables(16, "legs", t=2.0),
        covar_module=kernel,
        likelihood=likelihood,
        mean_module=gpytorch.means.ZeroMean(),
        fit_maxiter=0,
        outcome_transform=None,
    )


def test_fantasies_beyond_the_bases_advance_a_copy_as_conditioning_does():
    model = time_series_model()
    X = torch.tensor([[2.3], [2.6]], dtype=DOUBLE)  # the next two times, beyond the bases' t = 2
    sampler = SobolQMCNormalSampler(torch.Size([3]), seed=5)
    fantasy = model.fantasize(X, sampler)
    assert model.inducing_variables.t == 2.0 and fantasy.inducing_variables.t == pytest.approx(2.6)
    by_hand = copy.deepcopy(model)
    by_hand.inducing_variables.advance(2.6)
    Y = sampler(model.posterior(X, observation_noise=True))  # the same fantasies: (3, 2, 1)
    reference = by_hand.condition_on_observations(X.expand(3, 2, 1), Y)
    grid = torch.linspace(0, 3, 7, dtype=DOUBLE).unsqueeze(-1)
    torch.testing.assert_close(fantasy.posterior(grid).mean, reference.posterior(grid).mean, rtol=0, atol=1e-10)
    torch.testing.assert_close(fantasy.posterior(grid).variance, reference.posterior(grid).variance, rtol=0, atol=1e-10)
    get_fantasy = model.get_fantasy_model(X, Y[..., 0])
    torch.testing.assert_close(get_fantasy.posterior(grid).mean, reference.posterior(grid).mean, rtol=0, atol=1e-10)


def test_knowledge_gradient_and_integrated_variance_on_a_time_axis():
    model = time_series_model()
    X = torch.tensor([[[2.4]]], dtype=DOUBLE).repeat(1, 1 + 2, 1)  # a candidate at t = 2.4 and 2 fantasy solutions
    X[0, 1:, 0] = torch.tensor([2.5, 2.7], dtype=DOUBLE)
    kg = qKnowledgeGradient(model, num_fantasies=2, sampler=SobolQMCNormalSampler(torch.Size([2]), seed=6))
    value, gradient = value_and_gradient(kg, X)
    assert torch.isfinite(value) and torch.isfinite(gradient).all() and gradient.abs().sum() > 0
    mc_points = torch.linspace(2.0, 3.0, 11, dtype=DOUBLE).unsqueeze(-1)
    nipv = qNegIntegratedPosteriorVariance(model, mc_points=mc_points)
    candidate = torch.tensor([[[2.5]]], dtype=DOUBLE)
    by_hand = copy.deepcopy(model)
    by_hand.inducing_variables.advance(2.5)
    expected = -by_hand.condition_on_observations(candidate[0], torch.zeros(1, 1, dtype=DOUBLE)).posterior(mc_points).variance.mean()
    torch.testing.assert_close(nipv(candidate)[0], expected, rtol=1e-8, atol=1e-12)
    assert nipv(candidate)[0] > -model.posterior(mc_points).variance.mean()  # observing at 2.5 shrinks the variance


def largest_saved_storage(acquisition, X):
    """The largest storage (in elements) that one value + gradient of ``acquisition`` at ``X`` keeps for its backward
    pass (views such as ``expand`` count as the storage they share)."""
    sizes = []

    def pack(tensor):
        sizes.append(tensor.untyped_storage().nbytes() // tensor.element_size())
        return tensor

    X = X.clone().requires_grad_(True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        value = acquisition(X).sum()
    value.backward()
    return max(sizes)


def test_knowledge_gradient_memory_does_not_grow_with_the_fantasies():
    """Fantasies of the same candidates share the posterior precision B = I + W Wᵀ/σ² + ...: one value + gradient of
    one-shot qKG keeps at most batch x M x M elements per tensor for 2 or 16 fantasies (it kept a B per fantasy,
    fantasies x batch x M x M, 16 times as much at 16 fantasies)."""
    _, ours = twin_models()
    num_inducing, batch = ours.inducing_variables.num_inducing, 2
    largest = {}
    for num_fantasies in (2, 16):
        kg = qKnowledgeGradient(ours, num_fantasies=num_fantasies, sampler=SobolQMCNormalSampler(torch.Size([num_fantasies]), seed=2))
        X = torch.rand(batch, 1 + num_fantasies, 1, generator=torch.Generator().manual_seed(1), dtype=DOUBLE)
        largest[num_fantasies] = largest_saved_storage(kg, X)
    assert largest[16] == largest[2] <= batch * num_inducing**2


def test_fantasies_share_one_precision_and_equal_conditioning_on_each_fantasy():
    """``fantasize`` stores one precision per candidate batch, ``(1, b, M, M)``, and its posterior equals the model
    conditioned on each fantasy's observations alone, to 1e-10."""
    _, ours = twin_models()
    X = torch.rand(3, 2, 1, generator=torch.Generator().manual_seed(7), dtype=DOUBLE).requires_grad_(True)
    sampler = SobolQMCNormalSampler(torch.Size([5]), seed=3)
    fantasy = ours.fantasize(X, sampler)
    M = ours.inducing_variables.num_inducing
    assert fantasy.online.posterior_precision.shape == (1, 3, M, M) and fantasy.batch_shape == (5, 3)
    Y = sampler(ours.posterior(X, observation_noise=True)).detach()  # the same fantasies: (5, 3, 2, 1)
    test = torch.linspace(0, 1, 7, dtype=DOUBLE).unsqueeze(-1)
    with torch.no_grad():
        posterior = fantasy.posterior(test)
        for i in range(5):
            for b in range(3):
                expected = ours.condition_on_observations(X[b].detach(), Y[i, b]).posterior(test)
                torch.testing.assert_close(posterior.mean[i, b], expected.mean, rtol=0, atol=1e-10)
                torch.testing.assert_close(posterior.variance[i, b], expected.variance, rtol=0, atol=1e-10)


def test_the_acquisition_cost_benchmark_runs_its_smoke_setting(capsys):
    """benchmarks/bo_acquisition_cost.py --smoke: qKG, PES and JES on both models, times and peak memory measured."""
    import runpy
    from pathlib import Path

    benchmark = runpy.run_path(str(Path(__file__).parents[2] / "benchmarks" / "bo_acquisition_cost.py"))
    rows = benchmark["main"](["--smoke"])
    assert [row["case"] for row in rows] == list(benchmark["CASES"])
    for row in rows:
        for name in benchmark["MODELS"]:
            assert "error" not in row[name] and row[name]["value_grad_s"] > 0 and row[name]["peak_mb"] >= 0
    assert capsys.readouterr().out.count("value+grad") == len(rows)
