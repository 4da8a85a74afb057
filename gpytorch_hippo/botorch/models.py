"""The single-output BoTorch online surrogate over :class:`~gpytorch_hippo.online.OnlineSGPR` (thesis ch. 4).

:class:`OnlineGPModel` is a BoTorch ``Model`` whose posterior is the collapsed online sparse GP of
Bui et al. (2017), thesis §4.2.2: with HiPPO inducing variables it is OHSGPR, with inducing points
OSGPR. New observations enter through :meth:`OnlineGPModel.condition_on_observations`, one online
update that touches only the new batch and the stored summary ``q(u)``; old data are never
revisited and, by default, not stored. :class:`OnlineCollapsedMLL` exposes the collapsed online
bound to ``botorch.fit.fit_gpytorch_mll``. An ``(n, m)`` target gives ``m`` independent outputs
(:class:`~gpytorch_hippo.botorch.multioutput.MultiOutputOnlineGPModel`); non-Gaussian observations
have :class:`~gpytorch_hippo.botorch.variational.OnlineVariationalGPModel` over OHSVGP.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import warnings
from typing import Any, cast

import gpytorch
import torch
from botorch.acquisition.objective import PosteriorTransform
from botorch.exceptions.errors import BotorchTensorDimensionError, ModelFittingError
from botorch.exceptions.warnings import BotorchWarning
from botorch.fit import fit_gpytorch_mll
from botorch.models.model import FantasizeMixin, Model
from botorch.models.transforms.input import InputTransform
from botorch.models.transforms.outcome import OutcomeTransform, Standardize
from botorch.models.utils.assorted import validate_input_scaling
from botorch.models.utils.gpytorch_modules import (
    get_covar_module_with_dim_scaled_prior,
    get_gaussian_likelihood_with_lognormal_prior,
)
from botorch.posteriors.gpytorch import GPyTorchPosterior
from botorch.utils.types import DEFAULT
from gpytorch.distributions import MultivariateNormal
from gpytorch.mlls import MarginalLogLikelihood
from linear_operator.operators import DiagLinearOperator
from torch import Tensor

from probseq._compat import DefaultType, IncompatibleKeys, fit_mll_generic, validate_tensor_args
from probseq._validation import check_tensor

from .._validation import floating_dtype
from ..inducing.base import InducingVariables
from ..inducing.hippo_variables import HiPPOInducingVariables
from ..inducing.points import InducingPoints
from ..online import OnlineSGPR
from ..ordering import ORDERING_CRITERIA, order_inputs
from ._checks import check_points_near, check_X_Y, check_Yvar, split_third_argument

__all__ = [
    "OnlineGPModel",
    "OnlineGPModelWarning",
    "InducingApproximationWarning",
    "OnlineModelBase",
    "OnlineCollapsedMLL",
    "default_inducing_points",
    "DEFAULT_NUM_INDUCING",
    "register_multi_output_model",
]

# The class that ``OnlineGPModel(train_X, train_Y)`` builds for ``m > 1`` outputs, registered by
# gpytorch_hippo.botorch.multioutput (which imports this module, so this one cannot import it).
_multi_output_model: type | None = None


class OnlineGPModelWarning(BotorchWarning):
    """Where an :class:`OnlineGPModel` does not do what ``SingleTaskGP`` would at the same BoTorch call: a
    ``load_state_dict`` that does not restore the checkpoint's posterior, an exact fit that starts from the
    sparse fit, the sparse approximation's error, a refit rolled back. A ``BotorchWarning``, so BoTorch's loops
    and the filters of its tutorials (which silence ``RuntimeWarning``) show it."""


@contextlib.contextmanager
def _tensor_state_only(module: torch.nn.Module):
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


def warn_posterior_not_restored() -> None:
    """The :class:`OnlineGPModelWarning` of a warm start by ``load_state_dict`` (one message, so Python's default
    filter shows it once per calling line), for code that meant ``load_state_dict`` as a restore."""
    warnings.warn(
        "load_state_dict of another model's checkpoint loads its hyperparameters (kernel, likelihood, mean) "
        "as SingleTaskGP does and keeps this model's data, posterior and counters: the checkpoint's posterior "
        "is not restored. To restore a checkpointed model use OnlineGPModel.from_state_dict(state_dict, ...); "
        "to warm-start without this warning use model.load_hyperparameters(state_dict)",
        OnlineGPModelWarning,
        stacklevel=3,
    )


class InducingApproximationWarning(OnlineGPModelWarning):
    """New inputs where the inducing variables leave more prior variance than the observation noise: there the
    online model's posterior is wider than ``SingleTaskGP``'s on the same data, and its predictions deviate from it."""


class OnlineCollapsedMLL(MarginalLogLikelihood):
    """The collapsed online bound of absorbing ``(train_x, train_y)`` into ``model``'s stored summary
    (:meth:`OnlineSGPR.log_bound`, the online bound of Bui et al. (2017), thesis eq. (4.6), at the optimal ``q(u)``) plus the log
    priors of the hyperparameters, divided by the batch size, as ``fit_gpytorch_mll`` expects.

    :param model: an :class:`OnlineGPModel`.
    :param train_x: the batch in the model's (input-transformed) space, ``(n, d)``.
    :param train_y: its outcome-transformed targets, ``(n,)``.
    :param noise: known noise variances of the batch in the outcome-transformed space, ``(n,)`` (``None``:
        the likelihood's).
    """

    def __init__(self, model: OnlineGPModel, train_x: Tensor, train_y: Tensor, noise: Tensor | None = None):
        if not isinstance(model, OnlineGPModel):
            raise TypeError(f"model must be an OnlineGPModel, got {type(model).__name__}")
        super().__init__(model.likelihood, model)
        self.train_x, self.train_y, self.noise = train_x, train_y, noise

    def forward(self, function_dist=None, target=None, **kwargs) -> Tensor:
        """The bound per data point for the stored batch ``(train_x, train_y)``; the arguments are ignored.

        :param function_dist: ignored (GPyTorch's interface; the collapsed bound needs no ``q(f)``).
        :param target: ignored (the targets are ``train_y``).
        """
        bound = self.model.online.log_bound(self.train_x, self.train_y, noise=self.noise)
        for _, module, prior, closure, _ in self.model.named_priors():  # the likelihood is inside the model
            bound = bound + prior.log_prob(closure(module)).sum()
        return bound / self.train_y.shape[-1]

    def compute_custom_loss(self, **kwargs) -> Tensor:
        """The loss that ``fit_gpytorch_mll`` minimises (BoTorch's hook for custom objectives)."""
        return -self()

    def state_dict(self, *args, **kwargs) -> dict:
        """The tensors only: ``fit_gpytorch_mll`` checkpoints them to roll back a failed attempt and
        cannot copy non-tensor extra state (HiPPO's recurrence step), which fitting does not change."""
        state = super().state_dict(*args, **kwargs)
        return type(state)((key, value) for key, value in state.items() if isinstance(value, Tensor))

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Loads :meth:`state_dict`'s tensors; the non-tensor extra state it leaves out is kept.

        :param state_dict: a dict of tensors, as :meth:`state_dict` returns.
        :param strict: raise on unexpected keys or missing tensors (missing ``_extra_state`` is fine); default ``True``.
        :param assign: ``torch.nn.Module.load_state_dict``'s: assign the tensors instead of copying them in; default ``False``.
        """
        result = super().load_state_dict(state_dict, strict=False, assign=assign)
        if strict and result.unexpected_keys:
            raise RuntimeError(f"unexpected keys in state_dict: {result.unexpected_keys}")
        missing = [key for key in result.missing_keys if not key.endswith("_extra_state")]
        if strict and missing:
            raise RuntimeError(f"missing keys in state_dict: {missing}")
        return result


# BoTorch's Model and FantasizeMixin declare posterior and condition_on_observations with different signatures;
# BoTorch's own models (SingleTaskGP, ModelListGP) combine the two as this class does.
class OnlineModelBase(Model, FantasizeMixin, gpytorch.models.GP):  # type: ignore[misc]
    """What the online BoTorch surrogates share, :class:`OnlineGPModel` (one output) and
    :class:`~gpytorch_hippo.botorch.multioutput.MultiOutputOnlineGPModel` (independent outputs, one
    :class:`OnlineGPModel` each): BoTorch's input transform, learned on the first batch and applied to each batch
    as it arrives (never re-applied to stored inputs), and BoTorch's fantasies through ``condition_on_observations``.
    Not a model by itself."""

    #: BoTorch's input transform, where the model has one (set in ``__init__``)
    input_transform: InputTransform

    def transform_inputs(self, X: Tensor, input_transform=None) -> Tensor:
        """BoTorch's input transform in eval mode; in train mode the identity, because the inputs a training
        loop or ``fit_gpytorch_mll`` passes (the model's ``train_inputs``) are in the model space already (a second
        transform would re-learn ``Normalize``'s bounds from them).

        :param X: inputs ``(*b, n, d)``.
        :param input_transform: the transform to apply in eval mode; ``None`` (default): the model's own.
        """
        if self.training:
            return X
        return super().transform_inputs(X, input_transform=input_transform)

    def _set_transformed_inputs(self) -> None:
        """No-op: inputs are transformed when they arrive; nothing is re-transformed in ``eval()``."""

    def _revert_to_original_inputs(self) -> None:
        """No-op (see :meth:`_set_transformed_inputs`)."""

    def custom_fit(
        self,
        mll: MarginalLogLikelihood,
        closure=None,
        closure_kwargs: dict | None = None,
        optimizer_kwargs: dict | None = None,
        **kwargs: Any,
    ) -> MarginalLogLikelihood:
        """What BoTorch's ``fit_gpytorch_mll(mll)`` runs for this model (BoTorch calls a model's ``custom_fit``): its
        generic fit, with the model's non-tensor state (a time axis, HiPPO's recurrence step), which a fit does not
        change, left out of the state it rolls back to. An exact fit (e.g. ``ExactMarginalLogLikelihood``) that starts
        from the hyperparameters the constructor fitted on the sparse bound warns (:class:`OnlineGPModelWarning`):
        ``SingleTaskGP`` starts from its priors, and the exact fit can end in a worse local optimum from here.

        :param mll: the marginal likelihood of this model to maximise.
        :param closure: ``fit_gpytorch_mll``'s closure (``None``: BoTorch's default).
        :param closure_kwargs: ``fit_gpytorch_mll``'s keyword arguments of the closure.
        :param optimizer_kwargs: ``fit_gpytorch_mll``'s keyword arguments of the optimiser.
        :param kwargs: ``fit_gpytorch_mll``'s other keyword arguments (``optimizer``, ``max_attempts``, ...).
        """
        if not isinstance(mll, OnlineCollapsedMLL) and self.starts_from_sparse_fit():
            warnings.warn(
                "fit_gpytorch_mll of this online model starts from the hyperparameters its constructor fitted on the "
                "sparse online bound (fit_maxiter > 0), not from SingleTaskGP's start: the exact fit can end in another, "
                "worse local optimum from there. Build the model with fit_maxiter=0 to start the exact fit as "
                "SingleTaskGP does",
                OnlineGPModelWarning,
                stacklevel=3,
            )
        with _tensor_state_only(mll):
            return fit_mll_generic(mll, closure=closure, closure_kwargs=closure_kwargs, optimizer_kwargs=optimizer_kwargs, **kwargs)

    def starts_from_sparse_fit(self) -> bool:
        """Whether the hyperparameters are still those the constructor fitted on the sparse online bound
        (``fit_maxiter > 0``), from which an exact ``fit_gpytorch_mll`` would start
        (:meth:`~gpytorch_hippo.botorch.models.OnlineModelBase.custom_fit` warns)."""
        raise NotImplementedError

    def _inputs_to_model_space(self, X: Tensor, fit_transforms: bool = False) -> Tensor:
        """``X`` through the input transform; ``fit_transforms`` learns its statistics from ``X`` (the first batch)."""
        if not hasattr(self, "input_transform"):
            return X
        self.input_transform.train(fit_transforms)
        x = self.input_transform(X)
        self.input_transform.eval()
        return x


class OnlineGPModel(OnlineModelBase):
    r"""BoTorch surrogate over :class:`~gpytorch_hippo.online.OnlineSGPR` (OHSGPR / OSGPR).

    The first batch ``(train_X, train_Y)`` is absorbed at construction, after its hyperparameters
    are fitted by ``fit_gpytorch_mll`` on the collapsed bound (:class:`OnlineCollapsedMLL`,
    ``fit_maxiter`` L-BFGS iterations at most). Later batches enter through
    :meth:`condition_on_observations` (an online update, no refit), or :meth:`observe`, which
    also refreshes the hyperparameters every ``refit_every`` batches on the online bound of the
    new batch (Bui et al. 2017; old data are not revisited).

    HiPPO inducing variables are moved forward with the stream before each update: 1-D ones (time
    inputs) by ``advance(max(X))`` when ``X`` goes beyond their current ``t``, multidimensional ones
    by ``append_path`` of an un-batched ``X`` ordered by ``ordering`` (thesis §4.4). Inducing points
    stay where they are (replace ``model.inducing_variables`` between updates to move them). A
    t-batched conditioning (BoTorch's fantasies) returns a model with that batch shape; it advances
    the copy's time bases to the largest time in the whole batch (one clock for every batch element,
    each then equal to conditioning a model advanced by hand to that time) and keeps a path fixed.

    Built as BoTorch's ``SingleTaskGP``: ``OnlineGPModel(train_X, train_Y)`` or, with known noise,
    ``OnlineGPModel(train_X, train_Y, train_Yvar)``, with the same default kernel, likelihood and mean,
    ``Standardize`` as the default outcome transform and BoTorch's input warnings (float32 inputs, inputs
    outside the unit cube, unstandardised outcomes). The former positional form
    ``OnlineGPModel(train_X, train_Y, inducing_variables)`` keeps working.

    :param train_X: first batch of inputs, ``(n, d)``.
    :param train_Y: its targets, ``(n, 1)``, or ``(n, m)`` for ``m`` independent outputs.
    :param train_Yvar: known observation noise variances, the shape of ``train_Y`` (``None``: the noise is
        learned). The model then takes the noise of later batches with them (``observe(X, Y, Yvar)``,
        ``condition_on_observations(X, Y, noise=Yvar)``); the likelihood's noise is fixed at the first
        batch's mean, for ``posterior(X, observation_noise=True)`` and fantasies without noise.
    :param inducing_variables: any :class:`~gpytorch_hippo.inducing.InducingVariables` (with
        ``m`` outputs: one set, copied per output, or a sequence of ``m`` sets); default:
        :func:`default_inducing_points` (``num_inducing`` fixed points: the first batch's inputs, then a Sobol
        design in the unit cube, or in the first batch's box when the inputs are not scaled to it).
    :param covar_module: GPyTorch kernel (default: ``SingleTaskGP``'s RBF with a dimension-scaled prior).
    :param likelihood: homoskedastic ``GaussianLikelihood`` (default: ``SingleTaskGP``'s).
    :param mean_module: prior mean (default ``ConstantMean``); learned on the first batch, then
        fixed, because HiPPO inducing variables project :math:`f - m`.
    :param input_transform: e.g. ``Normalize(d, bounds=...)``; learned bounds are learned from the
        first batch and then fixed. Inducing points are given in the transformed space (e.g. in the unit
        cube under ``Normalize``); a set far from every transformed input raises.
    :param outcome_transform: default ``Standardize(m=1)`` (``Standardize(m=m)`` with ``m`` outputs), as
        ``SingleTaskGP``; statistics from the first batch, then fixed; ``None``: no transform.
    :param fit_maxiter: iterations of the first fit (``0``: keep the hyperparameters as given).
    :param refit_every: refresh the hyperparameters in every ``k``-th :meth:`observe` (``None``: never).
        Multidimensional HiPPO variables keep their path memory in features of the first length
        scale: freeze it (``covar_module.raw_lengthscale.requires_grad_(False)``) before refreshing.
    :param keep_data: store all observed data in :attr:`train_inputs`/:attr:`train_targets` (the default, as
        ``SingleTaskGP`` keeps its data: BoTorch's ``fit_gpytorch_mll`` with an ``ExactMarginalLogLikelihood``,
        training loops and warm starts by ``load_state_dict`` then work unchanged); ``False`` stores nothing but
        the online summary, for long streams at a constant memory.
    :param ordering: criterion of :func:`~gpytorch_hippo.ordering.order_inputs` for path variables.
    :param num_inducing: number of the default inducing points (default :data:`DEFAULT_NUM_INDUCING`).
    """

    online: OnlineSGPR
    num_updates: Tensor
    known_noise_flag: Tensor
    # keep_data=True: every batch so far in the model space (None before the first one, or with keep_data=False)
    stored_inputs: Tensor | None
    stored_targets: Tensor | None
    stored_noise: Tensor | None
    _posterior_hyperparameters: list[Tensor] | None
    # the hyperparameters of the constructor's fit of the sparse bound (None: fit_maxiter=0)
    _sparse_fit: list[Tensor] | None

    def __new__(cls, train_X: Tensor | None = None, train_Y: Tensor | None = None, *args: Any, **kwargs: Any):
        # as SingleTaskGP takes (n, m) targets: OnlineGPModel(train_X, train_Y) with m > 1 outputs builds the registered
        # multi-output model (not an OnlineGPModel: one per output inside it), which Python then does not re-initialise
        if cls is OnlineGPModel and isinstance(train_Y, Tensor) and train_Y.dim() >= 2 and train_Y.shape[-1] > 1:
            if _multi_output_model is None:  # gpytorch_hippo.botorch imports the multi-output module with this one
                raise RuntimeError("no multi-output model is registered: import gpytorch_hippo.botorch")
            return _multi_output_model(train_X, train_Y, *args, **kwargs)
        return super().__new__(cls)

    def __init__(
        self,
        train_X: Tensor,
        train_Y: Tensor,
        train_Yvar: Tensor | None = None,
        inducing_variables: InducingVariables | None = None,
        covar_module: gpytorch.kernels.Kernel | None = None,
        likelihood: gpytorch.likelihoods.GaussianLikelihood | None = None,
        mean_module: gpytorch.means.Mean | None = None,
        input_transform: InputTransform | None = None,
        outcome_transform: OutcomeTransform | DefaultType | None = DEFAULT,
        fit_maxiter: int = 100,
        refit_every: int | None = None,
        keep_data: bool = True,
        ordering: str = "kernel_max",
        num_inducing: int | None = None,
    ):
        super().__init__()
        train_Yvar, inducing_variables = split_third_argument(train_Yvar, inducing_variables)
        check_X_Y(train_X, train_Y, "train_X", "train_Y")
        if train_X.dim() != 2:
            raise ValueError(f"train_X must have shape (n, d), got {tuple(train_X.shape)}")
        check_Yvar(train_Yvar, train_Y, "train_Yvar")
        if outcome_transform is DEFAULT:
            outcome_transform = Standardize(m=1)
        self._setup(
            train_X,
            inducing_variables,
            covar_module,
            likelihood,
            mean_module,
            input_transform,
            outcome_transform,
            fit_maxiter,
            refit_every,
            keep_data,
            ordering,
            num_inducing=num_inducing,
            known_noise=train_Yvar is not None,
        )
        x, y = self._to_model_space(train_X, train_Y, fit_transforms=True)
        noise = None if train_Yvar is None else self._noise_to_model_space(train_X, train_Y, train_Yvar)
        _validate_like_single_task_gp(x, y, noise)
        if input_transform is not None:
            check_points_near(self.inducing_variables, x)
        self._move_inducing(x)
        if noise is not None:
            self._set_known_noise_level(noise)
        if fit_maxiter > 0:
            self.fit_hyperparameters(x, y, maxiter=fit_maxiter, noise=noise)
        self.online.mean_module.requires_grad_(False)
        self._absorb(train_X, train_Y, x, y, noise)
        self.eval()
        if fit_maxiter > 0:  # an exact fit_gpytorch_mll that starts here says so (custom_fit)
            self._sparse_fit = self._posterior_hyperparameters

    def _setup(
        self,
        reference: Tensor,
        inducing_variables,
        covar_module,
        likelihood,
        mean_module,
        input_transform,
        outcome_transform,
        fit_maxiter,
        refit_every,
        keep_data,
        ordering,
        num_inducing=None,
        known_noise=False,
    ) -> None:
        """The modules and settings: ``reference`` (the first batch's inputs, or a placeholder of shape
        ``(d,)``) gives ``d``, the dtype and the device, and places the default inducing points."""
        if isinstance(likelihood, gpytorch.likelihoods.FixedNoiseGaussianLikelihood):
            raise TypeError(
                "likelihood: for known observation noise pass train_Yvar (and Yvar to observe, noise= to "
                "condition_on_observations) with a GaussianLikelihood, instead of a FixedNoiseGaussianLikelihood"
            )
        for name, value, allow_none in (("fit_maxiter", fit_maxiter, False), ("refit_every", refit_every, True)):
            if value is None and allow_none:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "fit_maxiter" else 1):
                raise ValueError(f"{name} must be a {'non-negative' if name == 'fit_maxiter' else 'positive'} int, got {value!r}")
        if ordering not in ORDERING_CRITERIA:
            raise ValueError(f"ordering must be one of {ORDERING_CRITERIA}, got {ordering!r}")
        dim = reference.shape[-1]
        #: ``d``, the number of inputs (a 1-D ``X`` of a model with ``d = 1`` is read as ``n`` points)
        self.num_inputs = dim
        if input_transform is not None:
            self.input_transform = input_transform.to(reference)
        if inducing_variables is None:
            inducing_variables = default_inducing_points(self._placement_inputs(reference), num_inducing)
        elif num_inducing is not None:
            raise ValueError("num_inducing sets the number of the default inducing points: pass it or inducing_variables, not both")
        if covar_module is None:
            covar_module = get_covar_module_with_dim_scaled_prior(ard_num_dims=dim)
        if likelihood is None:
            likelihood = get_gaussian_likelihood_with_lognormal_prior()
        if mean_module is None:
            mean_module = gpytorch.means.ConstantMean()
        self.online = OnlineSGPR(inducing_variables, covar_module, likelihood, mean_module).to(reference)
        if outcome_transform is not None:
            self.outcome_transform = outcome_transform.to(reference)
        self.fit_maxiter, self.refit_every, self.keep_data, self.ordering = fit_maxiter, refit_every, keep_data, ordering
        #: number of batches absorbed (schedules ``refit_every``; in the ``state_dict``)
        self.register_buffer("num_updates", torch.tensor(0, device=reference.device))
        for name in ("stored_inputs", "stored_targets", "stored_noise"):  # keep_data=True: all data, model space
            self.register_buffer(name, None)
        self._posterior_hyperparameters = None
        self._sparse_fit = None
        self._internal_refit = False
        # observation noise variances are given with the data (train_Yvar), not learned (in the state_dict)
        self.register_buffer("known_noise_flag", torch.tensor(bool(known_noise), device=reference.device))

    def _placement_inputs(self, reference: Tensor) -> Tensor:
        """The first batch's inputs in model space, where the default inducing points are placed."""
        if reference.dim() < 2 or not hasattr(self, "input_transform"):
            return reference
        self.input_transform.train()
        with torch.no_grad():
            x = self.input_transform(reference)
        self.input_transform.eval()
        return x

    def _noise_to_model_space(self, X: Tensor, Y: Tensor, Yvar: Tensor) -> Tensor:
        """Observation noise variances ``Yvar`` ``(*b, n, 1)`` in the model's outcome space, ``(*b, n)``."""
        if hasattr(self, "outcome_transform"):
            _, Yvar = self.outcome_transform(Y, Yvar, X=self.transform_inputs(X))
        return Yvar[..., 0]

    def _set_known_noise_level(self, noise: Tensor) -> None:
        """With known noise the likelihood's noise is not learned: it is the first batch's mean noise, used
        only by ``posterior(X, observation_noise=True)`` (as BoTorch's fixed-noise models use theirs)."""
        noise_covar = self.likelihood.noise_covar
        lower = float(getattr(noise_covar.raw_noise_constraint, "lower_bound", 0.0))
        with torch.no_grad():
            noise_covar.noise = noise.mean().clamp_min(lower * (1 + 1e-6) + 1e-30).reshape(noise_covar.noise.shape)
        noise_covar.raw_noise.requires_grad_(False)

    # ------------------------------------------------------------------ BoTorch's model contract
    @property
    def known_noise(self) -> bool:
        """Whether the model was built with ``train_Yvar``: later batches bring their noise variances."""
        return bool(self.known_noise_flag)

    @property
    def likelihood(self) -> gpytorch.likelihoods.GaussianLikelihood:
        return self.online.likelihood

    @property
    def covar_module(self) -> gpytorch.kernels.Kernel:
        return self.online.covar_module

    @property
    def mean_module(self) -> gpytorch.means.Mean:
        return self.online.mean_module

    @property
    def inducing_variables(self) -> InducingVariables:
        return self.online.inducing_variables

    @inducing_variables.setter
    def inducing_variables(self, value: InducingVariables) -> None:
        if not isinstance(value, InducingVariables):
            raise TypeError(f"inducing_variables must be an InducingVariables instance, got {type(value).__name__}")
        self.online.inducing_variables = value

    @property
    def num_outputs(self) -> int:
        return 1

    @property
    def batch_shape(self) -> torch.Size:
        """Empty, except for models conditioned on t-batched (fantasy) observations."""
        if not self.online.has_posterior:
            raise RuntimeError("no task has been absorbed yet: condition the model on observations first")
        return cast(Tensor, self.online.posterior_shift).shape[:-1]

    @property
    def train_inputs(self) -> tuple[Tensor]:
        """All inputs seen so far (model space, after the input transform), if ``keep_data=True``."""
        return (self._stored_data("train_inputs")[0],)

    @property
    def train_targets(self) -> Tensor:
        """All targets seen so far (after the outcome transform, shape ``(n,)``), if ``keep_data=True``."""
        return self._stored_data("train_targets")[1]

    def _stored_data(self, name: str) -> tuple[Tensor, Tensor]:
        inputs, targets = self.stored_inputs, self.stored_targets
        if inputs is None or targets is None:
            raise _NoStoredData(
                f"{name}: this OnlineGPModel keeps no data (keep_data=False), only the online summary q(u). What reads "
                "the training data (fit_gpytorch_mll with an ExactMarginalLogLikelihood, training loops over train_inputs, "
                "qPredictiveEntropySearch) needs a model built with keep_data=True; to refresh the hyperparameters "
                "online, use model.observe(X, Y) with refit_every=k, or model.fit_hyperparameters(x, y)"
            )
        return inputs, targets

    # ------------------------------------------------------------------ hyperparameters and the stored posterior
    def _hyperparameter_tensors(self) -> list[Tensor]:
        modules = (self.online.covar_module, self.online.likelihood, self.online.mean_module)
        return [t for module in modules for t in itertools.chain(module.parameters(), module.buffers())]

    def starts_from_sparse_fit(self) -> bool:
        return self._sparse_fit is not None and not self._hyperparameters_changed_from(self._sparse_fit)

    def subset_output(self, idcs: list[int]) -> OnlineGPModel:
        """BoTorch's ``subset_output`` of a single-output model: a copy for ``[0]``.

        :param idcs: ``[0]``.
        """
        if list(idcs) != [0]:
            raise ValueError(f"idcs must be [0] for a single-output model, got {idcs!r}")
        return self._copy()

    def _hyperparameters_changed(self) -> bool:
        """Whether the kernel, likelihood or mean changed since the stored posterior was computed."""
        return self._posterior_hyperparameters is not None and self._hyperparameters_changed_from(self._posterior_hyperparameters)

    def _hyperparameters_changed_from(self, snapshot: list[Tensor]) -> bool:
        """Whether the kernel, likelihood or mean differ from ``snapshot`` (:meth:`_record_hyperparameters`)."""
        tensors = self._hyperparameter_tensors()
        return len(snapshot) != len(tensors) or any(a.shape != b.shape or not torch.equal(a, b.detach()) for a, b in zip(snapshot, tensors))

    def _record_hyperparameters(self) -> None:
        self._posterior_hyperparameters = [t.detach().clone() for t in self._hyperparameter_tensors()]

    def train(self, mode: bool = True) -> OnlineGPModel:
        """GPyTorch's modes. Returning to eval mode after the hyperparameters were changed outside the
        model's own updates (BoTorch's ``fit_gpytorch_mll`` with an ``ExactMarginalLogLikelihood``, a
        torch training loop, ``load_hyperparameters``) recomputes the stored posterior from the kept data
        (``keep_data=True``) with the new hyperparameters, so that it equals a fresh model's; without kept
        data the stored ``q(u)`` is carried to them as the online update carries it (Bui et al. 2017).

        :param mode: ``True`` (default) for train mode, ``False`` for eval mode.
        """
        super().train(mode)
        for name in ("input_transform", "outcome_transform"):  # statistics of the first batch, then fixed
            if hasattr(self, name):
                getattr(self, name).eval()
        if not mode and not self._internal_refit and self.stored_inputs is not None and self._hyperparameters_changed():
            self.refresh_posterior()
        return self

    def refresh_posterior(self) -> None:
        """Recompute the stored posterior from all kept data (``keep_data=True``) with the current
        hyperparameters, as one batch: the posterior of a fresh model built on that data."""
        inputs, targets = self._stored_data("refresh_posterior")
        noise = self.stored_noise
        if noise is not None:
            noise = torch.where(torch.isnan(noise), self.likelihood.noise.detach().squeeze(-1).expand_as(noise), noise)
        with torch.no_grad():
            self.online.reset_posterior()
            self.online.update(inputs, targets, num_iter=0, noise=noise)
        self._record_hyperparameters()

    def load_hyperparameters(self, state_dict: dict):
        """Warm start, as ``SingleTaskGP.load_state_dict`` of another model: load the kernel, likelihood and mean
        of ``state_dict`` and keep this model's data, counters, transforms (the statistics its kept targets were
        transformed with) and posterior (recomputed from the kept data with the loaded hyperparameters when
        ``keep_data=True``).

        :param state_dict: a ``state_dict`` of an :class:`OnlineGPModel` with the same modules; its keys of this
            model's own state (posterior, counters, data, transforms, inducing variables) are ignored.
        :return: ``(missing_keys, unexpected_keys)`` as ``torch.nn.Module.load_state_dict`` returns them, for the
            hyperparameters (this model's own state, kept on purpose, is not reported missing).
        """
        own = (
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
        hyperparameters = {k: v for k, v in state_dict.items() if not k.startswith(own)}
        with self._own_update():
            result = super().load_state_dict(hyperparameters, strict=False)
        unexpected = [k for k in result.unexpected_keys if not k.startswith(own)]
        if unexpected:
            raise RuntimeError(f"unexpected keys in state_dict: {unexpected}")
        self.eval()
        return IncompatibleKeys([k for k in result.missing_keys if not k.startswith(own)], [])

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Restore a checkpoint, or warm-start as ``SingleTaskGP`` does.

        A checkpoint of this model's own posterior (or a model without one, as :meth:`from_state_dict` builds)
        is restored whole: hyperparameters, posterior summary, counters and kept data. A ``state_dict`` of a
        model with other observations (BoTorch tutorials' ``model.load_state_dict(old_model.state_dict())``
        after rebuilding on more data) is a warm start, :meth:`load_hyperparameters`: kernel, likelihood and mean
        loaded as ``SingleTaskGP`` loads them, the posterior recomputed from this model's data, and an
        :class:`OnlineGPModelWarning` says that the checkpoint's posterior was not restored (restore one with
        :meth:`from_state_dict`; warm-start without the warning with :meth:`load_hyperparameters`); without kept
        data (``keep_data=False``) it is refused, because this model's observations could not be recovered.

        :param state_dict: a ``state_dict`` of an :class:`OnlineGPModel` with the same modules.
        :param strict: as ``torch.nn.Module.load_state_dict`` (raise on missing or unexpected keys); default ``True``.
            Not used by a warm start, which ignores this model's own keys.
        :param assign: as ``torch.nn.Module.load_state_dict`` (assign instead of copying); default ``False``.
        """
        if self.is_warm_start(state_dict):
            if self.stored_inputs is not None:
                warn_posterior_not_restored()
                return self.load_hyperparameters(state_dict)
            raise ValueError(
                "load_state_dict would replace this model's posterior (and its observations) by the checkpoint's, and "
                "this model keeps no data (keep_data=False) to recompute it from: to warm-start the hyperparameters use "
                "model.load_hyperparameters(state_dict); to restore the checkpointed model use "
                "OnlineGPModel.from_state_dict(state_dict, ...)"
            )
        with self._own_update():
            result = super().load_state_dict(state_dict, strict=strict, assign=assign)
        if any(key.startswith("online.posterior_") for key in state_dict):  # the loaded posterior belongs to the loaded hyperparameters
            self._record_hyperparameters()
        return result

    def is_warm_start(self, state_dict: dict) -> bool:
        """Whether ``state_dict`` holds the posterior of other observations than this model's, so that
        :meth:`load_state_dict` loads it as a warm start (hyperparameters only) rather than restoring it whole.

        :param state_dict: a ``state_dict`` of an :class:`OnlineGPModel`.
        """
        has_summary = any(key.startswith("online.posterior_") for key in state_dict)
        return has_summary and self.online.has_posterior and not self._same_posterior(state_dict)

    def _same_posterior(self, state_dict: dict) -> bool:
        own = self.online.state_dict(prefix="online.")
        keys = [k for k in own if k.startswith("online.posterior_") and isinstance(own[k], Tensor)] + ["online.num_tasks"]
        return all(k in state_dict and state_dict[k].shape == own[k].shape and torch.equal(state_dict[k].to(own[k]), own[k]) for k in keys)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        for name in ("stored_inputs", "stored_targets", "stored_noise"):
            if prefix + name in state_dict and getattr(self, name) is None:
                setattr(self, name, torch.empty_like(state_dict[prefix + name]))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)

    @classmethod
    def from_state_dict(
        cls,
        state_dict: dict,
        inducing_variables: InducingVariables | None = None,
        covar_module: gpytorch.kernels.Kernel | None = None,
        likelihood: gpytorch.likelihoods.GaussianLikelihood | None = None,
        mean_module: gpytorch.means.Mean | None = None,
        input_transform: InputTransform | None = None,
        outcome_transform: OutcomeTransform | DefaultType | None = DEFAULT,
        **options: Any,
    ) -> OnlineGPModel:
        """Rebuild a checkpointed model without its training data: the same modules (or defaults) as
        when it was built, then its ``state_dict`` (posterior, hyperparameters, counters, kept data).
        ``options``: ``fit_maxiter``, ``refit_every``, ``keep_data`` (default: whether the checkpoint has kept
        data), ``ordering`` as in the constructor.

        :param state_dict: the checkpoint, a ``state_dict`` of an :class:`OnlineGPModel`.
        :param inducing_variables: inducing variables of the same kind and number as when the model was built
            (values are loaded); ``None`` (default): the default inducing points, read from the checkpoint.
        :param covar_module: the kernel as built (default ``SingleTaskGP``'s, its dimension read from the checkpoint's
            length scale; required when that kernel has none).
        :param likelihood: the likelihood as built (default ``SingleTaskGP``'s).
        :param mean_module: the mean as built (default ``ConstantMean``).
        :param input_transform: the input transform as built (default none); its statistics are loaded.
        :param outcome_transform: the outcome transform as built (default ``Standardize(m=1)``; ``None``: none).
        """
        reference = state_dict["online.posterior_shift"]
        lengthscale = state_dict.get("online.covar_module.raw_lengthscale")
        if covar_module is None and lengthscale is None:
            raise ValueError("from_state_dict: pass covar_module= (the checkpoint's kernel has no length scale to read d from)")
        dim = lengthscale.shape[-1] if lengthscale is not None else 1
        settings = {
            "fit_maxiter": 100,
            "refit_every": None,
            "keep_data": "stored_inputs" in state_dict,
            "ordering": "kernel_max",
            **options,
        }
        if inducing_variables is None:  # the default points: their values come with the checkpoint
            points = state_dict["online.inducing_variables.points"]
            inducing_variables = InducingPoints(torch.zeros_like(points), learn=False)
        if outcome_transform is DEFAULT:
            outcome_transform = Standardize(m=1)
        model = cls.__new__(cls)
        super(OnlineGPModel, model).__init__()
        model._setup(
            reference.new_zeros(dim),
            inducing_variables,
            covar_module,
            likelihood,
            mean_module,
            input_transform,
            outcome_transform,
            **settings,
        )
        model.online.mean_module.requires_grad_(False)  # fixed after the first batch, as in the constructor
        model.load_state_dict(state_dict)
        model.eval()
        return model

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name in ("train_inputs", "train_targets"):  # the property raised: keep its message
                self._stored_data(name)
            raise

    def posterior(  # type: ignore[override]  # Model's signature, which FantasizeMixin's narrower one does not follow
        self,
        X: Tensor,
        output_indices: list[int] | None = None,
        observation_noise: bool | Tensor = False,
        posterior_transform: PosteriorTransform | None = None,
    ) -> GPyTorchPosterior:
        """``q(f(X))`` (or ``q(y(X))`` with ``observation_noise``) for ``X`` of shape ``(*b, q, d)``:
        a ``GPyTorchPosterior`` over ``broadcast(b, batch_shape) x q x 1`` in the outcome space.

        :param X: inputs ``(*b, q, d)`` in the original input space (``(q,)`` for 1-D inputs).
        :param output_indices: ``None`` (default) or ``[0]``: the model has one output.
        :param observation_noise: ``False`` (default): the latent ``f``; ``True``: add the likelihood's noise; a tensor
            ``(*b, q, 1)``: these noise variances, added in the model's (outcome-transformed) space as BoTorch does.
        :param posterior_transform: BoTorch ``PosteriorTransform`` applied to the result; ``None`` (default): none.
        """
        if output_indices is not None and list(output_indices) != [0]:
            raise ValueError(f"output_indices must be None or [0] for a single-output model, got {output_indices!r}")
        X = check_tensor(X, "X", dtype=floating_dtype(self.covar_module))
        if X.dim() == 1 and self.num_inputs == 1:  # n points of a 1-D input, as SingleTaskGP reads them
            X = X.unsqueeze(-1)
        if X.dim() < 2:
            raise ValueError(f"X must have shape (*batch, q, d), got {tuple(X.shape)}")
        self.eval()
        x = self.transform_inputs(X)
        x = x.expand(*torch.broadcast_shapes(x.shape[:-2], self.batch_shape), *x.shape[-2:])
        mvn = self.online(x)
        if isinstance(observation_noise, Tensor):
            if observation_noise.dim() < 2 or observation_noise.shape[-1] != 1:
                raise BotorchTensorDimensionError(
                    f"observation_noise must have shape (*batch, q, 1) (one output), got {tuple(observation_noise.shape)}"
                )
            noise = observation_noise.squeeze(-1)
            try:
                noise = noise.expand(mvn.mean.shape)
            except RuntimeError:
                raise ValueError(
                    f"observation_noise must broadcast to {tuple(mvn.mean.shape) + (1,)}, got {tuple(observation_noise.shape)}"
                ) from None
            mvn = MultivariateNormal(mvn.mean, mvn.lazy_covariance_matrix + DiagLinearOperator(noise))
        elif observation_noise:
            mvn = self.likelihood(mvn, x)
        posterior = GPyTorchPosterior(distribution=mvn)
        if hasattr(self, "outcome_transform"):
            posterior = self.outcome_transform.untransform_posterior(posterior, X=x)
        if posterior_transform is not None:
            return posterior_transform(posterior)
        return posterior

    def forward(self, X: Tensor) -> MultivariateNormal:
        r"""GPyTorch's ``model(X)``. Eval mode: :math:`q(f(X))` after the input transform, in the model's
        (transformed) outcome space; BoTorch's acquisitions call :meth:`posterior`. Train mode, as an
        ``ExactGP``: the prior :math:`\mathcal{N}(m(X), k(X, X))` at model-space inputs such as :attr:`train_inputs`, so that
        ``ExactMarginalLogLikelihood`` (``fit_gpytorch_mll``, a torch training loop) is the exact marginal
        likelihood of the kept data; back in eval mode the stored posterior is recomputed (:meth:`train`).

        :param X: inputs ``(*b, n, d)``: original-space inputs in eval mode, model-space inputs in train mode.
        """
        X = check_tensor(X, "X", dtype=floating_dtype(self.covar_module), min_dim=2)
        if self.training:
            return MultivariateNormal(self.mean_module(X), self.covar_module(X))
        return self.online(self.transform_inputs(X))

    def condition_on_observations(self, X: Tensor, Y: Tensor, **kwargs: Any) -> OnlineGPModel:
        """A new model with ``(X, Y)`` absorbed by one online update (no refit; old data not revisited).

        ``X``: ``(*b, n, d)``; ``Y``: ``(*b', n, 1)`` with ``b'`` broadcasting with ``b`` (BoTorch's
        fantasies put the samples in front). The original model is not changed.

        :param X: new inputs ``(*b, n, d)`` in the original input space.
        :param Y: their observations ``(*b', n, 1)`` in the original outcome space.
        :param kwargs: only ``noise``: known noise variances ``(*batch, n, 1)`` like ``Y`` (original outcome space);
            without it the likelihood's noise is used.
        """
        unknown = sorted(set(kwargs) - {"noise"})
        if unknown:
            raise TypeError(f"condition_on_observations got unexpected keyword arguments {unknown}")
        if isinstance(X, Tensor) and isinstance(Y, Tensor) and X.dim() >= 2 and X.shape[-2] == 0 and Y.shape[-2:] == (0, 1):
            return self._with_batch_shape(torch.broadcast_shapes(X.shape[:-2], Y.shape[:-2]))  # fantasies of no points
        check_X_Y(X, Y, "X", "Y")
        noise = kwargs.get("noise")
        if noise is not None:
            noise = check_tensor(noise, "noise", dtype=floating_dtype(self.covar_module))
            if noise.dim() < 2 or noise.shape[-1] != 1:
                raise BotorchTensorDimensionError(f"noise must have shape (*batch, n, 1) like Y, got {tuple(noise.shape)}")
            noise = self._noise_to_model_space(X, Y, noise)  # in the outcome space, as Y: into the model's space
        return self._conditioned(X, Y, noise)

    def get_fantasy_model(self, inputs: Tensor, targets: Tensor, noise: Tensor | None = None, **kwargs: Any) -> OnlineGPModel:
        """GPyTorch's name for conditioning, as BoTorch's ``ModelListGP.condition_on_observations`` calls it:
        ``inputs`` ``(*b, n, d)``, ``targets`` ``(*b', n)`` and ``noise`` already in the outcome-transformed space.

        :param inputs: new inputs ``(*b, n, d)`` in the original input space.
        :param targets: their observations ``(*b', n)`` in the outcome-transformed space.
        :param noise: known noise variances of the observations (outcome-transformed space), broadcasting to
            ``targets``; ``None`` (default): the likelihood's noise.
        """
        if kwargs:
            raise TypeError(f"get_fantasy_model got unexpected keyword arguments {sorted(kwargs)}")
        targets = check_tensor(targets, "targets").unsqueeze(-1)
        check_X_Y(inputs, targets, "inputs", "targets")
        if noise is not None:
            noise = check_tensor(noise, "noise", dtype=floating_dtype(self.covar_module))
        return self._conditioned(inputs, targets, noise, outcome_transformed=True)

    def _conditioned(self, X: Tensor, Y: Tensor, noise: Tensor | None, outcome_transformed: bool = False) -> OnlineGPModel:
        model = self._copy()
        x, y = model._to_model_space(X, Y, outcome_transformed=outcome_transformed)
        model._move_inducing(x)
        model._absorb(X, Y, x, y, noise)
        return model

    def observe(self, X: Tensor, Y: Tensor, Yvar: Tensor | None = None) -> OnlineGPModel:
        """Streaming step: :meth:`condition_on_observations` with an un-batched ``(n, d)`` batch, then,
        every ``refit_every`` batches, hyperparameters refreshed on the new batch's online bound
        before it is absorbed. ``Yvar``: the batch's known noise variances ``(n, 1)``, required by a
        model built with ``train_Yvar``.

        :param X: the batch's inputs ``(n, d)`` in the original input space.
        :param Y: its observations ``(n, 1)`` in the original outcome space.
        :param Yvar: its known noise variances ``(n, 1)`` (original outcome space); ``None`` (default) for a model
            that learns its noise.
        :return: a new model; this one is not changed.
        """
        check_X_Y(X, Y, "X", "Y")
        if X.dim() != 2:
            raise ValueError(f"X must have shape (n, d) in observe (streaming data), got {tuple(X.shape)}")
        check_Yvar(Yvar, Y, "Yvar")
        if self.known_noise and Yvar is None:
            raise ValueError("this model was built with train_Yvar (known noise): pass the batch's noise variances as Yvar")
        if self.refit_every is None or (self.num_updates + 1) % self.refit_every != 0:
            return self.condition_on_observations(X, Y) if Yvar is None else self.condition_on_observations(X, Y, noise=Yvar)
        model = self._copy()
        x, y = model._to_model_space(X, Y)
        noise = None if Yvar is None else model._noise_to_model_space(X, Y, Yvar)
        model._move_inducing(x)
        model.fit_hyperparameters(x, y, maxiter=model.fit_maxiter, noise=noise)
        model._absorb(X, Y, x, y, noise)
        return model

    def fit_hyperparameters(self, x: Tensor, y: Tensor, maxiter: int = 100, noise: Tensor | None = None) -> None:
        """Maximise the collapsed online bound of absorbing ``(x, y)`` (model space) over the trainable
        hyperparameters with ``fit_gpytorch_mll`` (L-BFGS-B, at most ``maxiter`` iterations). A fit
        that ends below its starting bound (L-BFGS-B can stop "ABNORMAL" after a bad line search) is
        rolled back: a refit never leaves the bound lower than it found it. A fit that fails
        (``fit_gpytorch_mll`` raises ``ModelFittingError`` after all its attempts) is rolled back too, with an
        :class:`OnlineGPModelWarning`. ``noise``: known noise variances of the batch (model space).

        :param x: the batch's inputs ``(n, d)`` in the model (input-transformed) space.
        :param y: its targets ``(n,)`` in the model (outcome-transformed) space.
        :param maxiter: the most L-BFGS-B iterations (default 100).
        :param noise: known noise variances ``(n,)`` of the batch in the model space; ``None`` (default): the
            likelihood's noise, which is then fitted too.
        """
        mll = OnlineCollapsedMLL(self, x, y, noise)
        with torch.no_grad():
            start = mll()
        before = {key: value.clone() for key, value in mll.state_dict().items()}
        with self._own_update():  # the online refit: the stored q(u) is carried to the new hyperparameters
            try:
                fit_gpytorch_mll(mll, optimizer_kwargs={"options": {"maxiter": maxiter}})
            except ModelFittingError as error:
                mll.load_state_dict(before)
                warnings.warn(
                    f"the hyperparameter fit on the online bound failed ({error}); the model keeps the hyperparameters it "
                    "had before the fit",
                    OnlineGPModelWarning,
                    stacklevel=2,
                )
            self.eval()
            with torch.no_grad():
                if not mll() >= start:
                    mll.load_state_dict(before)
        if self.online.has_posterior:
            self._record_hyperparameters()

    # ------------------------------------------------------------------ internals
    def _with_batch_shape(self, batch_shape: torch.Size) -> OnlineGPModel:
        """A copy with the same posterior, broadcast to ``batch_shape`` (BoTorch's fantasies of no points)."""
        model = self._copy()
        online = model.online
        for name in ("posterior_chol", "posterior_precision", "posterior_shift", "posterior_prior_mean"):
            tensor = getattr(online, name)
            event = tensor.shape[-2:] if name in ("posterior_chol", "posterior_precision") else tensor.shape[-1:]
            setattr(online, name, tensor.expand(*torch.broadcast_shapes(batch_shape, tensor.shape[: -len(event)]), *event).clone())
        return model

    def _copy(self) -> OnlineGPModel:
        """A deep copy that shares the summary tensors a differentiable (fantasy) update left in the
        autograd graph (``copy.deepcopy`` refuses those; the copy's next update replaces them)."""
        in_graph = {id(tensor): tensor for tensor in self.buffers() if tensor.grad_fn is not None}
        return copy.deepcopy(self, in_graph)

    def _to_model_space(
        self, X: Tensor, Y: Tensor, fit_transforms: bool = False, outcome_transformed: bool = False
    ) -> tuple[Tensor, Tensor]:
        """Transformed inputs and targets, broadcast to a common batch shape; ``fit_transforms``
        learns the transforms' statistics from this batch (train mode), later batches reuse them;
        ``outcome_transformed``: ``Y`` is in the model's outcome space already."""
        x = self._inputs_to_model_space(X, fit_transforms)
        if hasattr(self, "outcome_transform") and not outcome_transformed:
            self.outcome_transform.train(fit_transforms)
            Y, _ = self.outcome_transform(Y, X=x)
            self.outcome_transform.eval()
        batch = torch.broadcast_shapes(x.shape[:-2], Y.shape[:-2])
        return x.expand(*batch, *x.shape[-2:]), Y[..., 0].expand(*batch, Y.shape[-2])

    def _move_inducing(self, x: Tensor) -> None:
        """Move HiPPO inducing variables forward to cover the inputs ``x`` ``(*b, n, d)`` (class docstring): time
        bases to the largest time of every batch, the path of multidimensional ones only by un-batched inputs."""
        ivs = self.online.inducing_variables
        if not isinstance(ivs, HiPPOInducingVariables):
            return
        if ivs.input_dim == 1:
            t_new = float(x.detach().max())
            if t_new > ivs.t:
                ivs.advance(t_new)
            return
        if x.dim() != 2:
            return
        start = None if ivs.path_pending.shape[0] == 0 else ivs.path_pending[-1].to(x)
        order = order_inputs(x.detach(), self.ordering, kernel=self.online.covar_module, start=start)
        ivs.append_path(x.detach()[order], kernel=self.online.covar_module)

    def _warn_if_approximate(self, X: Tensor, noise: Tensor | None) -> None:
        r"""An :class:`InducingApproximationWarning` where inducing points leave more prior variance at the new inputs
        ``X`` than the observation noise: the Nyström residual :math:`k(x, x) - K_{xu} K_{uu}^{-1} K_{ux}`
        (:meth:`~gpytorch_hippo.inducing.InducingVariables.captured_variance`) bounds the sparse posterior variance at
        :math:`x` from below, while the exact GP's at an observed input is below the noise variance. (HiPPO variables
        have the captured-variance monitor of :class:`~gpytorch_hippo.online.OnlineSGPR`.)"""
        if not isinstance(self.inducing_variables, InducingPoints):
            return
        x = self._inputs_to_model_space(X.detach())
        x = x.reshape(-1, x.shape[-1])
        kernel = self.online.covar_module
        captured = self.inducing_variables.captured_variance(kernel, x, reduction="none")
        with torch.no_grad():
            residual = kernel(x, diag=True) * (1 - captured)
            level = self.likelihood.noise.detach().max() if noise is None else noise.detach().max()
        if bool(residual.max() > level):
            warnings.warn(
                "the inducing variables capture too little of the prior at the new inputs: the residual variance "
                "k(x, x) - Q(x, x) exceeds the observation noise there (InducingVariables.captured_variance), so the "
                "posterior variance at them stays above the noise variance where SingleTaskGP's falls below it, and "
                "predictions deviate from the exact GP. Use more inducing points (num_inducing=) or place them where "
                "the inputs are (model.inducing_variables = ...); see the approximation in the BoTorch guide",
                InducingApproximationWarning,
                stacklevel=2,  # one location for every path, so Python's default filter shows it once
            )

    def _absorb(self, X: Tensor, Y: Tensor, x: Tensor, y: Tensor, noise: Tensor | None = None) -> None:
        self._warn_if_approximate(X, noise)
        # fantasies of look-ahead acquisitions carry gradients to the candidate: keep the graph then
        differentiable = torch.is_grad_enabled() and (x.requires_grad or y.requires_grad)
        if self.stored_inputs is not None and self._hyperparameters_changed():
            self.refresh_posterior()  # hyperparameters set by hand since the last batch: the kept data first
        self.online.update(x, y, num_iter=0, differentiable=differentiable, noise=noise)
        self._record_hyperparameters()
        self.num_updates += 1
        if self.keep_data:
            point_noise = torch.full_like(y, float("nan")) if noise is None else noise.detach().expand(y.shape)
            old_x, old_y, old_noise = self.stored_inputs, self.stored_targets, self.stored_noise
            if old_x is None:
                self.stored_inputs, self.stored_targets = x.detach().clone(), y.detach().clone()
                self.stored_noise = point_noise.clone()
            elif old_y is None or old_noise is None:
                raise RuntimeError("the model keeps inputs without their targets or noise: load a complete state_dict")
            else:
                batch = torch.broadcast_shapes(old_y.shape[:-1], y.shape[:-1])
                old_x = old_x.expand(*batch, *old_x.shape[-2:])
                self.stored_inputs = torch.cat([old_x, x.detach().expand(*batch, *x.shape[-2:])], dim=-2)
                self.stored_targets = torch.cat([old_y.expand(*batch, -1), y.detach().expand(*batch, -1)], dim=-1)
                self.stored_noise = torch.cat([old_noise.expand(*batch, -1), point_noise.expand(*batch, -1)], dim=-1)

    @contextlib.contextmanager
    def _own_update(self):
        """The model's own hyperparameter changes (online refits, loading): no recomputation on ``eval()``."""
        previous, self._internal_refit = self._internal_refit, True
        try:
            yield
        finally:
            self._internal_refit = previous


def register_multi_output_model(model_class: type[OnlineModelBase]) -> type[OnlineModelBase]:
    """Make ``OnlineGPModel(train_X, train_Y, ...)`` with ``train_Y`` of shape ``(n, m)``, ``m > 1``, build a
    ``model_class`` with the same arguments. A class decorator: it returns ``model_class``.
    :class:`~gpytorch_hippo.botorch.multioutput.MultiOutputOnlineGPModel` registers itself when
    :mod:`gpytorch_hippo.botorch` is imported.

    :param model_class: a subclass of :class:`OnlineModelBase` that takes :class:`OnlineGPModel`'s arguments."""
    global _multi_output_model
    if not (isinstance(model_class, type) and issubclass(model_class, OnlineModelBase) and model_class is not OnlineGPModel):
        raise TypeError(f"model_class must be a subclass of OnlineModelBase other than OnlineGPModel, got {model_class!r}")
    _multi_output_model = model_class
    return model_class


#: number of default inducing points (:func:`default_inducing_points`)
DEFAULT_NUM_INDUCING = 128


def default_inducing_points(train_x: Tensor, num_inducing: int | None = None) -> InducingPoints:
    """The inducing points of an :class:`OnlineGPModel` built without ``inducing_variables``: ``num_inducing``
    (default :data:`DEFAULT_NUM_INDUCING`, at most :math:`2^{14}`) fixed points, first the first batch's distinct
    model-space inputs ``train_x`` ``(n, d)`` (with more than ``num_inducing``, a farthest-point subset: the
    order in which pivoted Cholesky picks points for an isotropic stationary kernel), so that a model of up
    to ``num_inducing`` points is the exact GP of its first batch; then a scrambled Sobol sequence (seed 0)
    for later batches, in the unit cube when the inputs lie in it (BoTorch's convention: inputs scaled to
    ``[0, 1]^d``, e.g. by ``Normalize``), otherwise in their bounding box widened by 10 % of its size on
    every side. Later batches should stay in that box; for a time axis that grows,
    :class:`~gpytorch_hippo.inducing.HiPPOInducingVariables` keep the whole stream.

    :param train_x: the first batch's model-space inputs ``(n, d)`` (leading batch dimensions are flattened).
    :param num_inducing: the number of points, an int in ``[1, 2^14]``; ``None`` (default): :data:`DEFAULT_NUM_INDUCING`.
    """
    num = DEFAULT_NUM_INDUCING if num_inducing is None else num_inducing
    if isinstance(num, bool) or not isinstance(num, int) or not 1 <= num <= 2**14:
        raise ValueError(f"num_inducing must be an int in [1, 16384], got {num_inducing!r}")
    x = train_x.detach().reshape(-1, train_x.shape[-1])
    low, high = x.min(-2).values, x.max(-2).values
    if not (bool((low >= 0).all()) and bool((high <= 1).all())):
        margin = 0.1 * (high - low).clamp_min(1e-6 * (1 + high.abs().max()))
        low, high = low - margin, high + margin
    else:
        low, high = torch.zeros_like(low), torch.ones_like(high)
    data = _farthest_points(torch.unique(x, dim=0), num)
    if data.shape[0] == num:
        return InducingPoints(data.clone(), learn=False)
    engine = torch.quasirandom.SobolEngine(x.shape[-1], scramble=True, seed=0)
    unit = engine.draw(num - data.shape[0], dtype=torch.float64).to(device=x.device, dtype=x.dtype)
    return InducingPoints(torch.cat([data, low + (high - low) * unit]), learn=False)


def _farthest_points(x: Tensor, num: int) -> Tensor:
    """``num`` rows of ``x`` (all of them if fewer) chosen greedily, each the farthest from those before."""
    if x.shape[0] <= num:
        return x
    chosen = [0]
    distance = (x - x[0]).pow(2).sum(-1)
    for _ in range(num - 1):
        chosen.append(int(distance.argmax()))
        distance = torch.minimum(distance, (x - x[chosen[-1]]).pow(2).sum(-1))
    return x[chosen]


def _validate_like_single_task_gp(x: Tensor, y: Tensor, noise: Tensor | None) -> None:
    """BoTorch's input checks of ``SingleTaskGP`` on the model-space data: its warnings for float32
    inputs, inputs outside the unit cube and unstandardised outcomes."""
    Y = y.unsqueeze(-1)
    Yvar = None if noise is None else noise.unsqueeze(-1)
    validate_tensor_args(X=x, Y=Y, Yvar=Yvar)
    validate_input_scaling(train_X=x, train_Y=Y, train_Yvar=Yvar)


class _NoStoredData(AttributeError):
    """``train_inputs``/``train_targets`` of a model that keeps no data (so ``hasattr`` is ``False``)."""
