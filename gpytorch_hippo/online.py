r"""Online sparse GPs (Bui, Nguyen & Turner 2017), thesis §4.2.2.

Two objectives, both working with any :class:`~gpytorch_hippo.inducing.InducingVariables`:

* :class:`OnlineSGPR` -- Gaussian likelihood, collapsed online bound with the closed-form optimal
  :math:`q(u)`. With HiPPO inducing variables this is OHSGPR, with inducing points OSGPR.
* :class:`OnlineELBO` -- any likelihood, uncollapsed online ELBO (thesis eq. (4.6))
  for a GPyTorch ``ApproximateGP`` with
  :class:`~gpytorch_hippo.variational.InterdomainVariationalStrategy`: OHSVGP / OSVGP.

Notation: :math:`a` are the old inducing variables (end of the previous task, old hyperparameters
:math:`\theta'`), :math:`b` the current ones, :math:`q_{\mathrm{old}}(a) = \mathcal{N}(m_a, S_a)`,
:math:`p_{\mathrm{old}}(a) = \mathcal{N}(\mu'_a, K'_{aa})`.
Old data are never revisited: a task only touches its own data and the stored summary
:math:`(q_{\mathrm{old}}(a), K'_{aa}, a)` (:mod:`gpytorch_hippo.stored`).

:class:`OnlineSGPR` holds the model and its closed-form update; the pieces around it are their own modules:
the algebra of the collapsed bound (:mod:`gpytorch_hippo.collapsed`), reading a task (:mod:`gpytorch_hippo.tasks`),
hyperparameter fitting and the refit policy (:mod:`gpytorch_hippo.fitting`), the captured-variance monitor
(:mod:`gpytorch_hippo.monitor`) and calendar times (:mod:`gpytorch_hippo.timeaxis`).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import gpytorch
import torch
from gpytorch.distributions import MultivariateNormal
from linear_operator import to_dense
from linear_operator.operators import DenseLinearOperator, MatmulLinearOperator
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor

from probseq._compat import ApproximateMarginalLogLikelihood, tensor_version
from probseq._validation import check_tensor

from ._validation import floating_dtype
from .collapsed import (
    CollapsedUpdate,
    b_factor,
    check_parts,
    collapsed_update,
    inducing_moments,
    keep_streams_without_points,
    prediction_factors,
    smooth_ratio,
    to_working_dtype,
    unwhiten_ratio,
    with_shared_matrix,
)
from .fitting import FitReport, RefitPolicy, fit_before_update
from .inducing.base import InducingVariables
from .monitor import CapturedVarianceMonitor
from .nystrom import nystrom_residual
from .stored import StoredTask, allocate_stored, check_mean_unchanged, frozen_copy, is_stored
from .tasks import Task, as_inputs, prepare_task
from .timeaxis import TimeAxis, as_time_axis, restore_time_axis
from .variational import InterdomainVariationalStrategy, solve_lower

#: predictions at up to this many points get a dense covariance (fast sampling, as BoTorch's acquisitions
#: draw); more points keep ``K_xx + W^T C W`` as a product, so that their variances cost O(N M)
DENSE_PREDICTION_POINTS = 256

__all__ = ["OnlineSGPR", "OnlineELBO", "FitReport"]

_POSTERIOR_BUFFERS = ("posterior_chol", "posterior_precision", "posterior_shift", "posterior_prior_mean")
_OLD_TASK_BUFFERS = ("old_mean", "old_covar_chol", "old_prior_chol", "old_prior_mean")


def _check_finite_result(name: str, *tensors: Tensor) -> None:
    """A named error instead of a NaN/Inf posterior or bound from finite but extreme input."""
    if not all(bool(torch.isfinite(t).all()) for t in tensors):
        raise ValueError(
            f"{name} is not finite although the inputs are: the targets or the hyperparameters are out of the range "
            "floating point can represent here (standardise train_y, check the noise and length scales)"
        )


class _KeptFactor:
    """``chol(B') = chol(I + Λ')`` of the stored ``Λ'``, kept from the update that stored ``Λ'`` for as long as that very
    tensor is unchanged (its identity, storage and version counter: a reload, ``.to``, an assignment or an in-place
    change of ``posterior_precision`` recomputes it)."""

    def __init__(self) -> None:
        self.entry: tuple[Tensor, tuple[int, int], Tensor] | None = None

    def get(self, precision: Tensor) -> Tensor:
        entry = self.entry
        if entry is not None and entry[0] is precision and entry[1] == (tensor_version(precision), precision.data_ptr()):
            return entry[2]
        b_chol = b_factor(to_working_dtype(precision))
        self.keep(precision, b_chol)
        return b_chol

    def keep(self, precision: Tensor, b_chol: Tensor) -> None:
        """Keep ``b_chol`` for ``precision`` (not for a differentiable summary: its graph is the user's)."""
        self.entry = None if b_chol.requires_grad else (precision, (tensor_version(precision), precision.data_ptr()), b_chol)


class _PredictionCache:
    """The factors of :meth:`OnlineSGPR.forward` that do not depend on ``x`` in eval mode, computed once per state, as
    GPyTorch's exact GPs cache their test-time solves (detached under ``gpytorch.settings.detach_test_caches``,
    GPyTorch's default): the cache is keyed by the kernel, mean, inducing variables and stored posterior, object and
    values, so any change to them (an optimiser step, ``load_state_dict``, an update) recomputes the factors. A
    differentiable conditioning (BoTorch's fantasies) and ``detach_test_caches(False)`` with gradients enabled are
    never served from the cache."""

    def __init__(self) -> None:
        self.key: tuple[list[int], list[Tensor]] | None = None
        self.factors: tuple[Tensor, ...] | None = None

    def get(
        self, modules: Sequence[torch.nn.Module], tensors: list[Tensor], compute: Callable[[], tuple[Tensor, ...]]
    ) -> tuple[Tensor, ...]:
        """The factors for ``modules`` and the stored posterior's ``tensors`` (cached ones if unchanged, else ``compute()``'s)."""
        detached = not torch.is_grad_enabled() or gpytorch.settings.detach_test_caches.on()
        if any(t.requires_grad for t in tensors) or not detached:
            return compute()
        tensors = [t for m in modules for t in itertools.chain(m.parameters(), m.buffers())] + tensors
        key = ([id(m) for m in modules], [t.detach() for t in tensors])
        if self.key is not None and self.factors is not None and _same_key(self.key, key):
            return self.factors
        self.factors = tuple(t.detach() for t in compute())
        self.key = ([*key[0]], [t.clone() for t in key[1]])
        return self.factors


def _same_key(old: tuple, new: tuple) -> bool:
    """Whether two keys of :class:`_PredictionCache` are the same objects with the same values."""
    (old_ids, old_tensors), (new_ids, new_tensors) = old, new
    return (
        old_ids == new_ids
        and len(old_tensors) == len(new_tensors)
        and all(
            a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and torch.equal(a, b)
            for a, b in zip(old_tensors, new_tensors)
        )
    )


class _RefitSetting:
    """The model attribute ``refit_<name>``: reads, and sets (checked), one field of its :class:`~gpytorch_hippo.fitting.RefitPolicy`."""

    def __init__(self, field: str) -> None:
        self.field = field

    def __get__(self, model: Any, owner: type | None = None) -> Any:
        return self if model is None else getattr(model.refit_policy, self.field)

    def __set__(self, model: Any, value: Any) -> None:
        model.refit_policy = dataclasses.replace(model.refit_policy, **{self.field: value})


class _OldTask(NamedTuple):
    r"""What :meth:`OnlineELBO.end_task` keeps of the last task: frozen inducing variables and mean function,
    :math:`q_{old}(a)` (mean, Cholesky factor of :math:`S_a`), the Cholesky factor of :math:`K'_{aa}` and :math:`\mu'_a`."""

    inducing_variables: InducingVariables
    mean_module: gpytorch.means.Mean
    mean: Tensor
    covar_chol: Tensor
    prior_chol: Tensor
    prior_mean: Tensor


class OnlineSGPR(gpytorch.Module):
    r"""Collapsed online sparse GP regression (OSGPR / OHSGPR), Bui et al. (2017), thesis §4.2.2: the model and its
    closed-form update.

    Each :meth:`update` absorbs one task :math:`(X, y)`, maximising the online ELBO (thesis eq. (4.6)) in closed form
    over :math:`q(b)` (:func:`~gpytorch_hippo.collapsed.collapsed_update`, whose module derives the algebra): with
    :math:`L = \operatorname{chol}(K_{bb})` and :math:`W = L^{-1} K_{bX}`, :math:`q(L^{-1}(b - \mu_b)) = \mathcal{N}(B^{-1}\eta, B^{-1})`,

    .. math::
        B = I + W W^T / \sigma^2 + T \Lambda' T^T,\qquad
        \eta = W (y - m(X)) / \sigma^2 + T (\eta' - \Lambda' \delta),

    where :math:`\Lambda', \eta'` summarise the tasks before and :math:`T` maps the old inducing variables onto the new
    ones; :meth:`log_bound` is Bui et al.'s collapsed bound there. For the first task this is Titsias' SGPR; with the
    same inducing inputs and hyperparameters throughout, the posterior after any sequence of tasks equals batch SGPR
    on all data. The algebra runs in float64 whatever the model's dtype.

    The summary :math:`(L', \Lambda', \eta', \mu'_a)` is stored in buffers, with frozen copies of the inducing variables
    and the mean (:attr:`posterior_inducing_variables`, :attr:`posterior_mean_module`; ``state_dict``, ``deepcopy`` and
    ``.to`` carry them). Between tasks the inducing variables may be replaced (``InducingPoints(new_Z)``) or moved in
    place (``advance(t_new)`` for HiPPO); the mean function may change with point inducing variables (interdomain ones
    project :math:`f - m`, so there a change raises). ``model(x)`` is the latent :math:`q(f(x))`.

    :param inducing_variables: any :class:`~gpytorch_hippo.inducing.InducingVariables`.
    :param covar_module: the GPyTorch kernel :math:`k`.
    :param likelihood: a homoskedastic ``gpytorch.likelihoods.GaussianLikelihood``.
    :param mean_module: prior mean (default ``ZeroMean``).
    :param captured_variance_warning: :meth:`update` warns when the inducing variables capture less than this fraction
        of the prior variance at the task's inputs or over the inputs seen so far, and again whenever it falls below
        half the level of its last warning (:attr:`captured_variance_monitor`, a
        :class:`~gpytorch_hippo.monitor.CapturedVarianceMonitor`; :attr:`last_captured_variance`); ``None`` disables it.
        Inputs outside the reach of HiPPO variables always raise :class:`~gpytorch_hippo.inducing.InputsOutsideSupportError`.
    :param time_axis: a :class:`~gpytorch_hippo.timeaxis.TimeAxis` (or its unit, e.g. ``"h"``) to take calendar times as
        inputs; in the ``state_dict``: ``load_state_dict`` gives a model built without an axis (or with an axis of no
        origin yet) the saved one, and raises a ``ValueError`` for an axis of another unit or origin.
    :param refit_every: the :class:`~gpytorch_hippo.fitting.RefitPolicy` (:attr:`refit_policy`) of :meth:`update` calls
        that leave ``num_iter`` unset: the hyperparameters are fitted on task 1 and on every ``refit_every``-th task
        after it (the count ``num_tasks`` is in the ``state_dict``, so a reloaded model keeps the schedule) on the task's
        online bound; the other tasks are closed-form updates. ``None`` (default): no fit unless ``num_iter`` asks.
    :param refit_iter: iterations of each policy refit, a positive int; default 50.
    :param refit_optimizer: the optimiser of the policy refits, ``"lbfgs"`` (default) or ``"adam"`` (at :meth:`update`'s ``lr``).
    :param refit_max_change: any fit of :meth:`update` on a model that holds a posterior that moves a positive
        hyperparameter by more than this factor, or lowers the task's bound, is undone with a
        :class:`~gpytorch_hippo.fitting.RefitWarning` (:attr:`last_fit` says why); default 10; ``None``: keep every fit.
    """

    #: Frozen copy of the inducing variables that the stored summary refers to (``None`` before the first task).
    posterior_inducing_variables: InducingVariables | None
    #: Frozen copy of the mean function of the stored summary (``None`` before the first task).
    posterior_mean_module: gpytorch.means.Mean | None
    posterior_chol: Tensor | None
    posterior_precision: Tensor | None
    posterior_shift: Tensor | None
    posterior_prior_mean: Tensor | None
    num_tasks: Tensor
    seen_input_range: Tensor | None
    last_bound: Tensor | None
    #: :class:`~gpytorch_hippo.fitting.FitReport` of the last update that fitted hyperparameters (``None`` before one)
    last_fit: FitReport | None
    #: the fields of :attr:`refit_policy`; setting one replaces the policy by a checked copy
    refit_every, refit_iter, refit_optimizer, refit_max_change = map(_RefitSetting, ("every", "num_iter", "optimizer", "max_change"))

    def __init__(
        self,
        inducing_variables: InducingVariables,
        covar_module: gpytorch.kernels.Kernel,
        likelihood: gpytorch.likelihoods.GaussianLikelihood,
        mean_module: gpytorch.means.Mean | None = None,
        captured_variance_warning: float | None = 0.9,
        time_axis: TimeAxis | str | None = None,
        refit_every: int | None = None,
        refit_iter: int = 50,
        refit_optimizer: str = "lbfgs",
        refit_max_change: float | None = 10.0,
    ):
        super().__init__()
        #: the :class:`~gpytorch_hippo.fitting.RefitPolicy` that :meth:`update` consults when ``num_iter`` is unset
        self.refit_policy = RefitPolicy(refit_every, refit_iter, refit_optimizer, refit_max_change)
        #: converts calendar times (pandas, NumPy ``datetime64``) to the model's time inputs (``None``: numbers only)
        self.time_axis = as_time_axis(time_axis)
        #: the :class:`~gpytorch_hippo.monitor.CapturedVarianceMonitor` consulted after each update (``None``: none)
        self.captured_variance_monitor: CapturedVarianceMonitor | None = None
        self.captured_variance_warning = captured_variance_warning
        parts = check_parts(inducing_variables, covar_module, likelihood, mean_module)
        self.inducing_variables, self.covar_module, self.likelihood, self.mean_module = parts
        self.posterior_inducing_variables = self.posterior_mean_module = self.last_fit = None
        for name in _POSTERIOR_BUFFERS:
            self.register_buffer(name, None)
        self.register_buffer("num_tasks", torch.tensor(0))
        self.register_buffer("seen_input_range", None)
        self.register_buffer("last_bound", None, persistent=False)
        self._prediction_cache = _PredictionCache()  # the factors of forward() in eval mode: _prediction_factors
        self._b_chol_cache = _KeptFactor()  # chol(I + posterior_precision)

    @property
    def captured_variance_warning(self) -> float | None:
        """The captured-variance monitor's threshold (``None``: no monitor); setting it starts a fresh monitor."""
        return None if self.captured_variance_monitor is None else self.captured_variance_monitor.threshold

    @captured_variance_warning.setter
    def captured_variance_warning(self, threshold: float | None) -> None:
        self.captured_variance_monitor = None if threshold is None else CapturedVarianceMonitor(threshold)

    @property
    def last_captured_variance(self) -> float | None:
        """The captured fraction of the prior variance at the monitor's latest checks (the lower of the task's inputs
        and the inputs seen so far; ``None`` before a check or without a monitor)."""
        return None if self.captured_variance_monitor is None else self.captured_variance_monitor.last_captured_variance

    @property
    def has_posterior(self) -> bool:
        """Whether at least one task has been absorbed (a ``RuntimeError`` for a task stored in part)."""
        return self._stored_task() is not None

    def reset_posterior(self) -> None:
        """Forget every absorbed task: back to the prior (hyperparameters and inducing variables kept)."""
        for name in (*_POSTERIOR_BUFFERS, "seen_input_range", "posterior_inducing_variables", "posterior_mean_module"):
            setattr(self, name, None)
        self.num_tasks.zero_()

    def _stored_task(self) -> StoredTask | None:
        """The stored task, ``None`` before the first one (a ``RuntimeError`` for a task stored in part)."""
        parts = (self.posterior_inducing_variables, self.posterior_mean_module, *(getattr(self, name) for name in _POSTERIOR_BUFFERS))
        return StoredTask(*parts) if is_stored(parts, "the model holds only a part of the stored task") else None

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        saved_axis = (state_dict.get(prefix + "_extra_state") or {}).get("time_axis")
        restore_time_axis(copy.deepcopy(self.time_axis), saved_axis)  # a conflicting time axis raises before anything is loaded
        copies = {"posterior_inducing_variables": self.inducing_variables, "posterior_mean_module": self.mean_module}
        allocate_stored(self, state_dict, prefix, (*_POSTERIOR_BUFFERS, "seen_input_range"), copies, "posterior_chol")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)

    def get_extra_state(self) -> dict:
        """The time axis's :meth:`~gpytorch_hippo.timeaxis.TimeAxis.state` (unit, origin, zone; ``None`` without one)."""
        return {"time_axis": None if self.time_axis is None else self.time_axis.state()}

    def set_extra_state(self, state: dict) -> None:
        """Restore the saved time axis: a model without one takes it, a model whose axis has no origin yet takes its
        origin and zone, and another unit or origin raises a ``ValueError``.

        :param state: what :meth:`get_extra_state` returned.
        """
        self.time_axis = restore_time_axis(self.time_axis, state.get("time_axis"))

    def _task(self, train_x, train_y, noise: Tensor | None, missing: str = "raise", mask: Tensor | None = None) -> Task | None:
        """The task checked and converted by :func:`~gpytorch_hippo.tasks.prepare_task` for this model (``None``: empty)."""
        streams = int(self.likelihood.noise.shape[0]) if self.likelihood.noise.dim() == 2 else None  # S batched streams
        dtype = floating_dtype(self.covar_module)
        return prepare_task(train_x, train_y, self.inducing_variables, dtype, self.time_axis, streams, noise, missing, mask)

    def _bound_and_posterior(self, x: Tensor, y: Tensor, noise: Tensor | None = None, mask: Tensor | None = None) -> CollapsedUpdate:
        """:func:`~gpytorch_hippo.collapsed.collapsed_update` of absorbing ``(x, y)`` into the stored task (``noise``:
        per-point variances instead of the likelihood's; ``mask``: ``False`` at padding of ragged batched streams)."""
        stored = self._stored_task()
        b_chol = None if stored is None else self._b_chol_cache.get(stored.precision)
        noise = self.likelihood.noise if noise is None else noise  # (..., 1)
        return collapsed_update(self.covar_module, self.inducing_variables, self.mean_module, x, y, noise, mask, stored, b_chol)

    def log_bound(self, train_x, train_y, noise: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
        """Collapsed online bound (the online ELBO of Bui et al. (2017), thesis eq. (4.6), at the optimal ``q(u)``) of
        absorbing ``(train_x, train_y)`` into the current summary at the current hyperparameters, differentiable with
        respect to them; the state is not changed.

        :param train_x: the task's inputs ``(N, D)`` (or ``(N,)``), as in :meth:`update`.
        :param train_y: the task's targets ``(N,)``, all finite.
        :param noise: noise variances broadcasting to ``train_y``'s shape; ``None`` (default): the likelihood's.
        :param mask: for batched streams, booleans ``(S, N)`` (``False``: padding), as in :meth:`update`.
        :return: the bound (not divided by ``N``); ``(S,)`` for ``S`` batched streams.
        """
        task = self._task(train_x, train_y, noise, mask=mask)
        if task is None:
            raise ValueError("the task has no observation (an empty train_x, or a mask that marks none): its bound is not defined")
        return self._bound_and_posterior(*task).bound

    def update(
        self,
        train_x,
        train_y,
        num_iter: int | None = None,
        lr: float = 0.01,
        progress: bool = False,
        differentiable: bool = False,
        noise: Tensor | None = None,
        missing: str = "raise",
        optimizer: str = "adam",
        mask: Tensor | None = None,
    ) -> Tensor | None:
        r"""Absorb one task.

        Every row given is absorbed as a new observation: rows sent again (a retried task) count twice. Exactly-once
        delivery is the caller's (:class:`~gpytorch_hippo.fleet.StreamFleet` skips a task id it has absorbed).

        :param train_x: inputs ``(N, D)`` (or ``(N,)``) of the new task only: a tensor, NumPy or pandas numbers, or
            calendar times with ``time_axis`` (:func:`~gpytorch_hippo.tasks.prepare_task` reads the task).
        :param train_y: targets ``(N,)`` (tensor, NumPy or pandas; a pandas ``train_y`` is aligned on the labels of
            ``train_x``'s rows, as pandas aligns).
        :param missing: ``"raise"`` (default): NaN targets raise; ``"drop"``: they are left out of the task
            (nothing is imputed). A task with no observation left is a no-op that returns ``None``.
        :param num_iter: iterations of :func:`~gpytorch_hippo.fitting.fit_online_bound` on :math:`-\mathrm{bound} / N`
            over the hyperparameters before the update (:attr:`last_fit` reports the fit; one that raises restores them,
            the task not absorbed; one undone as ``refit_max_change`` says issues a
            :class:`~gpytorch_hippo.fitting.RefitWarning`). ``0``: the closed-form update only. ``None`` (default): the
            :attr:`refit_policy` decides (without ``refit_every``, ``0``).
        :param lr: Adam learning rate.
        :param mask: for a model of ``S`` batched streams (``train_x`` ``(S, N, D)``, ``train_y`` ``(S, N)``), booleans
            ``(S, N)``, ``False`` at padding of streams with fewer points (ignored, NaN allowed); a stream with no point
            keeps its stored posterior exactly, on the variables it was computed for.
        :param optimizer: ``"adam"`` (default; ``num_iter`` steps of rate ``lr``) or ``"lbfgs"`` (L-BFGS-B as BoTorch's
            ``fit_gpytorch_mll``, at most ``num_iter`` iterations).
        :param progress: show a ``tqdm`` bar during optimisation.
        :param differentiable: store the summary as a differentiable function of ``train_x``, ``train_y`` and the
            hyperparameters (look-ahead acquisitions differentiate a fantasy model's predictions; such a model is copied
            with :func:`copy.deepcopy` only through a memo that shares those tensors). ``False`` (default): detached.
        :param noise: noise variances of these observations, broadcasting to ``train_y``'s shape, in place of the
            likelihood's for this task (BoTorch's ``condition_on_observations(..., noise=...)``); ``None``: the likelihood's.
        :return: the collapsed online bound of this task at the final hyperparameters.
        """
        task = self._task(train_x, train_y, noise, missing, mask)
        if task is None:
            return None  # an empty task (no stream has a point, no target left) leaves the model as it was
        fit = fit_before_update(self, task.x, task.y, num_iter, optimizer, lr, task.noise, task.mask, progress)
        if fit is not None:  # a failed fit restores the hyperparameters and raises: the task is not absorbed
            self.last_fit = fit
        self._absorb(task, differentiable)
        return self.last_bound

    def _absorb(self, task: Task, differentiable: bool) -> None:
        """Replace the stored summary by the collapsed update's at today's hyperparameters (streams without a point in a
        ragged task keep theirs), with frozen copies of the inducing variables and the mean; the monitor checks it."""
        stored, mask = self._stored_task(), task.mask
        keep = (lambda tensor: tensor.clone()) if differentiable else (lambda tensor: tensor.detach().clone())
        with torch.set_grad_enabled(differentiable and torch.is_grad_enabled()):
            new = self._bound_and_posterior(*task)
            _check_finite_result("the online update", new.bound, new.precision, new.shift)
            if self.captured_variance_monitor is not None:
                self.captured_variance_monitor.observe(self, task.x, new.chol.detach(), new.captured, mask)
            summary: tuple[Tensor, ...] = (new.chol, new.precision, new.shift, new.prior_mean, new.b_chol)
            if mask is not None and stored is not None and not bool(mask.any(-1).all()):
                old = (stored.chol, stored.precision, stored.shift, stored.prior_mean, self._b_chol_cache.get(stored.precision))
                summary = keep_streams_without_points(mask.any(-1), summary, old)
            chol, precision, shift, prior_mean, b_chol = map(keep, summary)
            for name, tensor in zip(_POSTERIOR_BUFFERS, (chol, precision, shift, prior_mean)):
                setattr(self, name, tensor)
            self._b_chol_cache.keep(precision, b_chol)
        with torch.no_grad():
            self.posterior_inducing_variables = frozen_copy(self.inducing_variables)
            keep_streams = getattr(self.posterior_inducing_variables, "keep_streams", None)
            if mask is not None and stored is not None and keep_streams is not None:  # streams without points: their stored sets
                keep_streams(stored.inducing_variables, ~mask.any(-1))
            self.posterior_mean_module = frozen_copy(self.mean_module)
            self.num_tasks += 1
        self.last_bound = new.bound.detach()

    def inducing_posterior(self) -> MultivariateNormal:
        r"""The stored :math:`q(u) = \mathcal{N}(\mu_u + L' m_v, L' B^{-1} L'^T)` over :attr:`posterior_inducing_variables`."""
        stored = self._stored_task()
        if stored is None:
            raise RuntimeError("no task has been absorbed yet: call update(train_x, train_y) first")
        return MultivariateNormal(*inducing_moments(stored, self._b_chol_cache.get(stored.precision)))

    def forward(self, x) -> MultivariateNormal:
        r"""Latent :math:`q(f(x)) = \int p(f(x) \mid u)\, q(u)\, \mathrm{d}u` (thesis eq. (2.36) with the optimal :math:`q(u)`).

        :param x: test inputs ``(N, D)`` (or ``(N,)``; ``(S, N, D)`` for batched streams), as :meth:`update` takes them.
        """
        dtype = floating_dtype(self.covar_module)
        x = check_tensor(as_inputs(x, "x", self.time_axis, dtype), "x", dtype=dtype, min_dim=1)
        if x.dim() == 1:
            x = x.unsqueeze(-1)
        kernel = self.covar_module
        prior_mean = self.mean_module(x)
        prior_covar = kernel(x)
        stored = self._stored_task()
        if stored is None:
            return MultivariateNormal(prior_mean, prior_covar)
        check_mean_unchanged(stored.inducing_variables, stored.mean_module, self.mean_module)
        chol_now, mean_w, middle = self._prediction_factors(stored)
        W = with_shared_matrix(solve_lower, chol_now, to_working_dtype(stored.inducing_variables.Kuf(kernel, x)))
        mean = prior_mean + (W.mT @ mean_w.unsqueeze(-1)).squeeze(-1).to(prior_mean.dtype)
        nystrom_residual(to_working_dtype(kernel(x, diag=True)), W, floating_dtype(kernel))  # warns if Kuu and Kuf disagree
        left, right = W.mT.to(mean.dtype), with_shared_matrix(torch.matmul, middle, W).to(mean.dtype)
        if x.shape[-2] > DENSE_PREDICTION_POINTS:  # kept as a product, so variances at N points cost O(N M)
            return MultivariateNormal(mean, prior_covar + MatmulLinearOperator(left, right))
        return MultivariateNormal(mean, DenseLinearOperator(to_dense(prior_covar) + left @ right))

    def _prediction_factors(self, stored: StoredTask) -> tuple[Tensor, ...]:
        """:func:`~gpytorch_hippo.collapsed.prediction_factors` ``(L, m_w, C)`` of :meth:`forward`, computed once per
        state in eval mode (:class:`_PredictionCache`)."""

        def compute() -> tuple[Tensor, ...]:
            return prediction_factors(self.covar_module, self.mean_module, stored, self._b_chol_cache.get(stored.precision))

        posterior = [stored.precision, stored.shift, stored.chol, stored.prior_mean]
        modules = (self.covar_module, self.mean_module, stored.inducing_variables)
        return compute() if self.training else self._prediction_cache.get(modules, posterior, compute)


class OnlineELBO(ApproximateMarginalLogLikelihood):
    r"""Online ELBO of Bui et al. (2017) for any likelihood (thesis eq. (4.6)).

    .. math::
        \mathcal L^o = \sum_i \mathbb{E}_{q(f_i)}[\log p(y_i \mid f_i)]
            + \mathrm{KL}(\tilde q(a) \| p_{old}(a)) - \mathrm{KL}(\tilde q(a) \| q_{old}(a)) - \mathrm{KL}(q(b) \| p(b)),

    with :math:`\tilde q(a) = \int p(a \mid b)\, q(b)\, \mathrm{d}b`. The two :math:`a` terms are evaluated together as
    :math:`\mathbb{E}_{\tilde q}[\log q_{old}(a) - \log p_{old}(a)]` (the entropy of :math:`\tilde q` cancels, so
    a singular :math:`\tilde q` -- e.g. :math:`a = b` -- is harmless); where the new variables do not share
    the old ones' jitter, :math:`\log q_{old}/p_{old}` is averaged over that jitter noise as in
    :class:`OnlineSGPR` (:func:`smooth_ratio`). Like GPyTorch's ``VariationalELBO``
    the value is divided by ``num_data`` (the size of the *current* task), and ``beta`` scales
    the KL-type terms.

    :param likelihood: the GPyTorch likelihood :math:`p(y \mid f)` (any).
    :param model: a GPyTorch ``ApproximateGP`` whose variational strategy is (or wraps) an
        :class:`~gpytorch_hippo.variational.InterdomainVariationalStrategy`.
    :param num_data: the size :math:`N` of the current task (the ELBO is divided by it), a positive int.
    :param beta: the factor of the KL-type terms, a float :math:`\ge 0`; default 1.
    :param combine_terms: ``True`` (default): :meth:`forward` returns one value; ``False``: its terms (likelihood, KL,
        log prior and, where the model has them, added losses), as GPyTorch's ``VariationalELBO``.

    The model must use :class:`~gpytorch_hippo.variational.InterdomainVariationalStrategy`
    (directly or inside ``IndependentMultitaskVariationalStrategy``). Call :meth:`end_task` after
    training on each task: it stores :math:`q_{old}(a)` (mean and Cholesky factor of :math:`S_a`), the
    Cholesky factor of :math:`K'_{aa}` (with the jitter of the inducing variables), :math:`\mu'_a` and frozen
    copies of the inducing variables and of the mean function, all in the module tree (saved by
    ``state_dict``, moved by ``.to``). Then move HiPPO inducing variables with
    ``model.variational_strategy.advance(t_new)`` or ``.append_path(x_ordered)`` (both refused
    before :meth:`end_task`) or replace point ones. Before the first :meth:`end_task` this is the
    plain SVGP ELBO (Hensman et al. (2013), thesis eq. (2.38)). With HiPPO inducing variables this trains OHSVGP,
    with inducing points OSVGP.

    A mean function may change between tasks with point inducing variables (:math:`\mu'_a` is stored
    and :math:`\mu_a = m_{new}(Z_a)`); interdomain ones project :math:`f - m`, so there a change raises.
    """

    # The last task (None before end_task), in the module tree.
    old_inducing_variables: InducingVariables | None
    old_mean_module: gpytorch.means.Mean | None
    old_mean: Tensor | None
    old_covar_chol: Tensor | None
    old_prior_chol: Tensor | None
    old_prior_mean: Tensor | None

    def __init__(self, likelihood, model, num_data: int, beta: float = 1.0, combine_terms: bool = True):
        if not isinstance(num_data, int) or isinstance(num_data, bool) or num_data < 1:
            raise ValueError(f"num_data must be a positive int (size of the current task), got {num_data!r}")
        if not (isinstance(beta, (int, float)) and beta >= 0):
            raise ValueError(f"beta must be a non-negative float, got {beta!r}")
        super().__init__(likelihood, model, num_data, beta, combine_terms)
        self._interdomain_strategy().online_objective = True  # (also fails early on an unsupported model)
        self.old_inducing_variables = None
        self.old_mean_module = None
        for name in _OLD_TASK_BUFFERS:
            self.register_buffer(name, None)

    def _interdomain_strategy(self) -> InterdomainVariationalStrategy:
        strategy = getattr(self.model, "variational_strategy", None)
        while strategy is not None and not isinstance(strategy, InterdomainVariationalStrategy):
            strategy = getattr(strategy, "base_variational_strategy", None)
        if strategy is None:
            raise TypeError(
                "OnlineELBO needs a model whose variational_strategy is an InterdomainVariationalStrategy "
                "(possibly wrapped by IndependentMultitaskVariationalStrategy)"
            )
        return strategy

    @property
    def _mean_module(self) -> gpytorch.means.Mean:
        """The model's prior mean function (``ZeroMean`` if it has none)."""
        mean_module = self._interdomain_strategy().mean_module
        return gpytorch.means.ZeroMean() if mean_module is None else mean_module

    @property
    def has_old_task(self) -> bool:
        """Whether :meth:`end_task` has stored a task."""
        return self._old_task() is not None

    def _old_task(self) -> _OldTask | None:
        """The stored task, or ``None`` before :meth:`end_task`; a ``RuntimeError`` for a task stored in part."""
        parts = (self.old_inducing_variables, self.old_mean_module, *(getattr(self, name) for name in _OLD_TASK_BUFFERS))
        present = is_stored(parts, "the ELBO holds only a part of the old task (say, q(a) without its inducing variables)")
        return _OldTask(*parts) if present else None

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        # The old task exists only after end_task: allocate it so that a fresh ELBO loads a saved one.
        copies = {"old_inducing_variables": self._interdomain_strategy().inducing_variables, "old_mean_module": self._mean_module}
        allocate_stored(self, state_dict, prefix, _OLD_TASK_BUFFERS, copies, "old_mean")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)

    @torch.no_grad()
    def end_task(self, num_data: int | None = None) -> None:
        r"""Store :math:`q_{old}(a)`, :math:`\operatorname{chol}(K'_{aa})`, :math:`\mu'_a` and the inducing variables at the end of a task.

        ``num_data``: size of the *next* task (the ELBO's normaliser), if it differs from this one's.

        :param num_data: the size of the next task, a positive int; ``None`` (default): keep the current ``num_data``.
        """
        if num_data is not None:
            if not isinstance(num_data, int) or isinstance(num_data, bool) or num_data < 1:
                raise ValueError(f"num_data must be a positive int (size of the next task), got {num_data!r}")
            self.num_data = num_data
        strategy = self._interdomain_strategy()
        posterior = strategy.inducing_posterior()
        ivs = strategy.inducing_variables
        kernel = strategy.kernel
        prior_chol = psd_safe_cholesky(to_working_dtype(to_dense(ivs.Kuu(kernel))))
        prior_mean = ivs.prior_mean(strategy.mean_module)
        if prior_mean is None:
            prior_mean = torch.zeros(prior_chol.shape[:-1], dtype=prior_chol.dtype, device=prior_chol.device)
        self.old_mean = to_working_dtype(posterior.mean.detach()).clone()
        self.old_covar_chol = psd_safe_cholesky(to_working_dtype(posterior.covariance_matrix.detach()))
        self.old_prior_chol = prior_chol.detach().clone()
        self.old_prior_mean = to_working_dtype(prior_mean.detach()).clone()
        self.old_inducing_variables = frozen_copy(ivs)
        self.old_mean_module = frozen_copy(self._mean_module)
        strategy.online_task_ended.fill_(True)

    @staticmethod
    def _expected_gaussian_log_density(mean: Tensor, covar: Tensor, target_mean: Tensor, target_chol: Tensor) -> Tensor:
        """``E_{N(mean, covar)}[log N(a; target_mean, target_chol target_chol^T)]``."""
        diff = solve_lower(target_chol, (mean - target_mean).unsqueeze(-1)).squeeze(-1)
        half = solve_lower(target_chol, covar)
        trace = solve_lower(target_chol, half.mT).diagonal(dim1=-2, dim2=-1).sum(-1)
        logdet = 2 * target_chol.diagonal(dim1=-2, dim2=-1).log().sum(-1)
        size = mean.shape[-1]
        return -0.5 * (diff.square().sum(-1) + trace + logdet + size * math.log(2 * math.pi))

    @staticmethod
    def _expected_smoothed_log_ratio(old: _OldTask, mean: Tensor, covar: Tensor, noise: Tensor) -> Tensor:
        r""":math:`\mathbb{E}_{\mathcal{N}(\mathrm{mean}, \mathrm{covar})}[\log \tilde r(g)]`: the stored ratio
        :math:`r = q_{old} / p_{old}` averaged over the old variables' unshared jitter noise (:func:`smooth_ratio`), for the
        moments of their noise-free part :math:`g`. In :math:`w = L'^{-1}(g - \mu'_a)` with
        :math:`K = L'^{-1} \operatorname{chol}(S_a)`: :math:`\Lambda = K^{-T}K^{-1} - I`, :math:`\eta = K^{-T}K^{-1} m_w` and
        :math:`\log r = -\tfrac12 w^\top \Lambda w + w^\top \eta - \log|K| - \tfrac12 m_w^\top (K K^\top)^{-1} m_w`."""
        prior_chol, covar_chol, old_mean, old_prior_mean = map(to_working_dtype, (old.prior_chol, old.covar_chol, old.mean, old.prior_mean))
        factor = solve_lower(prior_chol, covar_chol)  # K
        eye = torch.eye(factor.shape[-1], dtype=factor.dtype, device=factor.device)
        factor_inv = solve_lower(factor, eye)
        old_mean_w = solve_lower(prior_chol, (old_mean - old_prior_mean).unsqueeze(-1))
        scaled = factor_inv @ old_mean_w  # K^{-1} m_w
        precision = factor_inv.mT @ factor_inv - eye
        shift = (factor_inv.mT @ scaled).squeeze(-1)
        constant = -factor.diagonal(dim1=-2, dim2=-1).log().sum(-1) - 0.5 * scaled.square().sum((-2, -1))
        precision, shift = unwhiten_ratio(precision, shift, prior_chol)  # in z = g - μ'_a
        precision, shift, smoothing = smooth_ratio(precision, shift, noise)
        mean_z = mean - old_prior_mean
        quadratic = (precision * covar).sum((-2, -1)) + (mean_z * (precision @ mean_z.unsqueeze(-1)).squeeze(-1)).sum(-1)
        return -0.5 * quadratic + (shift * mean_z).sum(-1) + constant + smoothing

    def online_kl_divergence(self) -> Tensor:
        r""":math:`\mathrm{KL}(q(b) \| p(b)) - \mathbb{E}_{\tilde q(a)}[\log q_{old}(a) - \log p_{old}(a)]` (the negated
        non-likelihood terms of thesis eq. (4.6)), shaped like the strategy's KL."""
        kl = self.model.variational_strategy.kl_divergence()
        old = self._old_task()
        if old is None:
            return kl
        strategy = self._interdomain_strategy()
        check_mean_unchanged(old.inducing_variables, old.mean_module, self._mean_module)
        marginal = strategy.inducing_marginal(old.inducing_variables)
        mean, covar = to_working_dtype(marginal.mean), to_working_dtype(to_dense(marginal.lazy_covariance_matrix))
        old_prior_chol = to_working_dtype(old.prior_chol)
        old_prior_kuu = old_prior_chol @ old_prior_chol.mT
        noise = old.inducing_variables.unshared_jitter(strategy.inducing_variables, old_prior_kuu)
        if bool((noise > 0).any()):
            gain = self._expected_smoothed_log_ratio(old, mean, covar - torch.diag_embed(noise), noise)
        else:
            gain = self._expected_gaussian_log_density(mean, covar, to_working_dtype(old.mean), to_working_dtype(old.covar_chol))
            gain = gain - self._expected_gaussian_log_density(mean, covar, to_working_dtype(old.prior_mean), old_prior_chol)
        while gain.dim() > kl.dim():
            gain = gain.sum(-1)
        return kl - gain.to(kl.dtype)

    def _log_likelihood_term(self, approximate_dist_f, target, **kwargs):
        return self.likelihood.expected_log_prob(target, approximate_dist_f, **kwargs).sum(-1)

    def forward(self, approximate_dist_f, target, **kwargs):
        r""":math:`\mathcal L^o / N` for a minibatch of the current task (:math:`N` = ``num_data``).

        :param approximate_dist_f: the model's output :math:`q(f)` at the minibatch's inputs (a ``MultivariateNormal``).
        :param target: the minibatch's targets, matching the output's event shape.
        """
        check_tensor(target, "target", min_dim=1)
        if approximate_dist_f.event_shape.numel() == 0 or target.numel() == 0:
            raise ValueError("the minibatch is empty: approximate_dist_f and target need at least one data point")
        if target.shape[-1] != approximate_dist_f.event_shape[0] and target.shape != approximate_dist_f.event_shape:
            raise ValueError(
                f"target of shape {tuple(target.shape)} does not match the model output with event shape "
                f"{tuple(approximate_dist_f.event_shape)}"
            )
        num_batch = approximate_dist_f.event_shape[0]
        log_likelihood = self._log_likelihood_term(approximate_dist_f, target, **kwargs).div(num_batch)
        kl_divergence = self.online_kl_divergence().div(self.num_data / self.beta)
        added_loss = torch.zeros_like(log_likelihood)
        had_added_losses = False
        for added_loss_term in self.model.added_loss_terms():
            added_loss = added_loss + added_loss_term.loss()
            had_added_losses = True
        log_prior = torch.zeros_like(log_likelihood)
        for _, module, prior, closure, _ in self.named_priors():
            log_prior = log_prior + prior.log_prob(closure(module)).sum().div(self.num_data)
        if self.combine_terms:
            return log_likelihood - kl_divergence + log_prior - added_loss
        if had_added_losses:
            return log_likelihood, kl_divergence, log_prior, added_loss
        return log_likelihood, kl_divergence, log_prior
