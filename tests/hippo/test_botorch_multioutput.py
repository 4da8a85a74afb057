"""OnlineGPModel with m > 1 independent outputs against m single-output OnlineGPModels (fitted, conditioned
and streamed alike), BoTorch's ModelListGP of them, and finite differences; multi-objective and
look-ahead acquisitions on it."""

import copy

import pytest
import torch
from botorch.acquisition import qKnowledgeGradient
from botorch.acquisition.multi_objective.logei import qLogNoisyExpectedHypervolumeImprovement
from botorch.acquisition.objective import ScalarizedPosteriorTransform
from botorch.exceptions.errors import BotorchTensorDimensionError
from botorch.models import ModelListGP, SingleTaskGP
from botorch.models.transforms import Normalize, Standardize
from botorch.optim import optimize_acqf
from botorch.sampling import SobolQMCNormalSampler

from gpytorch_hippo import HiPPOInducingVariables, InducingPoints
from gpytorch_hippo.botorch import OnlineGPModel, OnlineGPModelWarning

DOUBLE = torch.float64

# these tests check the online model against OnlineSGPR and BoTorch's own algebra with few inducing points, to be fast:
# where those points do not reach new inputs the model says so (test_botorch_dropin.py checks the warning)
pytestmark = pytest.mark.filterwarnings("ignore::gpytorch_hippo.botorch.InducingApproximationWarning")

BOUNDS = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=DOUBLE)


def data(n, seed):
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=generator, dtype=DOUBLE)
    y = torch.stack([torch.sin(5 * x[:, 0]) * x[:, 1], 10 * torch.cos(3 * x[:, 1]) + 4], -1)  # different scales
    return x, y + 0.05 * torch.randn(n, 2, generator=generator, dtype=DOUBLE)


def inducing(kind):
    if kind == "points":
        return InducingPoints(torch.rand(10, 2, generator=torch.Generator().manual_seed(9), dtype=DOUBLE))
    return HiPPOInducingVariables(10, input_dim=2, num_rff=200, seed=1)


def multi_and_singles(kind, **kwargs):
    """The m = 2 model and the two single-output models it must equal (each built from its own copies)."""
    x, y = data(25, 0)
    settings = dict(input_transform=Normalize(2), fit_maxiter=15, **kwargs)
    multi = OnlineGPModel(x, y, inducing(kind), outcome_transform=Standardize(2), **settings)
    singles = [
        OnlineGPModel(x, y[:, j : j + 1], inducing(kind), outcome_transform=Standardize(1), **copy.deepcopy(settings)) for j in range(2)
    ]
    return multi, singles


def assert_same_posterior(multi, singles, X, **kwargs):
    posterior = multi.posterior(X, **kwargs)
    assert posterior.mean.shape[-2:] == (X.shape[-2], 2)
    for j, single in enumerate(singles):
        noise = kwargs.get("observation_noise")
        reference = single.posterior(X, observation_noise=noise[..., j : j + 1] if torch.is_tensor(noise) else bool(noise))
        torch.testing.assert_close(posterior.mean[..., j], reference.mean[..., 0], rtol=0, atol=1e-10)
        torch.testing.assert_close(posterior.variance[..., j], reference.variance[..., 0], rtol=0, atol=1e-10)
    # independent outputs: no covariance between them in the joint q*m covariance
    batch, q = posterior.mean.shape[:-2], X.shape[-2]
    covariance = posterior.distribution.covariance_matrix
    if posterior.distribution._interleaved:  # indices run over (point, output), else over (output, point)
        covariance = covariance.reshape(*batch, q, 2, q, 2).transpose(-4, -3).transpose(-2, -1)
    covariance = covariance.reshape(*batch, 2, q, 2, q)
    assert covariance[..., 0, :, 1, :].abs().max() < 1e-12 and covariance[..., 0, :, 0, :].abs().max() > 1e-6


# L-BFGS-B may stop ABNORMAL on a refit (BoTorch warns); the multi-output model and the single ones fit alike, so
# they stay equal either way
@pytest.mark.filterwarnings("ignore:`scipy_minimize` terminated:botorch.exceptions.warnings.OptimizationWarning")
@pytest.mark.parametrize("kind", ["points", "hippo"])
def test_equals_independent_single_output_models_through_a_stream(kind):
    multi, singles = multi_and_singles(kind, refit_every=2)
    assert type(multi) is OnlineGPModel and multi.num_outputs == 2
    # per-output hyperparameters: fitted on each column (the scales differ by ~20x before standardising)
    assert not torch.allclose(multi.outputs[0].covar_module.lengthscale, multi.outputs[1].covar_module.lengthscale)
    if kind == "hippo":  # path memories are features of the first length scale: refresh the rest
        for model in (*multi.outputs, *singles):
            model.covar_module.raw_lengthscale.requires_grad_(False)
    test = torch.rand(3, 4, 2, generator=torch.Generator().manual_seed(3), dtype=DOUBLE)
    assert_same_posterior(multi, singles, test)
    for step in range(3):  # observe refits every second batch, per output
        x_new, y_new = data(6, 10 + step)
        # (seeded alike: after a failed L-BFGS attempt, fit_gpytorch_mll retries from hyperparameters drawn
        # from their priors with the global generator)
        torch.manual_seed(step)
        multi = multi.observe(x_new, y_new)
        torch.manual_seed(step)
        singles = [single.observe(x_new, y_new[:, j : j + 1]) for j, single in enumerate(singles)]
    assert multi.num_updates == 4
    assert_same_posterior(multi, singles, test)
    assert_same_posterior(multi, singles, test, observation_noise=True)
    noise = torch.full((3, 4, 2), 0.3, dtype=DOUBLE)
    assert_same_posterior(multi, singles, test, observation_noise=noise)


def test_t_batched_conditioning_and_output_subsets():
    multi, singles = multi_and_singles("points")
    x_new, _ = data(3, 5)
    y_new = torch.randn(4, 3, 2, generator=torch.Generator().manual_seed(6), dtype=DOUBLE)  # 4 fantasy-like batches
    noise = torch.full((4, 3, 2), 0.02, dtype=DOUBLE)
    conditioned = multi.condition_on_observations(x_new, y_new, noise=noise)
    references = [
        single.condition_on_observations(x_new, y_new[..., j : j + 1], noise=noise[..., j : j + 1]) for j, single in enumerate(singles)
    ]
    assert conditioned.batch_shape == (4,) and multi.batch_shape == torch.Size()
    test = torch.rand(5, 2, generator=torch.Generator().manual_seed(7), dtype=DOUBLE)
    assert_same_posterior(conditioned, references, test)
    subset = conditioned.posterior(test, output_indices=[1])  # Standardize's statistics of output 1 only
    torch.testing.assert_close(subset.mean[..., 0], references[1].posterior(test).mean[..., 0], rtol=0, atol=1e-10)
    empty = multi.condition_on_observations(x_new[:0], y_new[:, :0])
    assert empty.batch_shape == (4,)
    torch.testing.assert_close(empty.posterior(test).mean[0], multi.posterior(test).mean, rtol=0, atol=1e-12)


def test_several_outputs_are_one_online_gp_model_holding_one_single_output_model_per_output():
    """As ``SingleTaskGP`` takes an ``(n, m)`` target, ``OnlineGPModel(train_X, train_Y)`` with ``m`` outputs is an
    ``OnlineGPModel`` (no other class to pick); it holds one working single-output ``OnlineGPModel`` per output, as
    ``ModelListGP`` holds its models, and names ``outputs[j]`` for what it has once per output. The former class name
    still imports, with a ``DeprecationWarning``."""
    from botorch.models.model import Model

    import gpytorch_hippo.botorch as package

    multi, _ = multi_and_singles("points")
    assert isinstance(multi, OnlineGPModel) and isinstance(multi, Model) and multi.num_outputs == 2
    for output in multi.outputs:
        assert type(output) is OnlineGPModel and output.num_outputs == 1 and output.covar_module.lengthscale.shape[-1] == 2
    with pytest.raises(AttributeError, match=r"outputs\[j\]\.covar_module"):
        multi.covar_module
    with pytest.warns(DeprecationWarning, match="MultiOutputOnlineGPModel is OnlineGPModel"):
        assert package.MultiOutputOnlineGPModel is OnlineGPModel


def test_model_call_and_stored_data_follow_batched_multi_output_layout():
    multi, _ = multi_and_singles("points", keep_data=True)
    x_new, y_new = data(4, 8)
    multi = multi.observe(x_new, y_new)
    assert multi.train_inputs[0].shape == (2, 29, 2) and multi.train_targets.shape == (2, 29)
    test = torch.rand(6, 2, dtype=DOUBLE)
    output = multi(test)
    assert output.mean.shape == (2, 6)
    for j in range(2):
        torch.testing.assert_close(output.mean[j], multi.outputs[j].online(multi.transform_inputs(test)).mean, rtol=0, atol=1e-12)
    assert all(likelihood is single.likelihood for likelihood, single in zip(multi.likelihood.likelihoods, multi.outputs))


def test_a_warm_start_loads_each_outputs_hyperparameters_and_reports_the_keys_as_torch_does():
    """BoTorch's tutorials rebuild on more data and call ``model.load_state_dict(old_model.state_dict())``: each
    output takes the old model's kernel and noise, keeps its own data, and the call returns torch's result."""
    old, _ = multi_and_singles("points", keep_data=True)
    x, y = data(30, 3)
    new = OnlineGPModel(x, y, inducing("points"), outcome_transform=Standardize(2), input_transform=Normalize(2), keep_data=True)
    with pytest.warns(OnlineGPModelWarning, match="from_state_dict") as record:
        result = new.load_state_dict(old.state_dict())
    assert len(record) == 1 and result.missing_keys == [] and result.unexpected_keys == []
    for j in range(2):
        torch.testing.assert_close(new.outputs[j].covar_module.lengthscale, old.outputs[j].covar_module.lengthscale, rtol=0, atol=0)
        torch.testing.assert_close(new.outputs[j].mean_module.constant, old.outputs[j].mean_module.constant, rtol=0, atol=0)
        torch.testing.assert_close(new.outputs[j].likelihood.noise, old.outputs[j].likelihood.noise, rtol=0, atol=0)
    assert new.train_targets.shape == (2, 30)


@pytest.mark.filterwarnings("ignore::gpytorch_hippo.inducing.CapturedVarianceWarning")  # few inducing points, to be fast
def test_the_streaming_conveniences_work_per_output_as_on_single_output_models():
    """``load_hyperparameters`` (the warm start without a warning) and ``refresh_posterior`` of a model with two outputs
    do for each output what they do for a single-output model (a model of several outputs had neither)."""
    old, old_singles = multi_and_singles("points", keep_data=True)
    x, y = data(30, 3)
    settings = dict(input_transform=Normalize(2), keep_data=True, fit_maxiter=0)
    new = OnlineGPModel(x, y, inducing("points"), outcome_transform=Standardize(2), **settings)
    singles = [
        OnlineGPModel(x, y[:, j : j + 1], inducing("points"), outcome_transform=Standardize(1), **copy.deepcopy(settings)) for j in range(2)
    ]
    result = new.load_hyperparameters(old.state_dict())
    assert result.missing_keys == [] and result.unexpected_keys == []
    for single, old_single in zip(singles, old_singles):
        single.load_hyperparameters(old_single.state_dict())
    test = torch.rand(5, 2, generator=torch.Generator().manual_seed(4), dtype=DOUBLE)
    assert_same_posterior(new, singles, test)
    with torch.no_grad():
        new.outputs[1].likelihood.noise = 0.5
        singles[1].likelihood.noise = 0.5
    new.refresh_posterior()
    singles[1].refresh_posterior()
    assert_same_posterior(new, singles, test)


def test_log_nehvi_equals_model_list_of_single_output_models_and_optimises():
    multi, singles = multi_and_singles("points")
    X_baseline, _ = data(25, 0)
    ref_point = torch.tensor([-1.0, -8.0], dtype=DOUBLE)
    values = {}
    for name, model in (("multi", multi), ("list", ModelListGP(*singles))):
        acquisition = qLogNoisyExpectedHypervolumeImprovement(
            model,
            ref_point=ref_point,
            X_baseline=X_baseline,
            prune_baseline=False,
            sampler=SobolQMCNormalSampler(torch.Size([32]), seed=0),
        )
        values[name] = acquisition(torch.rand(3, 2, 2, generator=torch.Generator().manual_seed(1), dtype=DOUBLE))
    torch.testing.assert_close(values["multi"], values["list"], rtol=0, atol=1e-8)
    candidates, value = optimize_acqf(acquisition, bounds=BOUNDS, q=2, num_restarts=2, raw_samples=32, options={"maxiter": 20})
    assert candidates.shape == (2, 2) and torch.isfinite(value)


def test_knowledge_gradient_on_scalarised_outputs_differentiates_through_both_fantasies():
    multi, _ = multi_and_singles("points")
    transform = ScalarizedPosteriorTransform(weights=torch.tensor([1.0, 0.2], dtype=DOUBLE))
    kg = qKnowledgeGradient(multi, num_fantasies=3, sampler=SobolQMCNormalSampler(torch.Size([3]), seed=0), posterior_transform=transform)
    X = torch.rand(1, 1 + 3, 2, generator=torch.Generator().manual_seed(2), dtype=DOUBLE).requires_grad_(True)
    kg(X).sum().backward()
    gradient = X.grad[0, 0]
    assert gradient.abs().max() > 1e-4
    step = 1e-6
    for i in range(2):
        shift = torch.zeros_like(X)
        shift[0, 0, i] = step
        with torch.no_grad():
            difference = (kg(X + shift) - kg(X - shift)).sum() / (2 * step)
        torch.testing.assert_close(gradient[i], difference, rtol=1e-4, atol=1e-6)


def test_inside_a_model_list_with_botorch_models():
    multi, _ = multi_and_singles("points")
    x, y = data(25, 0)
    exact = SingleTaskGP(x, y[:, :1])
    model_list = ModelListGP(multi, exact)
    test = torch.rand(4, 2, dtype=DOUBLE)
    posterior = model_list.posterior(test)
    assert model_list.num_outputs == 3 and posterior.mean.shape == (4, 3)
    torch.testing.assert_close(posterior.mean[:, :2], multi.posterior(test).mean, rtol=0, atol=1e-10)


def test_bad_inputs_raise_named_errors():
    multi, _ = multi_and_singles("points")
    x_new, y_new = data(3, 4)
    with pytest.raises(ValueError, match=r"\(\*batch, 3, 2\)"):
        multi.condition_on_observations(x_new, y_new[:, :1])
    with pytest.raises(BotorchTensorDimensionError, match="noise"):
        multi.condition_on_observations(x_new, y_new, noise=torch.full((3,), 0.1, dtype=DOUBLE))
    with pytest.raises(BotorchTensorDimensionError, match="observation_noise"):
        multi.posterior(x_new, observation_noise=torch.full((3, 1), 0.1, dtype=DOUBLE))
    with pytest.raises(ValueError, match="output_indices"):
        multi.posterior(x_new, output_indices=[2])
    with pytest.raises(AttributeError, match=r"outputs\[j\].covar_module"):
        multi.covar_module
    with pytest.raises(NotImplementedError, match="condition_on_observations"):
        multi.get_fantasy_model(x_new, y_new[:, 0])
    with pytest.raises(TypeError, match="one per output"):
        OnlineGPModel(*data(10, 0), [inducing("points")], fit_maxiter=0, outcome_transform=None)
    with pytest.raises(ValueError, match="NaN"):
        multi.observe(x_new, torch.full_like(y_new, float("nan")))


def test_the_exact_fit_of_two_outputs_is_single_task_gps_and_subset_output_keeps_outputs():
    """BoTorch's loop on two outputs: fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model)) fits each
    output's exact marginal likelihood, as SingleTaskGP with two outputs does (it raised "Likelihood must be Gaussian");
    subset_output (BoTorch's multi-output API) keeps the chosen outputs (it raised an empty NotImplementedError)."""
    from botorch.fit import fit_gpytorch_mll
    from gpytorch.mlls import ExactMarginalLogLikelihood

    x, y = data(20, 4)
    gp = SingleTaskGP(x, y)
    gp.mean_module.raw_constant.requires_grad_(False)  # the online model's mean is fixed after its first batch
    fit_gpytorch_mll(ExactMarginalLogLikelihood(gp.likelihood, gp))
    model = OnlineGPModel(x, y, fit_maxiter=0)  # default points per output (up to 512): the exact GP of its 20 points
    fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
    for j in range(2):
        torch.testing.assert_close(model.outputs[j].covar_module.lengthscale[0], gp.covar_module.lengthscale[j, 0], rtol=1e-3, atol=0)
        torch.testing.assert_close(model.outputs[j].likelihood.noise, gp.likelihood.noise[j], rtol=1e-3, atol=0)
    test = torch.rand(5, 2, generator=torch.Generator().manual_seed(5), dtype=DOUBLE)
    second = model.subset_output([1])
    assert second.num_outputs == 1
    torch.testing.assert_close(second.posterior(test).mean[..., 0], model.posterior(test).mean[..., 1], rtol=0, atol=1e-12)
    torch.testing.assert_close(second.posterior(test).variance[..., 0], model.posterior(test).variance[..., 1], rtol=0, atol=1e-12)
