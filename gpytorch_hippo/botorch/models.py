"""The BoTorch online surrogate over :class:`~gpytorch_hippo.online.OnlineSGPR` (thesis ch. 4).

:class:`OnlineGPModel` is a BoTorch ``Model`` whose posterior is the collapsed online sparse GP of
Bui et al. (2017), thesis §4.2.2: with HiPPO inducing variables it is OHSGPR, with inducing points
OSGPR. New observations enter through :meth:`OnlineGPModel.condition_on_observations`, one online
update that touches only the new batch and the stored summary ``q(u)``. An ``(n, m)`` target gives ``m``
independent outputs in the same class. The class holds BoTorch's model hooks; what they compose lives beside it:
:mod:`~gpytorch_hippo.botorch.fit` (:class:`~gpytorch_hippo.botorch.fit.OnlineCollapsedMLL`, the collapsed online bound for
``botorch.fit.fit_gpytorch_mll``, and the online refit), :mod:`~gpytorch_hippo.botorch.inducing` (the default
inducing points and their moves) and :mod:`~gpytorch_hippo.botorch.exceptions` (the warnings). Non-Gaussian
observations have :class:`~gpytorch_hippo.botorch.variational.OnlineVariationalGPModel` over OHSVGP.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, cast

import gpytorch
import torch
from botorch.acquisition.objective import PosteriorTransform
from botorch.fit import fit_gpytorch_mll
from botorch.models.model import FantasizeMixin, Model
from botorch.models.transforms.input import InputTransform
from botorch.models.transforms.outcome import OutcomeTransform, Standardize
from botorch.posteriors.gpytorch import GPyTorchPosterior
from botorch.utils.types import DEFAULT
from gpytorch.distributions import MultitaskMultivariateNormal, MultivariateNormal
from gpytorch.mlls import ExactMarginalLogLikelihood, MarginalLogLikelihood
from linear_operator import to_linear_operator
from torch import Tensor, nn

from probseq._compat import DefaultType, fit_mll_generic
from probseq._validation import check_tensor

from .._validation import floating_dtype
from ..inducing.base import InducingVariables
from ..online import OnlineSGPR
from . import _state as state
from ._checks import (
    check_first_batch,
    check_keywords,
    check_noise,
    check_output_indices,
    check_points_near,
    check_settings,
    check_stream_batch,
    check_X_Y,
    inducing_per_output,
    split_third_argument,
)
from ._output import HyperparameterRecord
from .exceptions import InducingApproximationWarning, OnlineGPModelWarning
from .fit import DEFAULT_EXACT_FIT_SIZE, OnlineCollapsedMLL
from .inducing import DEFAULT_NUM_INDUCING, default_inducing_points
from .multioutput import IndependentOutputsLikelihood

__all__ = [
    "OnlineGPModel",
    "OnlineGPModelWarning",
    "InducingApproximationWarning",
    "OnlineModelBase",
    "OnlineCollapsedMLL",
    "default_inducing_points",
    "DEFAULT_NUM_INDUCING",
]


# BoTorch's Model and FantasizeMixin declare posterior and condition_on_observations with different signatures;
# BoTorch's own models (SingleTaskGP, ModelListGP) combine the two as this class does.
class OnlineModelBase(Model, FantasizeMixin, gpytorch.models.GP):  # type: ignore[misc]
    """BoTorch's hooks for transforms and fitting of :class:`OnlineGPModel`: the input transform, learned on the first
    batch and applied to each batch as it arrives (never re-applied to stored inputs), and ``fit_gpytorch_mll``'s
    ``custom_fit``. Not a model by itself."""

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
        change, left out of the state it rolls back to. With several outputs an ``ExactMarginalLogLikelihood`` without a
        closure of its own is maximised output by output (each output's exact marginal likelihood and priors, as
        ``SingleTaskGP`` fits its outputs). An exact fit that starts from the hyperparameters the constructor fitted on
        the sparse bound warns (:class:`~gpytorch_hippo.botorch.exceptions.OnlineGPModelWarning`): ``SingleTaskGP``
        starts from its priors, and the exact fit can end in a worse local optimum from here. A model that
        :class:`~gpytorch_hippo.botorch.streaming.OnlineGPStream` returned keeps its hyperparameters (the stream's
        refit schedule is its fit).

        :param mll: the marginal likelihood of this model to maximise.
        :param closure: ``fit_gpytorch_mll``'s closure (``None``: BoTorch's default).
        :param closure_kwargs: ``fit_gpytorch_mll``'s keyword arguments of the closure.
        :param optimizer_kwargs: ``fit_gpytorch_mll``'s keyword arguments of the optimiser.
        :param kwargs: ``fit_gpytorch_mll``'s other keyword arguments (``optimizer``, ``max_attempts``, ...).
        """
        if getattr(self, "fitted_by_stream", False):
            return mll.eval()
        outputs = state.per_output(cast(OnlineGPModel, self))
        if len(outputs) > 1 and isinstance(mll, ExactMarginalLogLikelihood) and closure is None:
            for output in outputs:
                fit_gpytorch_mll(
                    type(mll)(output.likelihood, output), closure_kwargs=closure_kwargs, optimizer_kwargs=optimizer_kwargs, **kwargs
                )
            return mll.eval()
        if not isinstance(mll, OnlineCollapsedMLL) and self.starts_from_sparse_fit():
            warnings.warn(
                "fit_gpytorch_mll of this online model starts from the hyperparameters its constructor fitted on the "
                "sparse online bound (fit_maxiter > 0), not from SingleTaskGP's start: the exact fit can end in another, "
                "worse local optimum from there. Build the model with fit_maxiter=0 to start the exact fit as "
                "SingleTaskGP does",
                OnlineGPModelWarning,
                stacklevel=3,
            )
        with state.tensor_state_only(mll), state.exact_fit_data(self, isinstance(mll, ExactMarginalLogLikelihood)):
            return fit_mll_generic(mll, closure=closure, closure_kwargs=closure_kwargs, optimizer_kwargs=optimizer_kwargs, **kwargs)

    def starts_from_sparse_fit(self) -> bool:
        """Whether the hyperparameters are still those the constructor fitted on the sparse online bound
        (``fit_maxiter > 0``), from which an exact ``fit_gpytorch_mll`` would start (:meth:`custom_fit` warns)."""
        return any(output.hyperparameter_record.at_sparse_fit(output.online) for output in state.per_output(cast(OnlineGPModel, self)))


class OnlineGPModel(OnlineModelBase):
    r"""BoTorch surrogate over :class:`~gpytorch_hippo.online.OnlineSGPR` (OHSGPR / OSGPR), built as ``SingleTaskGP``
    (``OnlineGPModel(train_X, train_Y[, train_Yvar])``; the former ``OnlineGPModel(X, Y, inducing_variables)`` works):
    its default kernel, likelihood and mean, ``Standardize`` outcomes, input warnings. The first batch is absorbed
    after a fit of the collapsed bound (:class:`~gpytorch_hippo.botorch.fit.OnlineCollapsedMLL`, ``fit_maxiter``
    L-BFGS iterations); each later batch is one online update, by :meth:`condition_on_observations` or by
    :meth:`observe` (which refits on the batch's online bound every ``refit_every`` batches; Bui et al. 2017). HiPPO
    variables follow the stream (thesis §4.4).

    ``m > 1`` outputs are independent, :math:`q(f_1(X), \dots, f_m(X)) = \prod_j q_j(f_j(X))`: output ``j`` is
    ``model.outputs[j]``, a single-output :class:`OnlineGPModel` (as ``ModelListGP`` holds its models), with BoTorch's
    batched layout for ``model(X)``, ``train_inputs`` and the ``likelihood``.

    :param train_X: first batch of inputs, ``(n, d)``.
    :param train_Y: its targets, ``(n, m)``; ``None``: no first batch (the modules that :meth:`from_state_dict` loads).
    :param train_Yvar: known noise variances like ``train_Y`` (``None``: learned); later batches then bring theirs, and the likelihood's
        noise is fixed at the first batch's mean for ``posterior(X, observation_noise=True)``.
    :param inducing_variables: :class:`~gpytorch_hippo.inducing.InducingVariables` in the input-transformed space, one set (copied per
        output) or one per output; default: points of the data, :func:`~gpytorch_hippo.botorch.inducing.select_inducing_points`.
    :param covar_module: the kernel, copied per output; default ``SingleTaskGP``'s.
    :param likelihood: a ``GaussianLikelihood``, copied per output; default ``SingleTaskGP``'s.
    :param mean_module: copied per output, fixed after the first batch (HiPPO variables project :math:`f - m`); default ``ConstantMean``.
    :param input_transform: e.g. ``Normalize``; it learns its statistics from the first batch, then stays fixed.
    :param outcome_transform: default ``Standardize(m=m)``, ``None``: none; learned from the first batch, then fixed.
    :param fit_maxiter: iterations of the first fit (``0``: keep the hyperparameters as given).
    :param refit_every: refresh the hyperparameters in every ``k``-th :meth:`observe` (``None``: never). Path HiPPO variables keep their
        memory in features of the first length scale: freeze it before refreshing.
    :param keep_data: keep all data in ``train_inputs``/``train_targets`` as ``SingleTaskGP`` (default); ``False``: only ``q(u)``.
    :param ordering: criterion of :func:`~gpytorch_hippo.ordering.order_inputs` for path variables.
    :param num_inducing: the most default points, re-selected from the data as it comes (``None``: ``DEFAULT_NUM_INDUCING``).
    :param exact_fit_size: exact fits (``fit_gpytorch_mll``, the constructor's past it) use at most this many kept points; ``None``: all.
    """

    online: OnlineSGPR
    num_updates: Tensor
    known_noise_flag: Tensor
    stored_inputs: Tensor | None  # keep_data=True: every batch so far, model space (None before the first one)
    stored_targets: Tensor | None
    stored_noise: Tensor | None
    hyperparameter_record: HyperparameterRecord
    outcome_transform: OutcomeTransform
    outputs: Sequence[OnlineGPModel]  # several outputs: one single-output model each (an nn.ModuleList)

    def __init__(
        self,
        train_X: Tensor,
        train_Y: Tensor | None,
        train_Yvar: Tensor | None = None,
        inducing_variables: InducingVariables | Sequence[InducingVariables] | None = None,
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
        exact_fit_size: int | None = DEFAULT_EXACT_FIT_SIZE,
    ):
        super().__init__()
        train_Yvar, inducing_variables = split_third_argument(train_Yvar, inducing_variables)
        num_outputs = check_first_batch(train_X, train_Y, train_Yvar)
        check_settings(likelihood, fit_maxiter, refit_every, ordering, inducing_variables, num_inducing, exact_fit_size)
        per_output, modules = inducing_per_output(inducing_variables, num_outputs), (covar_module, likelihood, mean_module)
        self.num_inputs = train_X.shape[-1]  # d (a 1-D X of a model with d = 1 is read as n points)
        self.fit_maxiter, self.refit_every, self.keep_data, self.ordering = fit_maxiter, refit_every, keep_data, ordering
        self.num_inducing, self.exact_fit_size = None if per_output[0] is not None else num_inducing or DEFAULT_NUM_INDUCING, exact_fit_size
        if input_transform is not None:
            self.input_transform = input_transform.to(train_X)
        if isinstance(outcome_transform, DefaultType):
            outcome_transform = Standardize(m=num_outputs)
        if outcome_transform is not None:
            self.outcome_transform = outcome_transform.to(train_X)
        if train_Y is None:
            state.build_output(self, train_X, per_output[0] or default_inducing_points(train_X, num_inducing), *modules, known_noise=False)
            self.online.mean_module.requires_grad_(False)  # as after a first batch
            return
        x, Y, noise = state.to_model_space(self, train_X, train_Y, train_Yvar, fit_transforms=True)
        for variables in [v for v in per_output if v is not None] if input_transform is not None else []:
            check_points_near(variables, x)
        if num_outputs == 1:
            state.absorb_first_batch(self, x, Y[..., 0], None if noise is None else noise[..., 0], per_output[0], modules)
            return
        options = {name: getattr(self, name) for name in ("fit_maxiter", "refit_every", "keep_data", "ordering", "exact_fit_size")}
        options["num_inducing"] = num_inducing
        outputs = state.build_outputs(OnlineGPModel, x, Y, noise, per_output, modules, options)
        self.outputs = cast(Sequence[OnlineGPModel], nn.ModuleList(outputs))
        self.eval()

    # ------------------------------------------------------------------ BoTorch's and GPyTorch's attributes
    @property
    def likelihood(self) -> gpytorch.likelihoods.GaussianLikelihood | IndependentOutputsLikelihood:
        outputs = state.per_output(self)
        return outputs[0].online.likelihood if len(outputs) == 1 else IndependentOutputsLikelihood([o.likelihood for o in outputs])

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
    def known_noise(self) -> bool:
        """Whether the model was built with ``train_Yvar``: later batches bring their noise variances."""
        return bool(state.per_output(self)[0].known_noise_flag)

    @property
    def num_outputs(self) -> int:
        return len(state.per_output(self))

    @property
    def batch_shape(self) -> torch.Size:
        """Empty, except for models conditioned on t-batched (fantasy) observations."""
        online = state.per_output(self)[0].online
        if not online.has_posterior:
            raise RuntimeError("no task has been absorbed yet: condition the model on observations first")
        return cast(Tensor, online.posterior_shift).shape[:-1]

    @property
    def train_inputs(self) -> tuple[Tensor]:
        """All inputs seen so far (model space), if ``keep_data=True``; ``(m, n, d)`` with ``m > 1`` outputs."""
        inputs = [state.training_data(output, "train_inputs")[0] for output in state.per_output(self)]
        return (inputs[0] if len(inputs) == 1 else torch.stack(inputs, dim=-3),)

    @property
    def train_targets(self) -> Tensor:
        """All targets seen so far (outcome-transformed), ``(n,)`` or ``(m, n)``, if ``keep_data=True``."""
        targets = [state.training_data(output, "train_targets")[1] for output in state.per_output(self)]
        return targets[0] if len(targets) == 1 else torch.stack(targets, dim=-2)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError as error:
            return state.shared_attribute(self, name, error)

    # ------------------------------------------------------------------ BoTorch's model hooks
    def posterior(  # type: ignore[override]  # Model's signature, which FantasizeMixin's narrower one does not follow
        self,
        X: Tensor,
        output_indices: list[int] | None = None,
        observation_noise: bool | Tensor = False,
        posterior_transform: PosteriorTransform | None = None,
    ) -> GPyTorchPosterior:
        """``q(f(X))``, or ``q(y(X))`` with ``observation_noise``, at ``X`` ``(*b, q, d)`` (``(q,)`` for ``d = 1``) in the
        original spaces: a ``GPyTorchPosterior`` over ``broadcast(b, batch_shape) x q x m'``.

        :param X: inputs in the original input space.
        :param output_indices: the outputs to return, a non-empty list of ints in ``[0, m)``; ``None`` (default): all.
        :param observation_noise: ``True``: add each output's likelihood noise; a tensor ``(*b, q, m)``: these noise
            variances, in the model's (outcome-transformed) space as BoTorch adds them; ``False`` (default): none.
        :param posterior_transform: BoTorch ``PosteriorTransform`` applied to the result; ``None`` (default): none.
        """
        outputs = state.per_output(self)
        indices = (
            list(range(len(outputs))) if output_indices is None else check_output_indices(output_indices, len(outputs), "output_indices")
        )
        X = check_tensor(X, "X", dtype=floating_dtype(outputs[0].covar_module))
        X = X.unsqueeze(-1) if X.dim() == 1 and self.num_inputs == 1 else X  # n points of a 1-D input, as SingleTaskGP
        if X.dim() < 2:
            raise ValueError(f"X must have shape (*batch, q, d), got {tuple(X.shape)}")
        if isinstance(observation_noise, Tensor):
            check_noise(observation_noise, len(outputs), "observation_noise", "q")
        self.eval()
        x = self.transform_inputs(X)
        noises = [observation_noise[..., j : j + 1] if isinstance(observation_noise, Tensor) else observation_noise for j in indices]
        mvns = [state.predictive(outputs[j], x, noise) for j, noise in zip(indices, noises)]
        posterior = GPyTorchPosterior(distribution=mvns[0] if len(mvns) == 1 else MultitaskMultivariateNormal.from_independent_mvns(mvns))
        if hasattr(self, "outcome_transform"):
            transform = self.outcome_transform if len(indices) == len(outputs) else self.outcome_transform.subset_output(indices)
            posterior = cast(GPyTorchPosterior, transform.untransform_posterior(posterior, X=x))
        return posterior if posterior_transform is None else posterior_transform(posterior)

    def forward(self, X: Tensor) -> MultivariateNormal:
        r"""GPyTorch's ``model(X)``: in eval mode :math:`q(f(X))` after the input transform, in the outcome space; in train
        mode, as an ``ExactGP``, the prior :math:`\mathcal{N}(m(X), k(X, X))` at model-space inputs such as :attr:`train_inputs`
        (``ExactMarginalLogLikelihood`` is then the exact one of the kept data). ``m > 1`` outputs: mean ``(*b, m, q)``.

        :param X: inputs ``(*b, n, d)``: original-space in eval mode, model-space in train mode (or ``(*b, m, n, d)``, one set per output).
        """
        outputs = state.per_output(self)
        X = check_tensor(X, "X", dtype=floating_dtype(outputs[0].covar_module), min_dim=2)
        if self.training:
            X = X.expand(len(outputs), *X.shape) if len(outputs) > 1 and X.dim() == 2 else X
            inputs = [X] if len(outputs) == 1 else [X[..., j, :, :] for j in range(len(outputs))]
            mvns = [MultivariateNormal(o.mean_module(x), o.covar_module(x)) for o, x in zip(outputs, inputs)]
        else:
            mvns = [output.online(self.transform_inputs(X)) for output in outputs]
        if len(mvns) == 1:
            return mvns[0]
        covariance = to_linear_operator(torch.stack([mvn.covariance_matrix for mvn in mvns], dim=-3))
        return MultivariateNormal(torch.stack([mvn.mean for mvn in mvns], dim=-2), covariance)

    def condition_on_observations(self, X: Tensor, Y: Tensor, **kwargs: Any) -> OnlineGPModel:
        """A new model with ``(X, Y)`` absorbed by one online update per output (no refit, old data not revisited;
        HiPPO variables first moved forward); this one is not changed.

        :param X: new inputs ``(*b, n, d)`` in the original input space.
        :param Y: their observations ``(*b', n, m)`` in the original outcome space (``b'`` broadcasting with ``b``).
        :param kwargs: only ``noise``: known noise variances like ``Y``; without it the likelihoods' noise.
        """
        m = self.num_outputs
        check_keywords(kwargs, {"noise"}, "condition_on_observations")
        if isinstance(X, Tensor) and isinstance(Y, Tensor) and X.dim() >= 2 and X.shape[-2] == 0 and Y.shape[-2:] == (0, m):
            return state.broadcast_model(self, torch.broadcast_shapes(X.shape[:-2], Y.shape[:-2]))  # fantasies of no points
        check_X_Y(X, Y, "X", "Y", m)
        noise = kwargs.get("noise")
        if noise is not None:
            noise = check_noise(check_tensor(noise, "noise", dtype=floating_dtype(state.per_output(self)[0].covar_module)), m, "noise", "n")
        return state.conditioned(self, *state.to_model_space(self, X, Y, noise))

    def get_fantasy_model(self, inputs: Tensor, targets: Tensor, noise: Tensor | None = None, **kwargs: Any) -> OnlineGPModel:
        """GPyTorch's conditioning of a single-output model, as ``ModelListGP.condition_on_observations`` calls it.

        :param inputs: new inputs ``(*b, n, d)`` in the original input space.
        :param targets: their observations ``(*b', n)`` in the outcome-transformed space.
        :param noise: their known noise variances there, broadcasting to ``targets``; ``None``: the likelihood's.
        """
        if self.num_outputs > 1:
            raise NotImplementedError(
                "get_fantasy_model of a multi-output OnlineGPModel: use condition_on_observations with Y of shape "
                f"(*batch, n, {self.num_outputs}), or put single-output OnlineGPModels in a ModelListGP"
            )
        check_keywords(kwargs, set(), "get_fantasy_model")
        targets = check_tensor(targets, "targets").unsqueeze(-1)
        check_X_Y(inputs, targets, "inputs", "targets")
        noise = None if noise is None else check_tensor(noise, "noise", dtype=floating_dtype(self.covar_module)).unsqueeze(-1)
        x, y, _ = state.to_model_space(self, inputs, targets, transform_outcomes=False)
        return state.conditioned(self, x, y, noise)

    def subset_output(self, idcs: list[int]) -> OnlineGPModel:
        """BoTorch's ``subset_output``: a model of the outputs ``idcs`` with their posteriors and transforms.

        :param idcs: a non-empty list of distinct ints in ``[0, m)``; one output gives ``outputs[j]`` with the model's transforms.
        """
        return state.subset_outputs(self, check_output_indices(idcs, self.num_outputs, "idcs", distinct=True))

    def train(self, mode: bool = True) -> OnlineGPModel:
        """GPyTorch's modes; back in eval mode after the hyperparameters changed outside the model's own updates (an exact
        ``fit_gpytorch_mll``, a training loop), each output's posterior is recomputed from its kept data, as a fresh model's.

        :param mode: ``True`` (default) for train mode, ``False`` for eval mode.
        """
        super().train(mode)
        for name in ("input_transform", "outcome_transform"):  # statistics of the first batch, then fixed
            if hasattr(self, name):
                getattr(self, name).eval()
        if not mode:
            state.refresh_if_changed(self)
        return self

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Restore a checkpoint of this model's own posterior whole, or warm-start from another model's as ``SingleTaskGP``
        does (:meth:`load_hyperparameters` with an ``OnlineGPModelWarning`` naming :meth:`from_state_dict`; not with ``keep_data=False``).

        :param state_dict: a ``state_dict`` of an :class:`OnlineGPModel` with the same modules.
        :param strict: as ``torch.nn.Module.load_state_dict`` (default ``True``); a warm start ignores it.
        :param assign: as ``torch.nn.Module.load_state_dict`` (default ``False``).
        """
        return state.load_state_dict(self, state_dict, strict=strict, assign=assign)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        for name in ("stored_inputs", "stored_targets", "stored_noise"):  # kept data: a buffer that is None until then
            if prefix + name in state_dict and name in self._buffers and self._buffers[name] is None:
                setattr(self, name, torch.empty_like(state_dict[prefix + name]))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    # ------------------------------------------------------------------ streaming conveniences (see ``state``)
    def observe(self, X: Tensor, Y: Tensor, Yvar: Tensor | None = None) -> OnlineGPModel:
        """Streaming step: a new model with the batch absorbed as by :meth:`condition_on_observations`, each output's
        hyperparameters first refreshed on the batch's online bound every ``refit_every`` batches.

        :param X: new inputs ``(n, d)`` in the original input space.
        :param Y: their observations ``(n, m)`` in the original outcome space.
        :param Yvar: their known noise variances like ``Y``, required by a model built with ``train_Yvar``; ``None``: the likelihood's.
        """
        check_stream_batch(X, Y, Yvar, self.num_outputs, self.known_noise)
        return state.conditioned(self, *state.to_model_space(self, X, Y, Yvar), refit=True)

    def fit_hyperparameters(self, x: Tensor, y: Tensor, maxiter: int = 100, noise: Tensor | None = None) -> None:
        """Each output's online refit on a batch (:func:`~gpytorch_hippo.botorch.fit.fit_hyperparameters`; rolled back if it fails).

        :param x: the batch's inputs ``(n, d)`` in the model (input-transformed) space.
        :param y: its targets in the model (outcome-transformed) space, ``(n,)`` for one output, else ``(n, m)``.
        :param maxiter: the most L-BFGS-B iterations per output (default 100).
        :param noise: known noise variances like ``y`` in the model space; ``None`` (default): the likelihood's.
        """
        state.fit_outputs(self, x, y, maxiter=maxiter, noise=noise)

    def refresh_posterior(self) -> None:
        """Each output's posterior recomputed from all kept data with the current hyperparameters, as a fresh model's."""
        for output in state.per_output(self):
            state.refresh_posterior(output)

    def load_hyperparameters(self, state_dict: dict):
        """Warm start without the warning: each output's kernel, likelihood and mean loaded; its data, counters, transforms and
        posterior kept, the posterior recomputed from the kept data (without them ``q(u)`` is carried to the new hyperparameters).

        :param state_dict: a ``state_dict`` of an :class:`OnlineGPModel` with the same modules.
        """
        return state.load_hyperparameters(self, state_dict)

    def is_warm_start(self, state_dict: dict) -> bool:
        """Whether :meth:`load_state_dict` would warm-start from ``state_dict`` rather than restore it whole.

        :param state_dict: a ``state_dict`` of an :class:`OnlineGPModel` with the same modules.
        """
        return state.is_warm_start(self, state_dict)

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
        """Rebuild a checkpointed single-output model without its data: the modules it was built with, then its ``state_dict``.

        :param state_dict: ``model.state_dict()`` of a single-output :class:`OnlineGPModel`.
        :param inducing_variables: of the kind and number the model had; ``None``: the default points.
        :param covar_module: the model's kernel; ``None``: the default, of the dimension of the checkpoint's length scale.
        :param likelihood: the model's likelihood (``None``: the default).
        :param mean_module: the model's mean (``None``: the default).
        :param input_transform: the model's input transform (``None``: none).
        :param outcome_transform: the model's outcome transform (default ``Standardize(m=1)``; ``None``: none).
        :param options: ``fit_maxiter``, ``refit_every``, ``keep_data`` (default: whether the checkpoint kept data), ``ordering``.
        """
        reference, inducing, options = state.restore_arguments(state_dict, inducing_variables, covar_module, options)
        model = cls(reference, None, None, inducing, covar_module, likelihood, mean_module, input_transform, outcome_transform, **options)
        model.load_state_dict(state_dict)
        return model.eval()
