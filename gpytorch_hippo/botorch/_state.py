"""One output's stored posterior in an :class:`~gpytorch_hippo.botorch.OnlineGPModel`: absorbing a batch, the kept
data, the record of the hyperparameters the posterior belongs to, and loading hyperparameters into it.

The functions typed with :class:`OutputModel` take a single-output model (``model.num_outputs == 1``, or
``model.outputs[j]`` of a model with several outputs) and work in its model space, after the input and outcome
transforms; the others take the whole model."""

from __future__ import annotations

import contextlib
import copy
import warnings
from typing import Any, cast

import gpytorch
import torch
from botorch.exceptions.errors import ModelFittingError
from botorch.models.utils.gpytorch_modules import get_covar_module_with_dim_scaled_prior, get_gaussian_likelihood_with_lognormal_prior
from gpytorch.distributions import MultivariateNormal
from gpytorch.mlls import ExactMarginalLogLikelihood
from linear_operator.operators import DiagLinearOperator
from torch import Tensor

from probseq._compat import IncompatibleKeys, child_modules, fit_mll_generic

from ..inducing.base import InducingVariables
from ..inducing.points import InducingPoints
from ..online import OnlineSGPR
from ._checks import validate_like_single_task_gp
from ._output import HyperparameterRecord, OutputModel, own_update
from .exceptions import OnlineGPModelWarning, warn_posterior_not_restored
from .fit import exact_fit_indices, fit_hyperparameters
from .inducing import move_inducing, reselect_inducing, warn_if_approximate

__all__ = [
    "NoStoredData",
    "absorb",
    "absorb_first_batch",
    "broadcast_model",
    "broadcast_posterior",
    "build_output",
    "build_outputs",
    "conditioned",
    "copy_model",
    "fix_noise_level",
    "fit_outputs",
    "is_warm_start",
    "joined_keys",
    "load_hyperparameters",
    "load_output_hyperparameters",
    "load_state_dict",
    "per_output",
    "predictive",
    "output_is_warm_start",
    "refresh_if_changed",
    "refresh_posterior",
    "restore_arguments",
    "split_by_output",
    "stored_data",
    "subset_outputs",
    "tensor_state_only",
    "to_model_space",
]

#: the kernel, likelihood and mean a model is built with (``None``: ``SingleTaskGP``'s defaults)
Modules = tuple[gpytorch.kernels.Kernel | None, gpytorch.likelihoods.GaussianLikelihood | None, gpytorch.means.Mean | None]

#: keys of a single-output model's own state, which a warm start keeps (:func:`load_output_hyperparameters`)
OWN_STATE = (
    "online.posterior",
    "online.num_tasks",
    "online.seen_input_range",
    "online.inducing_variables",
    "num_updates",
    "stored_",
    "known_noise_flag",
    "online._extra_state",
    "input_transform.",
    "outcome_transform.",
)


class NoStoredData(AttributeError):
    """``train_inputs``/``train_targets`` of a model that keeps no data (so ``hasattr`` is ``False``)."""


def per_output(model: Any) -> list[Any]:
    """The single-output models that hold ``model``'s posteriors: ``model.outputs`` with several outputs, else ``[model]``."""
    outputs = child_modules(model).get("outputs")
    return [model] if outputs is None else list(outputs)


def split_by_output(model: Any, state_dict: dict) -> list[dict]:
    """``state_dict`` per output (``outputs.j.`` prefixes removed); a single-output model's whole."""
    outputs = child_modules(model).get("outputs")
    if outputs is None:
        return [state_dict]
    return [{k[len(f"outputs.{j}.") :]: v for k, v in state_dict.items() if k.startswith(f"outputs.{j}.")} for j in range(len(outputs))]


def joined_keys(model: Any, results: list[IncompatibleKeys]) -> IncompatibleKeys:
    """The outputs' ``(missing_keys, unexpected_keys)`` under their ``outputs.j.`` prefixes (:func:`split_by_output`)."""
    if child_modules(model).get("outputs") is None:
        return results[0]
    missing = [f"outputs.{j}.{key}" for j, result in enumerate(results) for key in result.missing_keys]
    unexpected = [f"outputs.{j}.{key}" for j, result in enumerate(results) for key in result.unexpected_keys]
    return IncompatibleKeys(missing, unexpected)


def build_output(
    model: OutputModel,
    reference: Tensor,
    inducing_variables: InducingVariables,
    covar_module: gpytorch.kernels.Kernel | None,
    likelihood: gpytorch.likelihoods.GaussianLikelihood | None,
    mean_module: gpytorch.means.Mean | None,
    known_noise: bool,
) -> None:
    """Give ``model`` one output's modules and state: the :class:`~gpytorch_hippo.online.OnlineSGPR` (with
    ``SingleTaskGP``'s kernel and likelihood and a ``ConstantMean`` where none is given), the batch counter, the kept
    data (none yet), the known-noise flag and the hyperparameter record; ``reference`` ``(*, d)`` gives ``d``, the dtype
    and the device."""
    if covar_module is None:
        covar_module = get_covar_module_with_dim_scaled_prior(ard_num_dims=reference.shape[-1])
    if likelihood is None:
        likelihood = get_gaussian_likelihood_with_lognormal_prior()
    if mean_module is None:
        mean_module = gpytorch.means.ConstantMean()
    model.online = OnlineSGPR(inducing_variables, covar_module, likelihood, mean_module).to(reference)
    #: number of batches absorbed (schedules ``refit_every``; in the ``state_dict``)
    model.register_buffer("num_updates", torch.tensor(0, device=reference.device))
    for name in ("stored_inputs", "stored_targets", "stored_noise"):  # keep_data=True: all data, model space
        model.register_buffer(name, None)
    # observation noise variances are given with the data (train_Yvar), not learned (in the state_dict)
    model.register_buffer("known_noise_flag", torch.tensor(bool(known_noise), device=reference.device))
    model.hyperparameter_record = HyperparameterRecord()


def absorb_first_batch(
    model: OutputModel, x: Tensor, y: Tensor, noise: Tensor | None, inducing_variables: InducingVariables | None, modules: Modules
) -> None:
    """A single-output model's first batch ``(x, y)`` (model space, ``(n, d)`` and ``(n,)``; known ``noise`` variances
    or ``None``), as ``SingleTaskGP`` takes its data: BoTorch's input checks, the modules (:func:`build_output`;
    ``modules``: kernel, likelihood and mean, ``None`` for the defaults), HiPPO variables moved to the batch, the
    likelihood's noise fixed at the batch's mean known noise, ``fit_maxiter`` iterations of the fit on the collapsed
    bound, then the mean fixed (HiPPO variables project :math:`f - m`) and the batch absorbed. ``inducing_variables``
    ``None``: the default points, at most ``model.num_inducing`` of the batch's inputs chosen by pivoted Cholesky
    (all of them, the exact GP, up to ``num_inducing``); past ``exact_fit_size`` points the fit is
    :func:`~gpytorch_hippo.botorch.fit.fit_kept_data`'s, on the points of :func:`~gpytorch_hippo.botorch.fit.exact_fit_indices`."""
    validate_like_single_task_gp(x, y, noise)
    build_output(model, x, inducing_variables or InducingPoints(x[:1], learn=False), *modules, known_noise=noise is not None)
    move_inducing(model.online, x, model.ordering)
    if noise is not None:
        fix_noise_level(model.online, noise)
    model.hyperparameter_record.initial = [copy.deepcopy(m.state_dict()) for m in (model.online.covar_module, model.online.likelihood)]
    subset = exact_fit_indices(y, model.exact_fit_size) if inducing_variables is None else None
    num_inducing = cast(int, model.num_inducing)  # set whenever inducing_variables is None
    if inducing_variables is None:
        reselect_inducing(model.online, x if subset is None else x[subset], num_inducing)
    if model.fit_maxiter > 0 and subset is None:
        fit_hyperparameters(model, x, y, maxiter=model.fit_maxiter, noise=noise)
    elif model.fit_maxiter > 0:  # many points: the fit of a subsample, as fit_gpytorch_mll's
        fit_kept_data(model, x[subset], y[subset], model.fit_maxiter)
    if inducing_variables is None and x.shape[0] > num_inducing:
        reselect_inducing(model.online, x, num_inducing)
    model.online.mean_module.requires_grad_(False)
    absorb(model, x, y, noise)
    model.eval()
    if model.fit_maxiter > 0 and subset is None:  # an exact fit_gpytorch_mll that starts here says so (custom_fit)
        model.hyperparameter_record.sparse_fit = model.hyperparameter_record.posterior


def build_outputs(model_class: type, x: Tensor, Y: Tensor, noise: Tensor | None, inducing: list, modules: Modules, options: dict) -> list:
    """The single-output models of ``m > 1`` outputs, each ``model_class(x, Y[..., j:j+1], ...)`` on its column of the
    first batch (model space), with its inducing variables and its own copies of ``modules`` (kernel, likelihood,
    mean), no outcome transform and the ``options`` of the model."""
    return [
        model_class(
            x,
            Y[..., j : j + 1],
            None if noise is None else noise[..., j : j + 1],
            inducing[j],
            *copy.deepcopy(modules),
            outcome_transform=None,
            **options,
        )  # fmt: skip
        for j in range(Y.shape[-1])
    ]


def to_model_space(
    model: Any, X: Tensor, Y: Tensor, Yvar: Tensor | None = None, fit_transforms: bool = False, transform_outcomes: bool = True
) -> tuple[Tensor, Tensor, Tensor | None]:
    """A batch through ``model``'s input and outcome transforms: inputs ``(*b, n, d)`` and targets ``(*b, n, m)``
    broadcast to a common batch shape, and the noise variances ``Yvar`` in the outcome space of the targets.
    ``fit_transforms`` learns the transforms' statistics from this batch (the first); ``transform_outcomes=False``:
    ``Y`` and ``Yvar`` are in the model's outcome space already."""
    x = X
    if hasattr(model, "input_transform"):
        model.input_transform.train(fit_transforms)
        x = model.input_transform(X)
        model.input_transform.eval()
    if hasattr(model, "outcome_transform") and transform_outcomes:
        model.outcome_transform.train(fit_transforms)
        Y, Yvar = model.outcome_transform(Y, Yvar, X=x)
        model.outcome_transform.eval()
    batch = torch.broadcast_shapes(x.shape[:-2], Y.shape[:-2])
    return x.expand(*batch, *x.shape[-2:]), Y.expand(*batch, *Y.shape[-2:]), Yvar


def predictive(model: OutputModel, x: Tensor, observation_noise: bool | Tensor) -> MultivariateNormal:
    """``q(f(x))`` of a single-output model at model-space inputs ``(*b, q, d)`` (broadcast with its batch shape), or
    ``q(y(x))``: ``observation_noise`` ``True`` adds the likelihood's noise, a tensor ``(*b, q, 1)`` these variances."""
    x = x.expand(*torch.broadcast_shapes(x.shape[:-2], model.batch_shape), *x.shape[-2:])
    mvn = model.online(x)
    if isinstance(observation_noise, Tensor):
        try:
            noise = observation_noise.squeeze(-1).expand(mvn.mean.shape)
        except RuntimeError:
            raise ValueError(
                f"observation_noise must broadcast to {tuple(mvn.mean.shape) + (1,)}, got {tuple(observation_noise.shape)}"
            ) from None
        return MultivariateNormal(mvn.mean, mvn.lazy_covariance_matrix + DiagLinearOperator(noise))
    return model.online.likelihood(mvn, x) if observation_noise else mvn


def conditioned(model: Any, x: Tensor, y: Tensor, noise: Tensor | None, refit: bool = False) -> Any:
    """A copy of ``model`` with ``(x, y[..., j])`` (model space; known noise variances ``noise[..., j]`` or the
    likelihood's) absorbed into output ``j`` by one online update, after moving its HiPPO variables forward
    (:func:`~gpytorch_hippo.botorch.inducing.move_inducing`) and, for the default points and a streaming (not fantasy)
    batch, re-selecting them from the old points and the batch; ``refit``: a batch :func:`refit_due` first refits the
    output's hyperparameters on the batch's online bound (:func:`~gpytorch_hippo.botorch.fit.fit_hyperparameters`), or
    with the default points and kept data, after absorbing it, on the exact marginal likelihood of the kept-data
    subsample (:func:`fit_kept_data`)."""
    model = copy_model(model)
    if torch.is_grad_enabled() and (x.requires_grad or y.requires_grad):  # a fantasy: nothing differentiates its copied hyperparameters
        model.requires_grad_(False)
    streaming = x.dim() == 2 and y.dim() == 2 and not (x.requires_grad or y.requires_grad)  # not a fantasy
    for j, output in enumerate(per_output(model)):
        noise_j = None if noise is None else noise[..., j]
        move_inducing(output.online, x, output.ordering)
        on_kept_data = reselects(output) and output.stored_inputs is not None
        due = refit and refit_due(output, on_kept_data)
        if due and not on_kept_data:
            fit_hyperparameters(output, x, y[..., j], maxiter=output.fit_maxiter, noise=noise_j)
        if streaming and reselects(output):
            reselect_inducing(output.online, torch.cat([output.online.inducing_variables.points, x.detach()]), output.num_inducing)
        absorb(output, x, y[..., j], noise_j)
        if due and on_kept_data:  # the exact fit of a kept-data subsample, the batch included; then all kept data's posterior
            fit_kept_data(output, *kept_subsample(output), output.fit_maxiter, start=output.hyperparameter_record.initial)
    return model


def refit_due(model: OutputModel, on_kept_data: bool) -> bool:
    """Whether the next streaming batch of a single-output model is refitted: every ``refit_every``-th batch, and with
    the default points and kept data also each of the first ``refit_every`` (the exact fits of a few points are cheap,
    and the hyperparameters move most while the data are few, as ``SingleTaskGP``'s refit in every iteration);
    decided by the batch counter of the ``state_dict`` alone."""
    every, count = model.refit_every, int(model.num_updates)
    return every is not None and ((count + 1) % every == 0 or (on_kept_data and count < every))


def reselects(model: OutputModel) -> bool:
    """Whether a single-output model re-selects its inducing points (the default points: ``num_inducing`` set)."""
    return model.num_inducing is not None and isinstance(model.online.inducing_variables, InducingPoints)


def copy_model(model: Any) -> Any:
    """A deep copy that shares the summary tensors a differentiable (fantasy) update left in the autograd graph
    (``copy.deepcopy`` refuses those; the copy's next update replaces them)."""
    in_graph = {id(tensor): tensor for tensor in model.buffers() if tensor.grad_fn is not None}
    return copy.deepcopy(model, in_graph)


def broadcast_posterior(online: OnlineSGPR, batch_shape: torch.Size) -> None:
    """Broadcast the stored posterior to ``batch_shape`` in place (BoTorch's fantasies of no points)."""
    for name in ("posterior_chol", "posterior_precision", "posterior_shift", "posterior_prior_mean"):
        tensor = getattr(online, name)
        event = tensor.shape[-2:] if name in ("posterior_chol", "posterior_precision") else tensor.shape[-1:]
        setattr(online, name, tensor.expand(*torch.broadcast_shapes(batch_shape, tensor.shape[: -len(event)]), *event).clone())


def broadcast_model(model: Any, batch_shape: torch.Size) -> Any:
    """A copy of ``model`` whose posteriors are broadcast to ``batch_shape`` (BoTorch's fantasies of no points)."""
    model = copy_model(model)
    for output in per_output(model):
        broadcast_posterior(output.online, batch_shape)
    return model


def subset_outputs(model: Any, indices: list[int]) -> Any:
    """A copy of ``model`` with the outputs ``indices`` only (``subset_output``): one output is ``model.outputs[j]``
    with the model's input transform and output ``j``'s outcome transform; several share the model's."""
    copied = copy_model(model)
    if child_modules(model).get("outputs") is None:
        return copied
    kept = [copied.outputs[j] for j in indices]
    if len(kept) > 1:
        copied.outputs = torch.nn.ModuleList(kept)
    elif hasattr(copied, "input_transform"):
        kept[0].input_transform = copied.input_transform
    result = copied if len(kept) > 1 else kept[0]
    if hasattr(model, "outcome_transform"):
        result.outcome_transform = model.outcome_transform.subset_output(indices)
    return result


#: what a model with several outputs has once per output (``model.outputs[j].covar_module``, ...)
PER_OUTPUT = ("covar_module", "mean_module", "inducing_variables", "online")


def shared_attribute(model: Any, name: str, error: AttributeError) -> Any:
    """``OnlineGPModel.__getattr__`` for a name torch does not hold: the counters every output shares, a message
    naming ``model.outputs[j]`` for what each output has, the kept-data property's own message, else ``error``."""
    outputs = child_modules(model).get("outputs")
    if outputs is not None and name in ("num_updates", "known_noise_flag"):  # the same for every output
        return getattr(outputs[0], name)
    if outputs is not None and name in PER_OUTPUT:
        raise AttributeError(f"a model with {len(outputs)} outputs has one {name} per output: read model.outputs[j].{name}") from None
    if name in ("train_inputs", "train_targets"):  # the property raised: keep its message
        stored_data(per_output(model)[0], name)
    raise error


def stored_data(model: OutputModel, name: str) -> tuple[Tensor, Tensor]:
    """The kept inputs and targets (model space), or a :class:`NoStoredData` naming what to use instead.

    :param model: a single-output model.
    :param name: the attribute asked for, for the message.
    """
    inputs, targets = model.stored_inputs, model.stored_targets
    if inputs is None or targets is None:
        raise NoStoredData(
            f"{name}: this OnlineGPModel keeps no data (keep_data=False), only the online summary q(u). What reads "
            "the training data (fit_gpytorch_mll with an ExactMarginalLogLikelihood, training loops over train_inputs, "
            "qPredictiveEntropySearch) needs a model built with keep_data=True; to refresh the hyperparameters "
            "online, use model.observe(X, Y) with refit_every=k, or model.fit_hyperparameters(x, y)"
        )
    return inputs, targets


def training_data(model: OutputModel, name: str = "train_inputs") -> tuple[Tensor, Tensor]:
    """What ``train_inputs``/``train_targets`` hold: the kept data (:func:`stored_data`), or during an exact fit of a
    subsample (:func:`exact_fit_data`, :func:`fit_kept_data`) that subsample."""
    fit_data = model.hyperparameter_record.fit_data
    return stored_data(model, name) if fit_data is None else fit_data


def kept_subsample(model: OutputModel) -> tuple[Tensor, Tensor]:
    """The kept points of :func:`~gpytorch_hippo.botorch.fit.exact_fit_indices` (recorded in the model's
    ``hyperparameter_record.exact_fit_indices``): inputs and targets."""
    inputs, targets = stored_data(model, "train_inputs")
    indices = exact_fit_indices(targets, model.exact_fit_size) if targets.dim() == 1 else None
    model.hyperparameter_record.exact_fit_indices = indices
    return (inputs, targets) if indices is None else (inputs[indices], targets[indices])


@contextlib.contextmanager
def exact_fit_data(model: Any, active: bool = True):
    """Inside the block (``active``), each output's ``train_inputs``/``train_targets`` hold the kept points of
    :func:`~gpytorch_hippo.botorch.fit.exact_fit_indices` (recorded in ``hyperparameter_record.exact_fit_indices``), so
    that ``fit_gpytorch_mll(ExactMarginalLogLikelihood(...))`` maximises the exact marginal likelihood of at most
    ``exact_fit_size`` points; on leaving, the posterior is recomputed from all kept data (``eval()``)."""
    outputs = [o for o in per_output(model) if active and o.stored_targets is not None and o.hyperparameter_record.fit_data is None]
    for output in outputs:
        output.hyperparameter_record.fit_data = kept_subsample(output)
    try:
        yield
    finally:
        for output in outputs:
            output.hyperparameter_record.fit_data = None


def fit_kept_data(model: OutputModel, x: Tensor, y: Tensor, maxiter: int, start: list[dict] | None = None) -> None:
    """Maximise the exact marginal likelihood of ``(x, y)`` (model space; the likelihood's noise) over a single-output
    model's hyperparameters with BoTorch's fit of ``fit_gpytorch_mll(ExactMarginalLogLikelihood(...))`` (L-BFGS-B, at most
    ``maxiter`` iterations), from the kernel and likelihood states ``start`` (``None``: the current ones); the posterior
    is then recomputed from all kept data. A fit that fails (``ModelFittingError`` after all its attempts) is rolled
    back to the hyperparameters before it, with an :class:`~gpytorch_hippo.botorch.OnlineGPModelWarning`."""
    online = model.online
    before = [copy.deepcopy(m.state_dict()) for m in (online.covar_module, online.likelihood, online.mean_module)]
    for module, state in zip((online.covar_module, online.likelihood), start or []):
        module.load_state_dict(state)
    model.hyperparameter_record.fit_data = (x, y)
    mll = ExactMarginalLogLikelihood(model.likelihood, cast(Any, model))
    try:
        with tensor_state_only(mll), warnings.catch_warnings():
            warnings.simplefilter("ignore", OnlineGPModelWarning)  # the start of a refit is the model's own
            fit_mll_generic(mll, optimizer_kwargs={"options": {"maxiter": maxiter}})
    except ModelFittingError as error:
        for module, state in zip((online.covar_module, online.likelihood, online.mean_module), before):
            module.load_state_dict(state)
        warnings.warn(
            f"the hyperparameter fit on the kept data failed ({error}); the model keeps the hyperparameters it had before the fit",
            OnlineGPModelWarning,
            stacklevel=3,
        )
    finally:
        model.hyperparameter_record.fit_data = None
    model.eval()


def fix_noise_level(online: OnlineSGPR, noise: Tensor) -> None:
    """With known noise the likelihood's noise is not learned: it is the first batch's mean noise, used
    only by ``posterior(X, observation_noise=True)`` (as BoTorch's fixed-noise models use theirs)."""
    noise_covar = online.likelihood.noise_covar
    lower = float(getattr(noise_covar.raw_noise_constraint, "lower_bound", 0.0))
    with torch.no_grad():
        noise_covar.noise = noise.mean().clamp_min(lower * (1 + 1e-6) + 1e-30).reshape(noise_covar.noise.shape)
    noise_covar.raw_noise.requires_grad_(False)


def absorb(model: OutputModel, x: Tensor, y: Tensor, noise: Tensor | None = None) -> None:
    """One online update of ``model``'s posterior by ``(x, y)`` (model space, ``(*b, n, d)`` and ``(*b, n)``), with
    known ``noise`` variances or the likelihood's; the batch joins the kept data (``keep_data=True``). Differentiable
    in ``x`` and ``y`` when they carry gradients (fantasies of look-ahead acquisitions); hyperparameters changed by hand
    since the last batch first recompute the posterior from the kept data."""
    warn_if_approximate(model.online, x, noise)
    differentiable = torch.is_grad_enabled() and (x.requires_grad or y.requires_grad)
    record = model.hyperparameter_record
    if model.stored_inputs is not None and record.differs(model.online, record.posterior):
        refresh_posterior(model)
    model.online.update(x, y, num_iter=0, differentiable=differentiable, noise=noise)
    record.record(model.online)
    model.num_updates += 1
    if not model.keep_data:
        return
    point_noise = torch.full_like(y, float("nan")) if noise is None else noise.detach().expand(y.shape)
    old_x, old_y, old_noise = model.stored_inputs, model.stored_targets, model.stored_noise
    if old_x is None:
        model.stored_inputs, model.stored_targets, model.stored_noise = x.detach().clone(), y.detach().clone(), point_noise.clone()
    elif old_y is None or old_noise is None:
        raise RuntimeError("the model keeps inputs without their targets or noise: load a complete state_dict")
    else:
        batch = torch.broadcast_shapes(old_y.shape[:-1], y.shape[:-1])
        model.stored_inputs = torch.cat([old_x.expand(*batch, *old_x.shape[-2:]), x.detach().expand(*batch, *x.shape[-2:])], dim=-2)
        model.stored_targets = torch.cat([old_y.expand(*batch, -1), y.detach().expand(*batch, -1)], dim=-1)
        model.stored_noise = torch.cat([old_noise.expand(*batch, -1), point_noise.expand(*batch, -1)], dim=-1)


def refresh_posterior(model: OutputModel) -> None:
    """Recompute the stored posterior from all kept data (``keep_data=True``) with the current hyperparameters, as one
    batch: the posterior of a fresh model built on that data (points of unknown noise take the likelihood's)."""
    inputs, targets = stored_data(model, "refresh_posterior")
    if reselects(model) and inputs.dim() == 2:  # the default points: chosen anew from all kept data
        reselect_inducing(model.online, inputs, cast(int, model.num_inducing))
    noise = model.stored_noise
    if noise is not None:
        noise = torch.where(torch.isnan(noise), model.online.likelihood.noise.detach().squeeze(-1).expand_as(noise), noise)
    with torch.no_grad():
        model.online.reset_posterior()
        model.online.update(inputs, targets, num_iter=0, noise=noise)
    model.hyperparameter_record.record(model.online)


def refresh_if_changed(model: Any) -> None:
    """On ``eval()``: recompute a single-output model's posterior from its kept data when its hyperparameters changed
    outside its own updates (an exact fit, a training loop, a warm start) since it was computed."""
    record = getattr(model, "hyperparameter_record", None)  # several outputs: each output's own train() refreshes it
    if record is not None and not record.own_update and model.stored_inputs is not None and record.differs(model.online, record.posterior):
        refresh_posterior(model)


def output_is_warm_start(model: OutputModel, state_dict: dict) -> bool:
    """Whether ``state_dict`` holds the posterior of other observations than ``model``'s, so that ``load_state_dict``
    loads it as a warm start (hyperparameters only) rather than restoring it whole."""
    if not (any(key.startswith("online.posterior_") for key in state_dict) and model.online.has_posterior):
        return False
    own = model.online.state_dict(prefix="online.")
    keys = [k for k in own if k.startswith("online.posterior_") and isinstance(own[k], Tensor)] + ["online.num_tasks"]
    return not all(k in state_dict and state_dict[k].shape == own[k].shape and torch.equal(state_dict[k].to(own[k]), own[k]) for k in keys)


def load_output_hyperparameters(model: OutputModel, state_dict: dict) -> IncompatibleKeys:
    """Load the kernel, likelihood and mean of ``state_dict`` into ``model``, keeping its own state (:data:`OWN_STATE`);
    ``model.eval()`` then recomputes its posterior from the kept data (or carries ``q(u)`` to them without).

    :return: ``(missing_keys, unexpected_keys)`` of the hyperparameters, as ``torch.nn.Module.load_state_dict``'s.
    """
    hyperparameters = {k: v for k, v in state_dict.items() if not k.startswith(OWN_STATE)}
    with own_update(model):
        result = torch.nn.Module.load_state_dict(cast(torch.nn.Module, model), hyperparameters, strict=False)
    unexpected = [k for k in result.unexpected_keys if not k.startswith(OWN_STATE)]
    if unexpected:
        raise RuntimeError(f"unexpected keys in state_dict: {unexpected}")
    model.eval()
    return IncompatibleKeys([k for k in result.missing_keys if not k.startswith(OWN_STATE)], [])


def is_warm_start(model: Any, state_dict: dict) -> bool:
    """Whether ``state_dict`` holds, for some output, the posterior of other observations than ``model``'s
    (:func:`output_is_warm_start`), so that ``load_state_dict`` is a warm start."""
    return any(output_is_warm_start(output, part) for output, part in zip(per_output(model), split_by_output(model, state_dict)))


def load_hyperparameters(model: Any, state_dict: dict) -> IncompatibleKeys:
    """:func:`load_output_hyperparameters` of each output of ``model`` from its part of ``state_dict``."""
    parts = split_by_output(model, state_dict)
    return joined_keys(model, [load_output_hyperparameters(output, part) for output, part in zip(per_output(model), parts)])


def fit_outputs(model: Any, x: Tensor, y: Tensor, maxiter: int = 100, noise: Tensor | None = None) -> None:
    """:func:`~gpytorch_hippo.botorch.fit.fit_hyperparameters` of each output on model-space ``x`` ``(n, d)`` and its
    column of ``y`` (``(n,)`` for one output, else ``(n, m)``), with known ``noise`` like ``y`` or the likelihood's."""
    outputs = per_output(model)
    if len(outputs) == 1:
        fit_hyperparameters(outputs[0], x, y, maxiter=maxiter, noise=noise)
        return
    for j, output in enumerate(outputs):
        fit_hyperparameters(output, x, y[..., j], maxiter=maxiter, noise=None if noise is None else noise[..., j])


def load_state_dict(model: Any, state_dict: dict, strict: bool = True, assign: bool = False):
    """``model.load_state_dict``: a checkpoint of the model's own posteriors restored whole (each output's posterior
    then belongs to the loaded hyperparameters), or a warm start by :func:`load_hyperparameters` per output with an
    :class:`~gpytorch_hippo.botorch.OnlineGPModelWarning`, refused without kept data."""
    outputs, parts = per_output(model), split_by_output(model, state_dict)
    if is_warm_start(model, state_dict):
        if outputs[0].stored_inputs is None:
            raise ValueError(
                "load_state_dict would replace this model's posterior (and its observations) by the checkpoint's, and "
                "this model keeps no data (keep_data=False) to recompute it from: to warm-start the hyperparameters use "
                "model.load_hyperparameters(state_dict); to restore the checkpointed model use "
                "OnlineGPModel.from_state_dict(state_dict, ...)"
            )
        warn_posterior_not_restored()
        return load_hyperparameters(model, state_dict)
    with own_update(*outputs):
        result = torch.nn.Module.load_state_dict(model, state_dict, strict=strict, assign=assign)
    for output, part in zip(outputs, parts):
        if any(key.startswith("online.posterior_") for key in part):
            output.hyperparameter_record.record(output.online)
    return result


def restore_arguments(state_dict: dict, inducing_variables: InducingVariables | None, covar_module, options: dict):
    """What ``OnlineGPModel.from_state_dict`` builds its model with: a reference input ``(1, d)`` (``d`` from the
    checkpoint's length scale, else 1), the inducing variables (the default points: placeholders of the checkpoint's
    shape) and the options (``keep_data``: whether the checkpoint kept data)."""
    lengthscale = state_dict.get("online.covar_module.raw_lengthscale")
    if covar_module is None and lengthscale is None:
        raise ValueError("from_state_dict: pass covar_module= (the checkpoint's kernel has no length scale to read d from)")
    reference = state_dict["online.posterior_shift"].new_zeros(1, 1 if lengthscale is None else lengthscale.shape[-1])
    if inducing_variables is None:  # the default points, as many as the checkpoint's: their values come with it
        options = {"num_inducing": state_dict["online.inducing_variables.points"].shape[-2], **options}
    return reference, inducing_variables, {"keep_data": "stored_inputs" in state_dict, **options}


@contextlib.contextmanager
def tensor_state_only(module: torch.nn.Module):
    """``module.state_dict()`` without non-tensor entries, and ``load_state_dict`` without them, inside the block:
    BoTorch's ``fit_gpytorch_mll`` copies every entry of the state it rolls back to as a tensor, and the models'
    extra state (a time axis, HiPPO's recurrence step) is not a tensor, nor changed by a fit."""

    def drop_extra_state(module, state_dict, prefix, local_metadata) -> None:
        for key in [key for key, value in state_dict.items() if not isinstance(value, Tensor)]:
            del state_dict[key]

    def allow_missing_extra_state(module, incompatible_keys) -> None:
        incompatible_keys.missing_keys[:] = [key for key in incompatible_keys.missing_keys if not key.endswith("_extra_state")]

    handles = [module.register_state_dict_post_hook(drop_extra_state), module.register_load_state_dict_post_hook(allow_missing_extra_state)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
