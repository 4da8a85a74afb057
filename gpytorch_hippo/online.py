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
:math:`(q_{\mathrm{old}}(a), K'_{aa}, a)`.
"""

from __future__ import annotations

import copy
import itertools
import math
from typing import Literal, NamedTuple, TypeVar, overload

import gpytorch
import numpy as np
import torch
from gpytorch.distributions import MultivariateNormal
from linear_operator import to_dense
from linear_operator.operators import DenseLinearOperator, MatmulLinearOperator
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor

from probseq._compat import ApproximateMarginalLogLikelihood, cholesky_dtype, tensor_version
from probseq._validation import check_tensor

from ._validation import check_finite_scalar, floating_dtype
from .fitting import FitReport, fit_online_bound
from .inducing.base import InducingVariables
from .inducing.points import InducingPoints
from .monitor import CapturedVarianceMonitor
from .nystrom import nystrom_residual
from .timeaxis import TimeAxis, align_on_index, as_time_axis, is_datetime_like
from .variational import InterdomainVariationalStrategy, solve_lower

#: predictions at up to this many points get a dense covariance (fast sampling, as BoTorch's acquisitions
#: draw); more points keep ``K_xx + W^T C W`` as a product, so that their variances cost O(N M)
DENSE_PREDICTION_POINTS = 256

__all__ = ["OnlineSGPR", "OnlineELBO", "FitReport"]

_OLD_TASK_BUFFERS = ("old_mean", "old_covar_chol", "old_prior_chol", "old_prior_mean")


_ModuleT = TypeVar("_ModuleT", bound=torch.nn.Module)


def frozen_copy(module: _ModuleT, share: bool = True) -> _ModuleT:
    """A detached deep copy of ``module`` (inducing variables, mean function) whose tensors receive
    no gradients; a copy of inducing variables is owned by no variational strategy. ``share``: a module
    with its own ``frozen_copy`` (batched streams' variables) makes it, sharing what is identical.

    :param module: the module to copy (inducing variables, a mean function).
    :param share: ``True`` (default): use the module's own ``frozen_copy`` where it has one (streams in the same state
        share one copied set); ``False``: a plain ``copy.deepcopy``, every tensor its own.
    """
    own_copy = getattr(module, "frozen_copy", None) if share else None
    snapshot = own_copy() if own_copy is not None else copy.deepcopy(module)
    for parameter in snapshot.parameters():
        parameter.requires_grad_(False)
    if isinstance(snapshot, InducingVariables):
        snapshot.variational_owner = None
    return snapshot


def _frozen_copy_to_load(template: torch.nn.Module, state_dict: dict, prefix: str) -> torch.nn.Module:
    """A frozen copy of ``template`` whose tensors take the shapes saved under ``prefix``, so that a
    fresh model can load a stored task whose variables differed from today's (e.g. another ``M``)."""
    snapshot = frozen_copy(template, share=False)  # every stream its own tensors, to take the saved shapes
    for name, tensor in itertools.chain(snapshot.named_parameters(), snapshot.named_buffers()):
        saved = state_dict.get(prefix + name)
        if saved is not None and saved.shape != tensor.shape:
            tensor.data = torch.empty(saved.shape, dtype=tensor.dtype, device=tensor.device)
    return snapshot


def _check_mean_unchanged(old_inducing_variables: InducingVariables, old_mean: torch.nn.Module, mean_module) -> None:
    """Raise if the mean function changed since a task whose inducing variables project the centred
    process ``f - m`` (interdomain variables; ``prior_mean`` is ``None``). Their prior mean under the
    new mean would be ``\\int (m_new - m_old) φ``, which the interface does not provide. Point
    inducing variables need no check: their old prior mean is stored and the new one is ``m_new(Z_a)``."""
    if old_inducing_variables.prior_mean(mean_module) is not None:
        return
    old_state, state = old_mean.state_dict(), mean_module.state_dict()
    if old_state.keys() == state.keys() and all(torch.equal(old_state[k], state[k].detach()) for k in state):
        return
    raise RuntimeError(
        f"the mean function changed since the previous task, but {type(old_inducing_variables).__name__} project "
        "the centred process f - m, so the stored task cannot be re-expressed under the new mean: keep the mean "
        "fixed after the first task (mean_module.requires_grad_(False)), use a ZeroMean, or use InducingPoints"
    )


def to_working_dtype(tensor: Tensor) -> Tensor:
    r"""``tensor`` in the dtype of the online algebra: at least GPyTorch's Cholesky dtype
    (:func:`probseq._compat.cholesky_dtype`, float64), so that a float32 model is the float64 model
    rounded once at its outputs (:math:`K_{uu}` is conditioned only by its jitter, :math:`\kappa \approx M / 10^{-6}`).

    :param tensor: a floating tensor; one of the working dtype (float64) already is returned as it is.
    """
    return tensor.to(torch.promote_types(tensor.dtype, cholesky_dtype()))


def _check_inputs(
    train_x, train_y, dtype: torch.dtype, x_name: str = "train_x", y_name: str = "train_y", streams: int | None = None
) -> tuple[Tensor, Tensor]:
    """Finite tensors in the model's floating ``dtype`` (integers promoted), ``x`` as ``(N, D)``, ``y`` as ``(N,)``;
    for a model of ``streams`` batched streams, ``x`` of ``y``'s shape ``(S, N)`` is read as 1-D times ``(S, N, 1)``."""
    train_x = check_tensor(train_x, x_name, dtype=dtype)
    train_y = check_tensor(train_y, y_name, dtype=dtype)
    if train_x.dim() == 1 or (train_x.dim() == 2 and train_x.shape == train_y.shape and train_x.shape[0] == streams):
        train_x = train_x.unsqueeze(-1)
    if train_x.dim() < 2 or train_x.shape[-2] < 1:
        raise ValueError(f"{x_name} must have shape (N, D) or (N,) with N >= 1, got {tuple(train_x.shape)}")
    if train_y.shape != train_x.shape[:-1]:
        raise ValueError(
            f"{y_name} must have shape {tuple(train_x.shape[:-1])} to match {x_name} of shape "
            f"{tuple(train_x.shape)}, got {tuple(train_y.shape)}"
        )
    return train_x, train_y


def _check_streams_finite(values, where: str = "", name: str = "train_y") -> None:
    """NaN/Inf in a batch of streams ``(S, N)``: an error naming the streams, never NaN spread to the others."""
    if not isinstance(values, Tensor) or values.dim() < 2 or not values.is_floating_point():
        return
    bad = ~torch.isfinite(values).reshape(-1, values.shape[-1]).all(-1)
    if bool(bad.any()):
        streams = bad.nonzero().squeeze(-1).tolist()
        raise ValueError(
            f"{name} contains NaN or infinite values {where} in stream(s) {streams[:10]}"
            f"{' ...' if len(streams) > 10 else ''} (index along the batch dimensions, flattened): "
            "pass mask= (False at entries to ignore) for ragged tasks"
        )


def _keep_streams_without_points(observed: Tensor, new: tuple[Tensor, ...], old: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """The new summary for streams with a point in the task, the stored one, unchanged, for the others."""
    kept = []
    for fresh, stored in zip(new, old):
        selector = observed.reshape(observed.shape + (1,) * (fresh.dim() - observed.dim()))
        kept.append(torch.where(selector, fresh, to_working_dtype(stored).expand_as(fresh)))
    return tuple(kept)


def _unchanged_points(old: InducingVariables, new: InducingVariables, old_chol: Tensor, chol: Tensor, W: Tensor) -> bool:
    """Whether a task's inducing points and ``K_uu`` are exactly the stored task's, with nothing to
    differentiate (the identities of the short update hold at these hyperparameters only)."""
    if not (isinstance(old, InducingPoints) and isinstance(new, InducingPoints)) or old.jitter != new.jitter:
        return False
    if chol.requires_grad or W.requires_grad or old.points.shape != new.points.shape or old_chol.shape != chol.shape:
        return False
    return torch.equal(old.points, new.points.detach()) and torch.equal(old_chol, chol)


def _check_finite_result(name: str, *tensors: Tensor) -> None:
    """A named error instead of a NaN/Inf posterior or bound from finite but extreme input."""
    if not all(bool(torch.isfinite(t).all()) for t in tensors):
        raise ValueError(
            f"{name} is not finite although the inputs are: the targets or the hyperparameters are out of the range "
            "floating point can represent here (standardise train_y, check the noise and length scales)"
        )


def _smooth_ratio(precision: Tensor, shift: Tensor, noise: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    r"""The stored ratio ``r(a) = exp(-½ aᵀPa + aᵀh)`` of a task, averaged over the jitter noise of its
    inducing variables: ``r̃(a) = E_e[r(a + e)]`` with ``e ~ N(0, diag(noise))``.

    The jitter is white noise on ``a`` (``a = g + e``, :class:`~gpytorch_hippo.inducing.InducingVariables`),
    so ``q_old(f) / p(f) = E_e[r(g(f) + e)]``: Bui et al.'s ``q_old(a) / p_old(a)`` holds only where ``a``
    is a function of ``f``. In Gaussian form, with ``D = diag(noise)^{1/2}`` and ``C Cᵀ = I + DPD``,

    .. math::
        P̃ = P - PD (I + DPD)^{-1} DP,\qquad h̃ = h - PD (I + DPD)^{-1} Dh,\qquad
        \log \frac{r̃}{r}\Big|_{\text{const}} = -\tfrac12 \log|I + DPD| + \tfrac12 (Dh)ᵀ(Dh̃),

    i.e. ``P̃ = (P^{-1} + diag(noise))^{-1}``: each direction keeps at most the information
    ``1 / jitter`` instead of the jitter passing on as information about ``f``. Returns
    ``(P̃, h̃, constant)``; ``noise = 0`` leaves ``r`` unchanged.
    """
    if not bool((noise > 0).any()):
        return precision, shift, torch.zeros(shift.shape[:-1], dtype=shift.dtype, device=shift.device)
    scale = noise.sqrt()
    scaled = scale.unsqueeze(-1) * precision * scale.unsqueeze(-2)  # DPD
    C = psd_safe_cholesky(scaled + torch.eye(scaled.shape[-1], dtype=scaled.dtype, device=scaled.device))
    X = solve_lower(C, scale.unsqueeze(-1) * precision)  # C^{-1} D P
    scaled_shift = scale * shift
    smoothed_precision = precision - X.mT @ X
    smoothed_shift = shift - (X.mT @ solve_lower(C, scaled_shift.unsqueeze(-1))).squeeze(-1)
    constant = -C.diagonal(dim1=-2, dim2=-1).log().sum(-1) + 0.5 * (scaled_shift * scale * smoothed_shift).sum(-1)
    return 0.5 * (smoothed_precision + smoothed_precision.mT), smoothed_shift, constant


def _unwhiten_ratio(precision: Tensor, shift: Tensor, chol: Tensor) -> tuple[Tensor, Tensor]:
    """``(L'^{-T} Λ L'^{-1}, L'^{-T} η)``: a ratio ``exp(-½ wᵀΛw + wᵀη)`` in ``w = L'^{-1} z`` written in ``z``."""
    upper = chol.mT
    half = torch.linalg.solve_triangular(upper, precision, upper=True)  # L'^{-T} Λ
    unwhitened = torch.linalg.solve_triangular(upper, half.mT, upper=True)  # L'^{-T} Λ L'^{-1}
    return 0.5 * (unwhitened + unwhitened.mT), torch.linalg.solve_triangular(upper, shift.unsqueeze(-1), upper=True).squeeze(-1)


class _StoredTask(NamedTuple):
    r"""What :meth:`OnlineSGPR.update` keeps of the tasks absorbed so far: frozen copies of the inducing variables
    and the mean function, and the summary :math:`(L', \Lambda', \eta', \mu'_a)` in their coordinates."""

    inducing_variables: InducingVariables
    mean_module: gpytorch.means.Mean
    chol: Tensor
    precision: Tensor
    shift: Tensor
    prior_mean: Tensor


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
    r"""Collapsed online sparse GP regression (OSGPR / OHSGPR), Bui et al. (2017), thesis §4.2.2.

    Each call of :meth:`update` absorbs one task :math:`(X, y)`. For a Gaussian likelihood the online
    ELBO (thesis eq. (4.6)) is maximised in closed form over :math:`q(b)`. Writing
    :math:`L = \operatorname{chol}(K_{bb})`, :math:`v = L^{-1}(b - \mu_b)`, :math:`W = L^{-1} K_{bX}` and, for the old inducing
    variables, :math:`L' = \operatorname{chol}(K'_{aa})` (old hyperparameters), the ratio :math:`q_{old}(a) / p_{old}(a)` is a
    Gaussian factor :math:`\exp(-\tfrac12 w^T \Lambda' w + w^T \eta' + c')` in :math:`w = L'^{-1}(a - \mu'_a)`. Under the new
    prior :math:`w = \delta + T^T v + \varepsilon` with :math:`T = L^{-1} K_{ba} L'^{-T}`, :math:`\delta = L'^{-1}(\mu_a - \mu'_a)` and
    :math:`\operatorname{cov}(\varepsilon) = C = L'^{-1}(K_{aa} - Q_{aa}) L'^{-T}`; so the optimal
    :math:`q(v) = \mathcal{N}(B^{-1}\eta, B^{-1})` with

    .. math::
        B = I + W W^T / \sigma^2 + T \Lambda' T^T,\qquad
        \eta = W (y - m(X)) / \sigma^2 + T (\eta' - \Lambda' \delta),

    and the collapsed bound (the monitoring value :meth:`log_bound`) is

    .. math::
        \mathcal L = -\tfrac12 \log|B| + \tfrac12 \eta^T B^{-1} \eta
        - \tfrac{N}{2}\log 2\pi\sigma^2 - \tfrac{\|y - m(X)\|^2}{2\sigma^2}
        - \tfrac{\operatorname{tr}(K_{XX} - Q_{XX})}{2\sigma^2}
        - \tfrac12 \operatorname{tr}(\Lambda' C) - \tfrac12 \delta^T \Lambda' \delta + \delta^T \eta'
        + \tfrac12\log|B'| - \tfrac12 \eta'^T B'^{-1} \eta',

    which is Bui et al.'s collapsed bound (their :math:`D_a^{-1} = S_a^{-1} - K'^{-1}_{aa}` is
    :math:`L'^{-T} \Lambda' L'^{-1}` here; nothing is inverted but triangular factors and :math:`B`, whose
    eigenvalues are :math:`\ge 1`). For the first task the old terms vanish and this is Titsias'
    SGPR bound (the bound that follows thesis eq. (2.40)). With the same inducing inputs and
    hyperparameters throughout, the posterior after any sequence of tasks equals batch SGPR on all
    data, and the per-task bounds sum to the batch bound.

    **The jitter.** :math:`K'_{aa}` includes the jitter of the old variables, white noise :math:`e` on them
    (:math:`a = g(f) + e`, :class:`~gpytorch_hippo.inducing.InducingVariables`). Where the new variables
    do not share it (HiPPO bases after ``advance``, points that moved), the ratio is averaged over
    that noise before it is used, :math:`\Lambda', \eta'` above becoming those of :math:`\mathbb{E}_e[r(g + e)]`
    (:func:`_smooth_ratio`; :math:`C` and :math:`K_{aa}` then exclude the noise, and the bound gains the
    average's log-normaliser). Taken literally, Bui et al.'s ratio would pass the jitter on as
    information about :math:`f` at every step. The algebra runs in float64 (``to_working_dtype``) whatever the
    model's dtype, and the stored summary stays in float64.

    After each task the summary :math:`(\Lambda', \eta', L', \mu'_a)` is stored in buffers and frozen deep copies
    of the inducing variables and the mean in :attr:`posterior_inducing_variables` and
    :attr:`posterior_mean_module` (in the module tree: ``state_dict``, ``deepcopy`` and ``.to``
    carry them). Between tasks the inducing variables may be replaced
    (``model.inducing_variables = InducingPoints(new_Z)``) or moved in place (e.g.
    ``model.inducing_variables.advance(t_new)`` for HiPPO); the old copy provides ``Kuu_cross``.
    The mean function may change between tasks with point inducing variables (:math:`\mu_a = m(Z_a)`
    under the new mean, :math:`\mu'_a` stored); interdomain ones project :math:`f - m`, so a change raises.

    :param inducing_variables: any :class:`~gpytorch_hippo.inducing.InducingVariables`.
    :param covar_module: the GPyTorch kernel :math:`k`.
    :param likelihood: a homoskedastic ``gpytorch.likelihoods.GaussianLikelihood``.
    :param mean_module: prior mean (default ``ZeroMean``).
    :param captured_variance_warning: :meth:`update` warns when the inducing variables capture less
        than this fraction of the prior variance at the task's inputs or over the inputs seen so far within their reach
        (mean of :math:`\operatorname{diag}(K_{fu} K_{uu}^{-1} K_{uf}) / \operatorname{diag}(K_{ff})`), and again
        whenever it falls below half the level of its last warning; :attr:`last_captured_variance` holds the latest value.
        The check is the :class:`~gpytorch_hippo.monitor.CapturedVarianceMonitor` in :attr:`captured_variance_monitor`,
        paced by counts of work (never by time); ``None`` disables it. A task's inputs outside the reach of HiPPO
        variables (e.g. beyond :math:`t` after a forgotten ``advance``) always raise
        :class:`~gpytorch_hippo.inducing.InputsOutsideSupportError`.
    :param time_axis: a :class:`~gpytorch_hippo.timeaxis.TimeAxis` (or its unit, e.g. ``"h"``) to take calendar
        times as inputs. Its unit, origin and zone are in the ``state_dict``: ``load_state_dict`` gives a model
        built without an axis (or with an axis of no origin yet) the saved one, and raises a ``ValueError`` for
        an axis of another unit or origin.
    :param refit_every: the refit policy of :meth:`update` calls that leave ``num_iter`` unset: the
        hyperparameters are fitted on task 1 and on every ``refit_every``-th task after it (tasks
        :math:`1, 1 + k, 1 + 2k, \dots`; the count ``num_tasks`` is in the ``state_dict``, so a reloaded model keeps
        the schedule), by ``refit_iter`` iterations of ``refit_optimizer`` (default L-BFGS) on the task's
        online bound; the other tasks are closed-form updates. A mean that interdomain inducing variables
        cannot follow (they project :math:`f - m`) is left out of refits after task 1. ``None`` (default): no fit
        unless ``num_iter`` asks for one.
    :param refit_iter: iterations of each policy refit (``num_iter`` of :meth:`update`), a positive int; default 50.
    :param refit_optimizer: the optimiser of the policy refits, ``"lbfgs"`` (default) or ``"adam"`` (the ``optimizer``
        of :meth:`update`; Adam runs at the ``lr`` given to :meth:`update`).
    :param refit_max_change: a fit of :meth:`update` on a model that holds a posterior (policy or ``num_iter``) that
        moves a positive hyperparameter by more than this factor is undone, with a
        :class:`~gpytorch_hippo.fitting.RefitWarning` and :attr:`last_fit` saying why
        (:func:`~gpytorch_hippo.fitting.fit_online_bound`'s ``max_change``), as is a fit that lowers the task's bound;
        default 10; ``None``: keep every fit as the optimiser ends it.

    In both modes ``model(x)`` returns the latent :math:`q(f(x))`: the stored :math:`q(b)` pushed through
    :math:`p(f \mid b)` with the current kernel; ``likelihood(model(x))`` is the predictive.
    """

    # The stored task (None before the first one) and what the last update reported.
    posterior_inducing_variables: InducingVariables | None
    posterior_mean_module: gpytorch.means.Mean | None
    posterior_chol: Tensor | None
    posterior_precision: Tensor | None
    posterior_shift: Tensor | None
    posterior_prior_mean: Tensor | None
    num_tasks: Tensor
    seen_input_range: Tensor | None
    last_bound: Tensor | None
    last_fit: FitReport | None
    _prediction_cache: tuple[tuple[list[int], list[Tensor]], tuple[Tensor, Tensor, Tensor]] | None
    _b_chol_cache: tuple[Tensor, tuple[int, int], Tensor] | None

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
        for name, value, smallest in (("refit_every", refit_every, 1), ("refit_iter", refit_iter, 1)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < smallest):
                raise ValueError(f"{name} must be a positive int{' or None' if name == 'refit_every' else ''}, got {value!r}")
        if refit_optimizer not in ("adam", "lbfgs"):
            raise ValueError(f"refit_optimizer must be 'adam' or 'lbfgs', got {refit_optimizer!r}")
        self.refit_every, self.refit_iter, self.refit_optimizer = refit_every, refit_iter, refit_optimizer
        #: converts calendar times (pandas, NumPy ``datetime64``) to the model's time inputs (``None``: numbers only)
        self.time_axis = as_time_axis(time_axis)
        #: the :class:`~gpytorch_hippo.monitor.CapturedVarianceMonitor` consulted after each update (``None``: none)
        self.captured_variance_monitor: CapturedVarianceMonitor | None = None
        self.captured_variance_warning = captured_variance_warning
        if refit_max_change is not None and not (isinstance(refit_max_change, (int, float)) and refit_max_change > 1):
            raise ValueError(f"refit_max_change must be a number > 1 or None, got {refit_max_change!r}")
        self.refit_max_change = refit_max_change
        if not isinstance(inducing_variables, InducingVariables):
            raise TypeError(f"inducing_variables must be an InducingVariables instance, got {type(inducing_variables).__name__}")
        if not isinstance(covar_module, gpytorch.kernels.Kernel):
            raise TypeError(f"covar_module must be a gpytorch Kernel, got {type(covar_module).__name__}")
        if not isinstance(likelihood, gpytorch.likelihoods.GaussianLikelihood) or isinstance(
            likelihood, gpytorch.likelihoods.FixedNoiseGaussianLikelihood
        ):
            raise TypeError(
                "likelihood must be a homoskedastic gpytorch.likelihoods.GaussianLikelihood "
                f"(the collapsed bound needs one noise variance), got {type(likelihood).__name__}"
            )
        if mean_module is None:
            mean_module = gpytorch.means.ZeroMean()
        if not isinstance(mean_module, gpytorch.means.Mean):
            raise TypeError(f"mean_module must be a gpytorch Mean or None, got {type(mean_module).__name__}")
        self.inducing_variables = inducing_variables
        self.covar_module = covar_module
        self.likelihood = likelihood
        self.mean_module = mean_module
        #: Frozen copy of the inducing variables that the stored summary refers to (``None`` before the first task).
        self.posterior_inducing_variables = None
        #: Frozen copy of the mean function of the stored summary (``None`` before the first task, or without a mean).
        self.posterior_mean_module = None
        for name in ("posterior_chol", "posterior_precision", "posterior_shift", "posterior_prior_mean"):
            self.register_buffer(name, None)
        self.register_buffer("num_tasks", torch.tensor(0))
        self.register_buffer("seen_input_range", None)
        self.register_buffer("last_bound", None, persistent=False)
        self._prediction_cache = None  # (key, factors) of forward(): see _prediction_factors
        self._b_chol_cache = None  # (posterior_precision, (version, storage), chol(I + posterior_precision)): _stored_b_chol
        #: :class:`FitReport` of the last update that fitted hyperparameters (``None`` before one)
        self.last_fit = None

    @property
    def captured_variance_warning(self) -> float | None:
        """The captured-variance monitor's threshold (``None``: no monitor); setting it starts a fresh monitor."""
        monitor = self.captured_variance_monitor
        return None if monitor is None else monitor.threshold

    @captured_variance_warning.setter
    def captured_variance_warning(self, threshold: float | None) -> None:
        self.captured_variance_monitor = None if threshold is None else CapturedVarianceMonitor(threshold)

    @property
    def last_captured_variance(self) -> float | None:
        """The captured fraction of the prior variance at the monitor's latest checks (the lower of the task's inputs
        and the inputs seen so far; ``None`` before a check or without a monitor)."""
        monitor = self.captured_variance_monitor
        return None if monitor is None else monitor.last_captured_variance

    # ------------------------------------------------------------------ state handling
    @property
    def has_posterior(self) -> bool:
        """Whether at least one task has been absorbed (a ``RuntimeError`` for a task stored in part)."""
        return self._stored_task(required=False) is not None

    def reset_posterior(self) -> None:
        """Forget every absorbed task: back to the prior (hyperparameters and inducing variables kept)."""
        for name in ("posterior_chol", "posterior_precision", "posterior_shift", "posterior_prior_mean", "seen_input_range"):
            setattr(self, name, None)
        self.posterior_inducing_variables = None
        self.posterior_mean_module = None
        self.num_tasks.zero_()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        saved_axis = (state_dict.get(prefix + "_extra_state") or {}).get("time_axis")
        if saved_axis is not None and self.time_axis is not None:
            copy.deepcopy(self.time_axis).load_state(saved_axis)  # a conflicting time axis raises before anything is loaded
        # The summary buffers and the frozen inducing copy exist only after a task: allocate them so
        # that a fresh model can load the state of a trained one.
        for name in ("posterior_chol", "posterior_precision", "posterior_shift", "posterior_prior_mean", "seen_input_range"):
            key = prefix + name
            if key in state_dict and getattr(self, name) is None:
                setattr(self, name, torch.empty_like(state_dict[key]))
        for name, template in (
            ("posterior_inducing_variables", self.inducing_variables),
            ("posterior_mean_module", self.mean_module),
        ):
            if getattr(self, name) is None and prefix + "posterior_chol" in state_dict:
                setattr(self, name, _frozen_copy_to_load(template, state_dict, f"{prefix}{name}."))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)

    def get_extra_state(self) -> dict:
        """The time axis's :meth:`~gpytorch_hippo.timeaxis.TimeAxis.state` (unit, origin, zone; ``None`` without one)."""
        return {"time_axis": None if self.time_axis is None else self.time_axis.state()}

    def set_extra_state(self, state: dict) -> None:
        """Restore the saved time axis: a model without one takes it, a model whose axis has no origin yet takes its
        origin and zone, and another unit or origin raises a ``ValueError``.

        :param state: what :meth:`get_extra_state` returned.
        """
        saved = state.get("time_axis")
        if saved is None:
            return
        if self.time_axis is None:
            self.time_axis = TimeAxis.from_state(saved)
        else:
            self.time_axis.load_state(saved)

    def _noise(self) -> Tensor:
        return self.likelihood.noise.squeeze(-1)

    def _num_streams(self) -> int | None:
        """``S`` of a model of batched streams (its likelihood has ``batch_shape=(S,)``), else ``None``."""
        noise = self._noise()
        return int(noise.shape[0]) if noise.dim() == 1 else None

    def _as_inputs(self, x, name: str):
        """Inputs as given by the user: calendar times through :attr:`time_axis`, NumPy/pandas numbers
        as tensors; tensors unchanged (``_check_inputs`` validates them)."""
        if self.time_axis is not None and not isinstance(x, Tensor):
            return self.time_axis(x).to(floating_dtype(self.covar_module))
        if isinstance(x, Tensor):
            return x
        if is_datetime_like(x):
            raise TypeError(f"{name} holds calendar times: build the model with time_axis=TimeAxis('h') (or another unit)")
        return self._as_numbers(x, name)

    def _as_numbers(self, values, name: str) -> Tensor:
        """NumPy/pandas numbers (or a list of them) as a tensor of the model's dtype."""
        try:
            return torch.as_tensor(np.array(values, dtype=np.float64)).to(floating_dtype(self.covar_module))
        except (TypeError, ValueError):
            raise TypeError(f"{name} must be a torch.Tensor or an array of numbers, got {type(values).__name__}") from None

    def _task(self, train_x, train_y, noise, missing: str):
        """``(x, y, noise)`` of a task as tensors, with NaN targets left out if ``missing="drop"``."""
        if missing not in ("raise", "drop"):
            raise ValueError(f"missing must be 'raise' or 'drop', got {missing!r}")
        train_y = align_on_index(train_x, train_y)
        train_x = self._as_inputs(train_x, "train_x")
        if not isinstance(train_y, Tensor):
            train_y = self._as_numbers(train_y, "train_y")
        if isinstance(train_y, Tensor) and train_y.is_floating_point() and bool(torch.isnan(train_y).any()):
            if missing == "raise":
                raise ValueError(
                    "train_y contains NaN values: pass missing='drop' to leave those observations out of the task "
                    "(nothing is imputed), or remove them"
                )
            keep = ~torch.isnan(train_y)
            if train_x.dim() >= 1 and train_x.shape[0] == keep.shape[0] and keep.dim() == 1:
                train_x, train_y = train_x[keep], train_y[keep]
                if noise is not None and isinstance(noise, Tensor) and noise.shape == keep.shape:
                    noise = noise[keep]
            else:
                raise ValueError("missing='drop' needs un-batched targets (N,) matching train_x's first dimension")
        return train_x, train_y, noise

    # ------------------------------------------------------------------ the bound
    def _bound_and_posterior(self, x: Tensor, y: Tensor, noise: Tensor | None = None, mask: Tensor | None = None):
        """Online collapsed bound of absorbing ``(x, y)`` and the optimal ``q(v)`` in natural form;
        ``noise``: per-point noise variances ``(..., N)`` instead of the likelihood's; ``mask``: ``(..., N)``
        booleans, ``False`` for padding that contributes nothing (ragged tasks of batched streams)."""
        kernel, ivs = self.covar_module, self.inducing_variables
        chol = psd_safe_cholesky(to_working_dtype(to_dense(ivs.Kuu(kernel))))
        W = solve_lower(chol, to_working_dtype(ivs.Kuf(kernel, x)))
        noise = to_working_dtype(self._noise()[..., None] if noise is None else noise).expand(y.shape)  # σ_i²
        resid = to_working_dtype(y - self.mean_module(x))
        prior_variance = to_working_dtype(kernel(x, diag=True))
        residual = nystrom_residual(prior_variance, W, floating_dtype(kernel))  # diag(K_XX - Q_XX)
        captured = W.detach().square().sum(-2) / prior_variance.detach()  # diag(Q_XX) / diag(K_XX), for the monitor
        per_point = torch.log(2 * math.pi * noise) + (resid.square() + residual) / noise
        if mask is not None:  # a padded point: no column of W, no residual, no term of the bound
            observed = mask.to(W.dtype)
            W, resid, per_point = W * observed.unsqueeze(-2), resid * observed, per_point * observed
        precision = (W / noise.unsqueeze(-2)) @ W.mT
        shift = (W @ (resid / noise).unsqueeze(-1)).squeeze(-1)
        bound = -0.5 * per_point.sum(-1)
        if self.has_posterior:
            stored = self._stored_task()
            old = stored.inducing_variables
            _check_mean_unchanged(old, stored.mean_module, self.mean_module)
            old_chol, old_precision, old_shift, old_prior_mean = map(
                to_working_dtype, (stored.chol, stored.precision, stored.shift, stored.prior_mean)
            )
            old_mean_now = old.prior_mean(self.mean_module)
            delta = -old_prior_mean if old_mean_now is None else to_working_dtype(old_mean_now) - old_prior_mean  # μ_a - μ'_a
            old_b_chol = self._stored_b_chol()
            old_c = solve_lower(old_b_chol, old_shift.unsqueeze(-1)).squeeze(-1)
            if _unchanged_points(old, ivs, old_chol, chol, W):
                # b = a with the same Kuu: T = I, C = 0, no jitter to average; the update is Λ' + WWᵀ/σ²
                delta_w = solve_lower(chol, delta.unsqueeze(-1))  # L^{-1}(μ_a - μ'_a)
                precision = precision + old_precision
                shift = shift + old_shift - (old_precision @ delta_w).squeeze(-1)
                delta_w = delta_w.squeeze(-1)
                bound = (
                    bound
                    - 0.5 * (delta_w * (old_precision @ delta_w.unsqueeze(-1)).squeeze(-1)).sum(-1)
                    + (delta_w * old_shift).sum(-1)
                    + old_b_chol.diagonal(dim1=-2, dim2=-1).log().sum(-1)
                    - 0.5 * old_c.square().sum(-1)
                )
                return (*self._finish_bound(bound, precision, shift, chol, y.dtype), captured)
            R = solve_lower(chol, to_working_dtype(ivs.Kuu_cross(old, kernel)))  # L^{-1} K_ba
            # the stored ratio in the old variables' own coordinates z = a - μ'_a, averaged over their jitter
            old_kuu = to_working_dtype(to_dense(old.Kuu(kernel)))
            old_noise = old.unshared_jitter(ivs, old_kuu)
            ratio_precision, ratio_shift = _unwhiten_ratio(old_precision, old_shift, old_chol)
            ratio_precision, ratio_shift, smoothing = _smooth_ratio(ratio_precision, ratio_shift, old_noise)
            RP = R @ ratio_precision  # T Λ̃ Tᵀ = R P̃ Rᵀ with T = L^{-1} K_ba L'^{-T}
            precision = precision + RP @ R.mT
            precision_delta = (ratio_precision @ delta.unsqueeze(-1)).squeeze(-1)
            shift = shift + (R @ (ratio_shift - precision_delta).unsqueeze(-1)).squeeze(-1)
            # tr(P̃ cond) with cond = K_aa - Rᵀ R - diag(noise), the residual covariance of the old
            # variables' noise-free part given the new ones
            trace = (ratio_precision * old_kuu).sum((-2, -1)) - (RP * R).sum((-2, -1))
            trace = trace - (ratio_precision.diagonal(dim1=-2, dim2=-1) * old_noise).sum(-1)
            bound = (
                bound
                - 0.5 * trace
                - 0.5 * (delta * precision_delta).sum(-1)
                + (delta * ratio_shift).sum(-1)
                + old_b_chol.diagonal(dim1=-2, dim2=-1).log().sum(-1)
                - 0.5 * old_c.square().sum(-1)
                + smoothing
            )
        return (*self._finish_bound(bound, precision, shift, chol, y.dtype), captured)

    @staticmethod
    def _finish_bound(bound: Tensor, precision: Tensor, shift: Tensor, chol: Tensor, dtype: torch.dtype):
        """The bound's terms of the new ``q(v)``: ``-½ log|B| + ½ ηᵀB⁻¹η`` with ``B = I + precision``."""
        eye = torch.eye(precision.shape[-1], dtype=precision.dtype, device=precision.device)
        b_chol = psd_safe_cholesky(precision + eye)
        c = solve_lower(b_chol, shift.unsqueeze(-1)).squeeze(-1)
        bound = bound - b_chol.diagonal(dim1=-2, dim2=-1).log().sum(-1) + 0.5 * c.square().sum(-1)
        return bound.to(dtype), precision, shift, chol, b_chol

    def log_bound(self, train_x, train_y, noise: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
        """Collapsed online bound (the online ELBO of Bui et al. (2017), thesis eq. (4.6), at the optimal ``q(u)``) of
        absorbing ``(train_x, train_y)`` into the current summary, with the current hyperparameters (``noise``:
        per-point noise variances instead of the likelihood's, as in :meth:`update`). The state is not
        changed; differentiable with respect to the hyperparameters.

        :param train_x: the task's inputs ``(N, D)`` (or ``(N,)``), as in :meth:`update`.
        :param train_y: the task's targets ``(N,)``, all finite.
        :param noise: noise variances broadcasting to ``train_y``'s shape; ``None`` (default): the likelihood's.
        :param mask: for batched streams, booleans ``(S, N)`` (``False``: padding), as in :meth:`update`.
        :return: the bound (not divided by ``N``); ``(S,)`` for ``S`` batched streams.
        """
        if mask is not None:
            train_x, train_y, mask = self._masked_task(train_x, train_y, mask)
            if mask is None:
                raise ValueError("mask marks no observation: the bound of an empty task is not defined")
        train_x, train_y, noise = self._task(train_x, train_y, noise, "raise")
        train_x, train_y = _check_inputs(train_x, train_y, floating_dtype(self.covar_module), streams=self._num_streams())
        self.inducing_variables.check_inputs_within_support(train_x, "inputs of train_x")
        return self._bound_and_posterior(train_x, train_y, noise, mask)[0]

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

        :param train_x: inputs ``(N, D)`` (or ``(N,)``) of the new task only: a tensor, NumPy or pandas
            numbers, or calendar times (pandas ``DatetimeIndex``/``Series``, ``datetime64``, with or without a time
            zone) with ``time_axis``.
        :param train_y: targets ``(N,)`` (tensor, NumPy or pandas). A pandas ``train_y`` is aligned on the labels of
            ``train_x``'s rows (its index, or its values for a pandas ``Index`` as in ``update(series.index, series)``),
            as pandas aligns; other labels raise a ``ValueError`` (``train_y.to_numpy()`` pairs rows by position).
        :param missing: ``"raise"`` (default): NaN targets raise; ``"drop"``: they are left out of the task
            (nothing is imputed). A task with no observation left is a no-op that returns ``None``.
        :param num_iter: optimiser iterations on :math:`-\mathrm{bound} / N` over the hyperparameters of the kernel,
            likelihood, mean and (learnable) inducing variables by :func:`~gpytorch_hippo.fitting.fit_online_bound`
            (:attr:`last_fit` reports how the fit ended). A fit that raises restores the hyperparameters bit for bit and
            the error propagates, the task not absorbed; a fit undone for lowering the bound or moving a hyperparameter
            more than ``refit_max_change`` times issues a :class:`~gpytorch_hippo.fitting.RefitWarning`, and the task is
            absorbed at the hyperparameters it started from.
            ``0``: nothing is optimised, the update is a closed-form computation. ``None`` (default): the
            model's refit policy decides (``refit_every``; without one, ``0``).
        :param lr: Adam learning rate.
        :param mask: for a model of ``S`` batched streams (kernel, likelihood and inducing variables with
            ``batch_shape=(S,)``; ``train_x`` ``(S, N, D)``, ``train_y`` ``(S, N)``), booleans ``(S, N)``: ``False``
            marks padding of streams with fewer points in this task (its values are ignored, NaN allowed). A
            stream with no point keeps its stored posterior exactly, on the variables it was computed for (HiPPO bases
            with a clock per stream: whatever ``advance`` moved since; other variables: keep that stream's unchanged).
            NaN at an observed entry raises an error naming the stream.
        :param optimizer: ``"adam"`` (default; ``num_iter`` steps of rate ``lr``) or ``"lbfgs"`` (SciPy's
            L-BFGS-B through BoTorch's ``scipy_minimize``, at most ``num_iter`` iterations, stopping at
            convergence: the fit BoTorch's ``fit_gpytorch_mll`` does).
        :param progress: show a ``tqdm`` bar during optimisation.
        :param differentiable: store the summary as a differentiable function of ``train_x``,
            ``train_y`` and the hyperparameters (look-ahead acquisitions differentiate a fantasy
            model's predictions with respect to the candidate); such a model is copied with
            :func:`copy.deepcopy` only through a memo that shares those tensors. ``False`` (default):
            the summary is detached, the fast path for streaming.
        :param noise: noise variances of these observations, broadcasting to ``train_y``'s shape
            (BoTorch's ``condition_on_observations(..., noise=...)``), in place of the likelihood's
            for this task; ``None``: the likelihood's.
        :return: the collapsed online bound of this task at the final hyperparameters.
        """
        if mask is not None:
            train_x, train_y, mask = self._masked_task(train_x, train_y, mask)
            if mask is None:
                return None  # no stream has a point: the model is left as it was
        else:
            _check_streams_finite(train_y)
        train_x, train_y, noise = self._task(train_x, train_y, noise, missing)
        if train_y.numel() == 0 and train_x.numel() == 0:
            return None  # an empty task leaves the model as it was
        train_x, train_y = _check_inputs(train_x, train_y, floating_dtype(self.covar_module), streams=self._num_streams())
        self.inducing_variables.check_inputs_within_support(train_x, "inputs of train_x")
        fixed_mean = False
        if num_iter is None:
            num_iter, optimizer, fixed_mean = self._policy_fit(optimizer)
        if not isinstance(num_iter, int) or isinstance(num_iter, bool) or num_iter < 0:
            raise ValueError(f"num_iter must be a non-negative int, got {num_iter!r}")
        lr = check_finite_scalar(lr, "lr", positive=True)
        if optimizer not in ("adam", "lbfgs"):
            raise ValueError(f"optimizer must be 'adam' or 'lbfgs', got {optimizer!r}")
        if noise is not None:
            noise = check_tensor(noise, "noise", dtype=train_y.dtype)
            if not bool((noise > 0).all()):
                raise ValueError("noise must hold positive variances")
            try:
                noise = noise.expand(train_y.shape)
            except RuntimeError:
                raise ValueError(f"noise must broadcast to train_y's shape {tuple(train_y.shape)}, got {tuple(noise.shape)}") from None
        if (
            num_iter > 0 and not fixed_mean and any(p.requires_grad for p in self.mean_module.parameters()) and self._stored_mean_is_fixed()
        ):  # fail before optimising rather than at the first step that moves the mean
            raise ValueError(
                "num_iter > 0 would train the mean function after the first task, which the stored task's "
                f"{type(self.posterior_inducing_variables).__name__} (projections of f - m) cannot follow: "
                "call mean_module.requires_grad_(False) first, or use InducingPoints"
            )
        if num_iter > 0:  # a failed fit restores the hyperparameters and raises: the task is not absorbed
            self.last_fit = fit_online_bound(
                self, train_x, train_y, num_iter, optimizer, lr, noise, mask, fixed_mean, self.refit_max_change, progress
            )
        keep = (lambda tensor: tensor.clone()) if differentiable else (lambda tensor: tensor.detach().clone())
        with torch.set_grad_enabled(differentiable and torch.is_grad_enabled()):
            bound, precision, shift, chol, b_chol, captured = self._bound_and_posterior(train_x, train_y, noise, mask)
            _check_finite_result("the online update", bound, precision, shift)
            if self.captured_variance_monitor is not None:
                self.captured_variance_monitor.observe(self, train_x, chol.detach(), captured, mask)
            prior_mean = self.inducing_variables.prior_mean(self.mean_module)
            if prior_mean is None:
                prior_mean = torch.zeros(shift.shape, dtype=shift.dtype, device=shift.device)
            else:
                prior_mean = to_working_dtype(prior_mean)
            summary: tuple[Tensor, ...] = (chol, precision, shift, prior_mean.expand(shift.shape), b_chol)
            if mask is not None and self.has_posterior and not bool(mask.any(-1).all()):
                summary = _keep_streams_without_points(mask.any(-1), summary, (*self._summary(), self._stored_b_chol()))
            chol, precision, shift, prior_mean, b_chol = map(keep, summary)
            self.posterior_chol, self.posterior_precision, self.posterior_shift, self.posterior_prior_mean = (
                chol,
                precision,
                shift,
                prior_mean,
            )
            self._remember_b_chol(precision, b_chol)
        with torch.no_grad():
            stored, self.posterior_inducing_variables = self.posterior_inducing_variables, frozen_copy(self.inducing_variables)
            keep_streams = getattr(self.posterior_inducing_variables, "keep_streams", None)
            if mask is not None and stored is not None and keep_streams is not None:  # streams without points: their stored sets
                keep_streams(stored, ~mask.any(-1))
            self.posterior_mean_module = frozen_copy(self.mean_module)
            self.num_tasks += 1
        self.last_bound = bound.detach()
        return self.last_bound

    def _policy_fit(self, optimizer: str) -> tuple[int, str, bool]:
        """``(num_iter, optimizer, fixed_mean)`` of the next task under the refit policy."""
        if self.refit_every is None or int(self.num_tasks) % self.refit_every != 0:
            return 0, optimizer, False
        fixed_mean = self._stored_mean_is_fixed()
        return self.refit_iter, self.refit_optimizer, fixed_mean

    @overload
    def _stored_task(self, required: Literal[True] = ...) -> _StoredTask: ...

    @overload
    def _stored_task(self, required: bool) -> _StoredTask | None: ...

    def _stored_task(self, required: bool = True) -> _StoredTask | None:
        """The stored task; before the first one a ``RuntimeError`` (``required``) or ``None``. A task stored in part
        (a checkpoint without some of its tensors, which torch cannot report missing on a fresh model) raises."""
        ivs, mean = self.posterior_inducing_variables, self.posterior_mean_module
        chol, precision, shift, prior_mean = self.posterior_chol, self.posterior_precision, self.posterior_shift, self.posterior_prior_mean
        parts = (ivs, mean, chol, precision, shift, prior_mean)
        if all(part is None for part in parts):
            if required:
                raise RuntimeError("no task has been absorbed yet: call update(train_x, train_y) first")
            return None
        if ivs is None or mean is None or chol is None or precision is None or shift is None or prior_mean is None:
            raise RuntimeError("the model holds only a part of the stored task: load a complete state_dict")
        return _StoredTask(ivs, mean, chol, precision, shift, prior_mean)

    def _summary(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(L', Λ', η', μ'_a)`` of the stored task."""
        stored = self._stored_task()
        return stored.chol, stored.precision, stored.shift, stored.prior_mean

    def _stored_mean_is_fixed(self) -> bool:
        """Whether a task is stored whose inducing variables project :math:`f - m` (interdomain), which a change of
        the mean function would invalidate."""
        return self.posterior_inducing_variables is not None and self.posterior_inducing_variables.prior_mean(self.mean_module) is None

    def _masked_task(self, train_x, train_y, mask) -> tuple[Tensor, Tensor, Tensor | None]:
        """A ragged task of batched streams: padding filled with finite values that contribute nothing
        (``mask=None`` back if no stream has a point); NaN at an observed entry names its stream."""
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            raise TypeError(f"mask must be a bool tensor, got {getattr(mask, 'dtype', type(mask).__name__)}")
        train_x, train_y = self._as_inputs(train_x, "train_x"), check_tensor(train_y, "train_y", finite=False)
        if train_x.dim() == train_y.dim():
            train_x = train_x.unsqueeze(-1)
        if mask.shape != train_y.shape or train_x.shape[:-1] != train_y.shape:
            raise ValueError(
                f"mask must have train_y's shape {tuple(train_y.shape)} and train_x the shape (..., N, D) to match, "
                f"got mask {tuple(mask.shape)}, train_x {tuple(train_x.shape)}"
            )
        _check_streams_finite(torch.where(mask, train_y, 0.0), "at observed entries")
        _check_streams_finite(torch.where(mask.unsqueeze(-1), train_x, 0.0).sum(-1), "at observed entries", "train_x")
        if not bool(mask.any()):
            return train_x, train_y, None
        # padding takes an observed input of its own stream (finite and within that stream's reach; multiplied by
        # zero); a stream without points takes its support's end if its variables have one (it is kept as it was)
        fill = train_x[mask][0].expand(train_x.shape[:-2] + train_x.shape[-1:]).clone()
        supports = getattr(self.inducing_variables, "stream_supports", lambda: None)()
        if supports is not None and train_x.dim() == 3 and train_x.shape[-1] == 1:
            fill[:, 0] = supports[:, 1].to(fill)
        first = mask.to(torch.int8).argmax(-1, keepdim=True)  # (..., 1): the first observed point of each stream
        own = torch.gather(train_x, -2, first.unsqueeze(-1).expand(*first.shape, train_x.shape[-1])).squeeze(-2)
        fill = torch.where(mask.any(-1, keepdim=True), own, fill)
        train_x = torch.where(mask.unsqueeze(-1), train_x, fill.unsqueeze(-2))
        return train_x, torch.where(mask, train_y, torch.zeros((), dtype=train_y.dtype)), mask

    # ------------------------------------------------------------------ posterior
    def _stored_b_chol(self) -> Tensor:
        """``chol(B') = chol(I + Λ')`` of the stored summary, kept from the update that stored ``Λ'`` for as long as
        that very tensor is unchanged (its identity, storage and version counter: a reload, ``.to``, an assignment or an
        in-place change of ``posterior_precision`` recomputes it)."""
        stored = self._stored_task().precision
        cached = self._b_chol_cache
        if cached is not None and cached[0] is stored and cached[1] == (tensor_version(stored), stored.data_ptr()):
            return cached[2]
        precision = to_working_dtype(stored)
        b_chol = psd_safe_cholesky(precision + torch.eye(precision.shape[-1], dtype=precision.dtype, device=precision.device))
        self._remember_b_chol(stored, b_chol)
        return b_chol

    def _remember_b_chol(self, precision: Tensor, b_chol: Tensor) -> None:
        """Keep ``chol(I + Λ')`` for the stored ``Λ'``, ``precision`` (not for a differentiable summary: its graph is the
        user's)."""
        self._b_chol_cache = None if b_chol.requires_grad else (precision, (tensor_version(precision), precision.data_ptr()), b_chol)

    def _whitened_posterior(self) -> tuple[Tensor, Tensor]:
        """``(mean, chol(B))`` of the stored ``q(v) = N(B^{-1} η', B^{-1})``."""
        shift = to_working_dtype(self._stored_task().shift)
        b_chol = self._stored_b_chol()
        mean = torch.cholesky_solve(shift.unsqueeze(-1), b_chol).squeeze(-1)
        return mean, b_chol

    def inducing_posterior(self) -> MultivariateNormal:
        r"""The stored :math:`q(u) = \mathcal{N}(\mu_u + L' m_v, L' B^{-1} L'^T)` over :attr:`posterior_inducing_variables`."""
        stored = self._stored_task()
        mean_v, b_chol = self._whitened_posterior()
        chol = to_working_dtype(stored.chol)
        factor = chol @ solve_lower(b_chol, torch.eye(b_chol.shape[-1], dtype=b_chol.dtype, device=b_chol.device)).mT
        mean = to_working_dtype(stored.prior_mean) + (chol @ mean_v.unsqueeze(-1)).squeeze(-1)
        return MultivariateNormal(mean, factor @ factor.mT)

    def forward(self, x) -> MultivariateNormal:
        r"""Latent :math:`q(f(x)) = \int p(f(x) \mid u)\, q(u)\, \mathrm{d}u` (thesis eq. (2.36) with the optimal :math:`q(u)`);
        ``x`` as in :meth:`update`.

        :param x: test inputs ``(N, D)`` (or ``(N,)``; ``(S, N, D)`` for batched streams): numbers, or calendar times
            with ``time_axis``.
        """
        x = check_tensor(self._as_inputs(x, "x"), "x", dtype=floating_dtype(self.covar_module), min_dim=1)
        if x.dim() == 1:
            x = x.unsqueeze(-1)
        kernel = self.covar_module
        prior_mean = self.mean_module(x)
        prior_covar = kernel(x)
        if not self.has_posterior:
            return MultivariateNormal(prior_mean, prior_covar)
        stored = self._stored_task()
        ivs = stored.inducing_variables
        _check_mean_unchanged(ivs, stored.mean_module, self.mean_module)
        chol_now, mean_w, middle = self._prediction_factors(kernel, ivs)
        W = solve_lower(chol_now, to_working_dtype(ivs.Kuf(kernel, x)))
        mean = prior_mean + (W.mT @ mean_w.unsqueeze(-1)).squeeze(-1).to(prior_mean.dtype)
        nystrom_residual(to_working_dtype(kernel(x, diag=True)), W, floating_dtype(kernel))  # warns if Kuu and Kuf disagree
        left, right = W.mT.to(mean.dtype), (middle @ W).to(mean.dtype)
        if x.shape[-2] > DENSE_PREDICTION_POINTS:  # kept as a product, so variances at N points cost O(N M)
            return MultivariateNormal(mean, prior_covar + MatmulLinearOperator(left, right))
        return MultivariateNormal(mean, DenseLinearOperator(to_dense(prior_covar) + left @ right))

    def _prediction_factors(self, kernel: gpytorch.kernels.Kernel, ivs: InducingVariables) -> tuple[Tensor, Tensor, Tensor]:
        """The factors of :meth:`forward` that do not depend on ``x``: ``L = chol(K_uu)``, the whitened mean
        ``m_w = L^{-1}(μ' - μ) + G m_v`` and ``C = G B^{-1} G^T - I`` with ``G = L^{-1} L'``, so that
        ``q(f(x)) = N(m(x) + W^T m_w, K_xx + W^T C W)``, ``W = L^{-1} K_uf``.

        In eval mode they are computed once per state, as GPyTorch's exact GPs cache their test-time solves
        (detached under ``gpytorch.settings.detach_test_caches``, GPyTorch's default): the cache is keyed by
        the kernel, mean, inducing variables and stored posterior, object and values, so any change to them
        (an optimiser step, ``load_state_dict``, an update) recomputes the factors. A differentiable
        conditioning (BoTorch's fantasies) and ``detach_test_caches(False)`` with gradients enabled are never
        served from the cache."""
        stored = self._stored_task()
        posterior = [stored.precision, stored.shift, stored.chol, stored.prior_mean]
        cacheable = (
            not self.training
            and not any(t.requires_grad for t in posterior)
            and (not torch.is_grad_enabled() or gpytorch.settings.detach_test_caches.on())
        )
        key: tuple[list[int], list[Tensor]] | None = None
        if cacheable:
            modules = (kernel, self.mean_module, ivs)
            tensors = [t for m in modules for t in itertools.chain(m.parameters(), m.buffers())] + posterior
            key = ([id(m) for m in modules], [t.detach() for t in tensors])
            if self._prediction_cache is not None and _same_key(self._prediction_cache[0], key):
                return self._prediction_cache[1]
        chol_now = psd_safe_cholesky(to_working_dtype(to_dense(ivs.Kuu(kernel))))
        # q(b) was stored whitened by the Cholesky factor L' of the hyperparameters of its task;
        # G = L_now^{-1} L' maps it to the current whitening (identity if nothing changed).
        G = solve_lower(chol_now, to_working_dtype(stored.chol))
        mean_v, b_chol = self._whitened_posterior()
        mean_now = ivs.prior_mean(self.mean_module)
        offset = to_working_dtype(stored.prior_mean)
        offset = offset if mean_now is None else offset - to_working_dtype(mean_now)
        mean_w = solve_lower(chol_now, offset.unsqueeze(-1)).squeeze(-1) + (G @ mean_v.unsqueeze(-1)).squeeze(-1)
        V = solve_lower(b_chol, G.mT)
        middle = V.mT @ V - torch.eye(V.shape[-1], dtype=V.dtype, device=V.device)
        factors = (chol_now, mean_w, middle)
        if key is not None:
            factors = (chol_now.detach(), mean_w.detach(), middle.detach())
            self._prediction_cache = (([*key[0]], [t.clone() for t in key[1]]), factors)
        return factors


def _same_key(old: tuple, new: tuple) -> bool:
    """Whether two keys of :meth:`OnlineSGPR._prediction_factors` are the same objects with the same values."""
    (old_ids, old_tensors), (new_ids, new_tensors) = old, new
    return (
        old_ids == new_ids
        and len(old_tensors) == len(new_tensors)
        and all(
            a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and torch.equal(a, b)
            for a, b in zip(old_tensors, new_tensors)
        )
    )


class OnlineELBO(ApproximateMarginalLogLikelihood):
    r"""Online ELBO of Bui et al. (2017) for any likelihood (thesis eq. (4.6)).

    .. math::
        \mathcal L^o = \sum_i \mathbb{E}_{q(f_i)}[\log p(y_i \mid f_i)]
            + \mathrm{KL}(\tilde q(a) \| p_{old}(a)) - \mathrm{KL}(\tilde q(a) \| q_{old}(a)) - \mathrm{KL}(q(b) \| p(b)),

    with :math:`\tilde q(a) = \int p(a \mid b)\, q(b)\, \mathrm{d}b`. The two :math:`a` terms are evaluated together as
    :math:`\mathbb{E}_{\tilde q}[\log q_{old}(a) - \log p_{old}(a)]` (the entropy of :math:`\tilde q` cancels, so
    a singular :math:`\tilde q` -- e.g. :math:`a = b` -- is harmless); where the new variables do not share
    the old ones' jitter, :math:`\log q_{old}/p_{old}` is averaged over that jitter noise as in
    :class:`OnlineSGPR` (:func:`_smooth_ratio`). Like GPyTorch's ``VariationalELBO``
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
        ivs, mean_module = self.old_inducing_variables, self.old_mean_module
        mean, covar_chol, prior_chol, prior_mean = self.old_mean, self.old_covar_chol, self.old_prior_chol, self.old_prior_mean
        if ivs is None and mean_module is None and mean is None and covar_chol is None and prior_chol is None and prior_mean is None:
            return None
        if ivs is None or mean_module is None or mean is None or covar_chol is None or prior_chol is None or prior_mean is None:
            raise RuntimeError(
                "the ELBO holds only a part of the old task (say, q(a) without its inducing variables): load a complete state_dict"
            )
        return _OldTask(ivs, mean_module, mean, covar_chol, prior_chol, prior_mean)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        # The old task exists only after end_task: allocate it so that a fresh ELBO loads a saved one.
        for name in _OLD_TASK_BUFFERS:
            key = prefix + name
            if key in state_dict and getattr(self, name) is None:
                setattr(self, name, torch.empty_like(state_dict[key]))
        strategy = self._interdomain_strategy()
        for name, template in (("old_inducing_variables", strategy.inducing_variables), ("old_mean_module", self._mean_module)):
            if getattr(self, name) is None and prefix + "old_mean" in state_dict:
                setattr(self, name, _frozen_copy_to_load(template, state_dict, f"{prefix}{name}."))
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
        :math:`r = q_{old} / p_{old}` averaged over the old variables' unshared jitter noise (:func:`_smooth_ratio`), for the
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
        precision, shift = _unwhiten_ratio(precision, shift, prior_chol)  # in z = g - μ'_a
        precision, shift, smoothing = _smooth_ratio(precision, shift, noise)
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
        _check_mean_unchanged(old.inducing_variables, old.mean_module, self._mean_module)
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
