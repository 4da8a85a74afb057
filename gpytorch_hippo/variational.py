r"""One variational strategy for every kind of inducing variable (thesis §4.2.1 and §2.3.2):
:math:`q(f) = \int p(f \mid u)\, q(u)\, \mathrm{d}u` with :math:`q(u) = \mathcal{N}(m, S)` (Titsias (2009), Hensman et al. (2013)).

The strategy holds the GPyTorch hooks; the algebra lives in the functions below it, in the whitened coordinates
:math:`v = L^{-1}(u - \mu_u)` with :math:`L = \operatorname{chol}(K_{uu})`, and the eval-mode caches are guarded by a
fingerprint of what they were computed from (a cache never outlives what it depends on).
"""

from __future__ import annotations

import contextlib
import copy
import itertools
from collections.abc import Callable, Iterable

import gpytorch
import torch
from gpytorch.distributions import Delta, MultivariateNormal
from gpytorch.utils.errors import CachingError
from gpytorch.utils.memoize import cached, clear_cache_hook, pop_from_cache
from linear_operator import to_dense
from linear_operator.operators import (
    CholLinearOperator,
    DiagLinearOperator,
    LinearOperator,
    MatmulLinearOperator,
    TriangularLinearOperator,
)
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor

from probseq._compat import VariationalDistributionBase, VariationalStrategyBase, cholesky_dtype, without_memoized_values

from .inducing.base import InducingVariables
from .inducing.points import InducingPoints
from .nystrom import nystrom_residual

__all__ = ["InterdomainVariationalStrategy"]


def solve_lower(chol: Tensor, rhs: Tensor) -> Tensor:
    r""":math:`L^{-1} R` for a lower-triangular :math:`L` (``chol``), computed in ``chol``'s dtype and cast back.

    :param chol: the lower-triangular factor :math:`L`, ``(..., M, M)``.
    :param rhs: the right-hand side :math:`R`, ``(..., M, N)`` (batch dimensions broadcast); the result has its dtype.
    """
    return torch.linalg.solve_triangular(chol, rhs.to(chol.dtype), upper=False).to(rhs.dtype)


def _watched_tensors(strategy: InterdomainVariationalStrategy) -> list[Tensor]:
    """Every parameter and buffer of ``strategy`` (its inducing variables and :math:`q(u)`), its kernel and the model's
    mean: what the eval-mode caches depend on."""
    modules = (strategy, strategy.kernel, strategy.mean_module)
    return [tensor for module in modules if module is not None for tensor in itertools.chain(module.parameters(), module.buffers())]


def _fingerprint(tensors: Iterable[Tensor]) -> list[Tensor]:
    """Detached copies of ``tensors``, to tell later whether any of them changed (:func:`_fingerprint_matches`)."""
    return [tensor.detach().clone() for tensor in tensors]


def _fingerprint_matches(recorded: list[Tensor] | None, tensors: list[Tensor]) -> bool:
    """Whether ``recorded`` (:func:`_fingerprint`) still describes ``tensors``: same values, shapes, dtypes and devices
    (``torch.equal`` alone calls float32 and float64 copies equal, and raises across devices)."""
    return (
        recorded is not None
        and len(recorded) == len(tensors)
        and all(
            a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and torch.equal(a, b.detach())
            for a, b in zip(recorded, tensors)
        )
    )


def whitened_moments(
    chol: Tensor, mean: Tensor, covar: LinearOperator | None, prior_mean: Tensor | None, whitened: bool
) -> tuple[Tensor, Tensor | None]:
    r"""The mean :math:`m_v` and a root :math:`R_v` (``None`` for a point mass) of :math:`q(v)`, :math:`v = L^{-1}(u - \mu_u)`, from
    the variational distribution's mean and covariance: as they are when ``whitened`` (it is over :math:`v`), else
    :math:`m_v = L^{-1}(m - \mu_u)` and :math:`R_v = L^{-1} R` with :math:`S = R R^\top`.

    :param chol: :math:`L`, the lower Cholesky factor of :math:`K_{uu}`, ``(..., M, M)``.
    :param mean: the variational mean (:math:`m`, or :math:`m_v` when ``whitened``), ``(..., M)``.
    :param covar: the variational covariance (:math:`S`, or :math:`R_v R_v^\top` when ``whitened``); ``None``: a point
        mass.
    :param prior_mean: :math:`\mu_u`, ``(..., M)``; ``None``: zero.
    :param whitened: whether ``mean`` and ``covar`` are over :math:`v` already.
    """
    if whitened:
        return mean, None if covar is None else to_dense(covar.root_decomposition().root)
    if prior_mean is not None:
        mean = mean - prior_mean
    mean_v = solve_lower(chol, mean.unsqueeze(-1)).squeeze(-1)
    return mean_v, None if covar is None else solve_lower(chol, to_dense(covar.root_decomposition().root))


def conditional(
    prior_mean: Tensor, prior_covar: LinearOperator, W: Tensor, mean_v: Tensor, root_v: Tensor | None, jitter: float
) -> MultivariateNormal:
    r""":math:`\int p(f \mid u)\, q(u)\, \mathrm{d}u` for targets :math:`f` with prior :math:`\mathcal{N}(\mu_f, K_{ff})` and
    :math:`W = L^{-1} \operatorname{cov}(u, f)` (thesis eq. (2.36)), for :math:`q(v) = \mathcal{N}(m_v, R_v R_v^\top)`
    (:func:`whitened_moments`; ``root_v=None`` for a point mass):

    .. math::
        q(f) = \mathcal{N}\big(\mu_f + W^\top m_v,\; K_{ff} + \mathrm{jitter}\, I + W^\top (R_v R_v^\top - I) W\big).

    The covariance stays lazy (prior plus low rank): reading its diagonal costs :math:`O(N M^2)`, while samples and
    GPyTorch's multitask wrappers see the correlations. A negative Nyström residual warns (:func:`nystrom_residual`).

    :param prior_mean: :math:`\mu_f`, ``(..., N)``.
    :param prior_covar: :math:`K_{ff}`, ``(..., N, N)``.
    :param W: :math:`L^{-1} \operatorname{cov}(u, f)`, ``(..., M, N)``.
    :param mean_v: :math:`m_v`, ``(..., M)``.
    :param root_v: :math:`R_v`, ``(..., M, R)``; ``None``: a point mass at :math:`m_v`.
    :param jitter: added to the diagonal of :math:`K_{ff}` (``0``: none).
    """
    mean = prior_mean + (W.mT @ mean_v.unsqueeze(-1)).squeeze(-1)
    nystrom_residual(prior_covar.diagonal(dim1=-2, dim2=-1), W)  # warns if Kuu and Kuf are inconsistent
    eye = torch.eye(W.shape[-2], dtype=W.dtype, device=W.device)
    middle = -eye if root_v is None else root_v @ root_v.mT - eye
    covar = prior_covar.add_jitter(jitter) if jitter > 0 else prior_covar
    covar = covar + MatmulLinearOperator(W.mT, middle @ W)
    if gpytorch.settings.trace_mode.on():
        covar = covar.to_dense()
    return MultivariateNormal(mean, covar)


def unwhiten(chol: Tensor, q_v: MultivariateNormal, prior_mean: Tensor | None) -> MultivariateNormal:
    r""":math:`q(u)` for :math:`u = \mu_u + L v`: :math:`\mathcal{N}(\mu_u + L m_v,\; L R_v R_v^\top L^\top)` with a dense covariance.

    :param chol: :math:`L`, the lower Cholesky factor of :math:`K_{uu}`, ``(..., M, M)``.
    :param q_v: :math:`q(v) = \mathcal{N}(m_v, R_v R_v^\top)`.
    :param prior_mean: :math:`\mu_u`, ``(..., M)``; ``None``: zero.
    """
    mean = (chol.to(q_v.mean.dtype) @ q_v.mean.unsqueeze(-1)).squeeze(-1)
    if prior_mean is not None:
        mean = mean + prior_mean
    root = to_dense(q_v.lazy_covariance_matrix.root_decomposition().root)
    root = chol.to(root.dtype) @ root
    return MultivariateNormal(mean, root @ root.mT)


def whiten(chol: Tensor, q_u: MultivariateNormal, prior_mean: Tensor | None) -> tuple[Tensor, Tensor]:
    r"""The mean :math:`L^{-1}(m - \mu_u)` and covariance :math:`L^{-1} S L^{-\top}` of :math:`v = L^{-1}(u - \mu_u)` for
    :math:`q(u) = \mathcal{N}(m, S)` (the inverse of :func:`unwhiten`).

    :param chol: :math:`L`, the lower Cholesky factor of :math:`K_{uu}`, ``(..., M, M)``.
    :param q_u: :math:`q(u) = \mathcal{N}(m, S)`.
    :param prior_mean: :math:`\mu_u`, ``(..., M)``; ``None``: zero.
    """
    mean, covar = q_u.mean, to_dense(q_u.lazy_covariance_matrix)
    chol = chol.to(mean.dtype)
    mean = mean if prior_mean is None else mean - prior_mean
    return solve_lower(chol, mean.unsqueeze(-1)).squeeze(-1), solve_lower(chol, solve_lower(chol, covar).mT)


def _initialize_exactly(distribution: VariationalDistributionBase, mean: Tensor, covar: Tensor) -> None:
    """Set a GPyTorch variational distribution to :math:`\\mathcal{N}(\\text{mean}, \\text{covar})` exactly: without the
    random jitter its ``initialize_variational_distribution`` adds to the mean (``covar`` is symmetrised)."""
    mean_init_std = distribution.mean_init_std
    distribution.mean_init_std = 0.0
    try:
        distribution.initialize_variational_distribution(MultivariateNormal(mean, (covar + covar.mT) / 2))
    finally:
        distribution.mean_init_std = mean_init_std


def _input_locations(inducing_variables: InducingVariables, q: VariationalDistributionBase) -> Tensor:
    """The inputs ``Z`` of :class:`~gpytorch_hippo.inducing.InducingPoints` (the live tensor); for interdomain inducing
    variables, which have none, an empty ``(*batch, M, 0)`` tensor of ``q``'s dtype and device."""
    points = getattr(inducing_variables, "points", None)
    if isinstance(points, Tensor):
        return points
    return torch.empty(*q.batch_shape, inducing_variables.num_inducing, 0, dtype=q.dtype, device=q.device)


def _load_gpytorch_checkpoint(strategy, state_dict, prefix, *args) -> None:
    """A load pre-hook: a checkpoint of GPyTorch's ``VariationalStrategy`` / ``UnwhitenedVariationalStrategy`` (built
    with the same ``whitened``) loads into a strategy over :class:`~gpytorch_hippo.inducing.InducingPoints`: its
    ``inducing_points`` become theirs, and it has no online bookkeeping."""
    if prefix + "inducing_points" not in state_dict or not isinstance(strategy.inducing_variables, InducingPoints):
        return
    state_dict[prefix + "inducing_variables.points"] = state_dict.pop(prefix + "inducing_points")
    updated = state_dict.pop(prefix + "updated_strategy", None)
    if updated is not None and not bool(updated):
        raise RuntimeError(
            "this VariationalStrategy checkpoint predates GPyTorch's current whitening (updated_strategy=False): "
            "load it into gpytorch.variational.VariationalStrategy once and save it again"
        )
    state_dict.setdefault(prefix + "online_task_ended", strategy.online_task_ended.clone())


def _moved_copy(inducing_variables: InducingVariables, move: Callable[[InducingVariables], None]) -> InducingVariables:
    """A copy of ``inducing_variables`` moved by ``move``, owned by no strategy (the originals stay as they are)."""
    moved = copy.deepcopy(inducing_variables)
    moved.variational_owner = None
    move(moved)
    return moved


def _move_owned(inducing_variables: InducingVariables, move: Callable[[InducingVariables], None], owner: str) -> None:
    """``move(inducing_variables)`` in place, released by their strategy ``owner`` meanwhile (inducing variables
    refuse to move while a strategy owns them)."""
    inducing_variables.variational_owner = None
    try:
        move(inducing_variables)
    finally:
        inducing_variables.variational_owner = owner


def _no_fantasy_error(inducing_variables: InducingVariables) -> NotImplementedError:
    """The error of GPyTorch's fantasy models for inducing variables without input locations."""
    return NotImplementedError(
        f"GPyTorch's fantasy models condition an exact GP on pseudo-observations at input locations, which "
        f"{type(inducing_variables).__name__} do not have: condition them online with "
        "gpytorch_hippo.OnlineSGPR / OnlineELBO, or gpytorch_hippo.botorch.OnlineGPModel.condition_on_observations"
    )


def _resized(distribution: VariationalDistributionBase, num_inducing: int) -> VariationalDistributionBase:
    """``distribution`` if it has ``num_inducing`` variables, else a fresh one of its class, batch shape,
    ``mean_init_std``, dtype and device."""
    if distribution.shape()[-1] == num_inducing:
        return distribution
    reference = next(itertools.chain(distribution.parameters(), distribution.buffers()), None)
    fresh = type(distribution)(num_inducing, batch_shape=distribution.batch_shape, mean_init_std=distribution.mean_init_std)
    return fresh if reference is None else fresh.to(reference)


def _check_inducing_variables(inducing_variables) -> None:
    if not isinstance(inducing_variables, InducingVariables):
        raise TypeError(
            f"inducing_variables must be an InducingVariables instance (e.g. InducingPoints), got {type(inducing_variables).__name__}"
        )


def _check_sizes(distribution: VariationalDistributionBase, inducing_variables: InducingVariables) -> None:
    num_q = distribution.shape()[-1]
    if num_q != inducing_variables.num_inducing:
        raise RuntimeError(
            f"the variational distribution has size {num_q} but inducing_variables has num_inducing="
            f"{inducing_variables.num_inducing}: change their number with "
            "variational_strategy.replace_inducing_variables(new), which resizes and carries q(u)"
        )


def _check_arguments(inducing_variables, variational_distribution, kernel) -> None:
    _check_inducing_variables(inducing_variables)
    if not isinstance(variational_distribution, VariationalDistributionBase):
        raise TypeError(
            f"variational_distribution must be a gpytorch variational distribution, got {type(variational_distribution).__name__}"
        )
    if kernel is not None and not isinstance(kernel, gpytorch.kernels.Kernel):
        raise TypeError(f"kernel must be a gpytorch Kernel or None, got {type(kernel).__name__}")
    num_q = variational_distribution.shape()[-1]
    if num_q != inducing_variables.num_inducing:
        raise ValueError(
            f"variational_distribution has size {num_q} but inducing_variables has num_inducing={inducing_variables.num_inducing}"
        )


class InterdomainVariationalStrategy(VariationalStrategyBase):
    r"""Sparse variational GP with arbitrary (interdomain) inducing variables.

    For inducing variables :math:`u` with :math:`q(u) = \mathcal{N}(m_u, S_u)` the approximate posterior at inputs
    :math:`X` is (thesis eq. (2.36), with :math:`K_{ZZ}, K_{XZ}` replaced by the interdomain
    :math:`K_{uu}, K_{fu}` of §4.2.1)

    .. math::
        q(f_X) = \mathcal{N}\big(m(X) + K_{Xu} K_{uu}^{-1} (m_u - \mu_u),\;
                 K_{XX} + K_{Xu} K_{uu}^{-1} (S_u - K_{uu}) K_{uu}^{-1} K_{uX}\big),

    computed as :math:`W = L^{-1} K_{uX}` with :math:`L = \operatorname{chol}(K_{uu})`. With
    ``whitened=True`` the variational distribution is over :math:`v = L^{-1}(u - \mu_u)` and the prior is
    :math:`\mathcal{N}(0, I)`; with ``whitened=False`` it is over :math:`u` itself and the prior is
    :math:`\mathcal{N}(\mu_u, K_{uu})`. The ELBO's KL term is :math:`\mathrm{KL}(q \| \mathrm{prior})` (thesis eq. (2.38)).

    With :class:`~gpytorch_hippo.inducing.InducingPoints` this is exactly GPyTorch's
    ``VariationalStrategy`` (``whitened=True``) or ``UnwhitenedVariationalStrategy``
    (``whitened=False``): same mean, covariance, KL and jitter (``Kuu`` jitter from the inducing
    variables' policy; the whitened form also adds it to the data covariance, as GPyTorch does), and
    their checkpoints load into it.

    :param model: the ``ApproximateGP`` that owns this strategy. It is not registered as a
        submodule. ``model.forward(x)`` gives the prior :math:`p(f(x))` (mean and covariance at data).
    :param inducing_variables: any :class:`~gpytorch_hippo.inducing.InducingVariables`.
    :param variational_distribution: a GPyTorch variational distribution of size :math:`M`
        (Cholesky, mean-field, natural, delta, with batch shapes).
    :param whitened: whiten :math:`q(u)` with :math:`\operatorname{chol}(K_{uu})` (default) or not.
    :param kernel: kernel used for :math:`K_{uu}` and :math:`K_{uX}`. Default: ``model.covar_module``
        (read at every call, so it always matches the model's prior). If given explicitly it is
        registered as a submodule; it must be the kernel ``model.forward`` uses.

    The eval-mode caches (:math:`\operatorname{chol}(K_{uu})`, :math:`q(u)`, the prior) are dropped whenever the strategy
    enters train mode, and also in eval mode whenever any parameter or buffer of the kernel, the
    mean, the inducing variables or the variational distribution changed value since they were
    filled (e.g. after ``load_state_dict`` or setting a lengthscale).
    """

    _variational_distribution: VariationalDistributionBase  # set by GPyTorch's constructor

    def __init__(
        self,
        model: gpytorch.models.ApproximateGP,
        inducing_variables: InducingVariables,
        variational_distribution: VariationalDistributionBase,
        whitened: bool = True,
        kernel: gpytorch.kernels.Kernel | None = None,
    ):
        _check_arguments(inducing_variables, variational_distribution, kernel)
        # GPyTorch's constructor holds the model, the variational distribution and its initialisation flag, and
        # registers a copy of the inducing inputs (the `inducing_points` property, which reads them live, has nothing
        # to read yet); the copy is removed: the inputs belong to the inducing variables, and interdomain ones have none.
        points = _input_locations(inducing_variables, variational_distribution)
        super().__init__(model, points, variational_distribution, learn_inducing_locations=False)
        del self.inducing_points
        self.inducing_variables = inducing_variables
        # set by OnlineELBO.end_task, cleared by advance: an attached OnlineELBO must store the
        # finished task before the inducing variables move (see advance)
        self.register_buffer("online_task_ended", torch.tensor(False))
        self.online_objective = False  # whether an OnlineELBO uses this strategy (set by OnlineELBO)
        self.whitened = bool(whitened)
        self._explicit_kernel = kernel
        self._cache_fingerprint: list[Tensor] | None = None
        self.register_load_state_dict_pre_hook(_load_gpytorch_checkpoint)
        inducing_variables.variational_owner = type(self).__name__

    @property
    def kernel(self) -> gpytorch.kernels.Kernel:
        """The kernel ``k`` of the prior: the explicit ``kernel`` argument or ``model.covar_module``."""
        if self._explicit_kernel is not None:
            return self._explicit_kernel
        kernel = getattr(self.model, "covar_module", None)
        if not isinstance(kernel, gpytorch.kernels.Kernel):
            # (not AttributeError: nn.Module.__getattr__ would swallow it and hide this message)
            raise TypeError(
                "InterdomainVariationalStrategy needs the prior kernel: give the model a `covar_module` "
                "attribute or pass kernel= to the strategy"
            )
        return kernel

    @property
    def mean_module(self) -> gpytorch.means.Mean | None:
        """``model.mean_module`` if it exists (used for the unwhitened prior mean of ``u``)."""
        mean = getattr(self.model, "mean_module", None)
        return mean if isinstance(mean, gpytorch.means.Mean) else None

    @property
    def inducing_points(self) -> Tensor:
        """GPyTorch's attribute, read by its wrappers (``LMCVariationalStrategy`` takes its dtype): the live inputs of
        point inducing variables, an empty ``(*batch, M, 0)`` tensor for interdomain ones."""
        return _input_locations(self.inducing_variables, self._variational_distribution)

    @property
    def jitter_val(self) -> float:
        """The jitter of :math:`K_{uu}`, from the inducing variables' policy (relative for HiPPO ones)."""
        return self.inducing_variables.jitter_value(self._variational_distribution.dtype)

    @jitter_val.setter
    def jitter_val(self, value: float) -> None:
        raise AttributeError("set the jitter on the inducing variables (inducing_variables.jitter)")

    def _clear_cache(self) -> None:
        """GPyTorch's hook: drop the caches, and the fingerprint of what they were filled from."""
        clear_cache_hook(self)
        self._cache_fingerprint = None

    def _clear_cache_if_stale(self, force: bool = False) -> None:
        """Drop the caches if any parameter or buffer of the strategy, the kernel or the mean changed value since they
        were filled (or ``force``), and record what the next fill depends on."""
        tensors = _watched_tensors(self)
        if force or not _fingerprint_matches(self._cache_fingerprint, tensors):
            clear_cache_hook(self)
            self._cache_fingerprint = _fingerprint(tensors)

    def __getstate__(self):
        """Copies and pickles drop the caches: they are recomputed on demand, and train-mode ones
        hold tensors in the autograd graph, which ``copy.deepcopy`` refuses."""
        state = without_memoized_values(super().__getstate__())
        state["_cache_fingerprint"] = None
        return state

    @cached(name="cholesky_factor", ignore_args=True)
    def _cholesky_factor(self) -> Tensor:
        """Lower Cholesky factor of ``K_uu`` (jittered), in GPyTorch's Cholesky dtype."""
        Kuu = to_dense(self.inducing_variables.Kuu(self.kernel))
        return psd_safe_cholesky(Kuu.type(cholesky_dtype()))

    @property
    @cached(name="prior_distribution_memo")
    def prior_distribution(self) -> MultivariateNormal:
        r""":math:`p(v) = \mathcal{N}(0, I)` (whitened) or :math:`p(u) = \mathcal{N}(\mu_u, K_{uu})` (unwhitened)."""
        q = self._variational_distribution
        q_shape = q.shape()
        zeros = torch.zeros(q_shape, dtype=q.dtype, device=q.device)
        if self.whitened:
            return MultivariateNormal(zeros, DiagLinearOperator(torch.ones_like(zeros)))
        chol = self._cholesky_factor().to(q.dtype)
        batch_shape = torch.broadcast_shapes(q_shape[:-1], chol.shape[:-2])
        chol = chol.expand(*batch_shape, *chol.shape[-2:])
        mean_u = self.inducing_variables.prior_mean(self.mean_module)
        mean = zeros.expand(*batch_shape, q_shape[-1]) if mean_u is None else (zeros + mean_u).expand(*batch_shape, -1)
        return MultivariateNormal(mean, CholLinearOperator(TriangularLinearOperator(chol)))

    @property
    def has_fantasy_strategy(self) -> bool:
        """Online variational conditioning needs input locations: point inducing variables only."""
        return isinstance(self.inducing_variables, InducingPoints)

    @property
    def pseudo_points(self) -> tuple[Tensor, Tensor]:
        r""":math:`(D_a, \tilde y)`: the Gaussian pseudo-observations at the inducing points that :math:`q(u)` amounts to,
        :math:`D_a = (S^{-1} - K_{uu}^{-1})^{-1}` (Maddox et al. 2021), computed exactly as GPyTorch's
        ``VariationalStrategy`` (whitened) or ``UnwhitenedVariationalStrategy`` does."""
        if not self.has_fantasy_strategy:
            raise _no_fantasy_error(self.inducing_variables)
        self._clear_cache_if_stale()
        strategies = gpytorch.variational
        gpytorch_strategy = strategies.VariationalStrategy if self.whitened else strategies.UnwhitenedVariationalStrategy
        return gpytorch_strategy.pseudo_points.fget(self)

    def get_fantasy_model(self, inputs: Tensor, targets: Tensor, mean_module=None, covar_module=None, **kwargs):
        """GPyTorch's online variational conditioning (Maddox et al. 2021): an ``ExactGP`` on the
        pseudo-observations :attr:`pseudo_points` and ``(inputs, targets)``; point inducing variables
        only (HiPPO ones raise, naming the online models that condition them).

        :param inputs: the new inputs ``(..., N, d)``.
        :param targets: the new observations ``(..., N)``.
        :param mean_module: mean of the fantasy ``ExactGP``; ``None`` (default) takes ``model.mean_module``.
        :param covar_module: kernel of the fantasy ``ExactGP``; ``None`` (default) takes ``model.covar_module``.
        """
        if not self.has_fantasy_strategy:
            raise _no_fantasy_error(self.inducing_variables)
        if self._explicit_kernel is not None or isinstance(getattr(self.model, "covar_module", None), gpytorch.kernels.Kernel):
            self._clear_cache_if_stale()  # (without a kernel GPyTorch's own method names the missing module)
        return super().get_fantasy_model(inputs, targets, mean_module=mean_module, covar_module=covar_module, **kwargs)

    def kl_divergence(self) -> Tensor:
        r""":math:`\mathrm{KL}(q(u) \| p(u))` with the current hyperparameters (also right after an optimiser step)."""
        self._clear_cache_if_stale()
        return super().kl_divergence()

    def inducing_posterior(self) -> MultivariateNormal:
        """:math:`q(u)` in the unwhitened coordinates of the inducing variables (dense covariance)."""
        self._clear_cache_if_stale()
        q = self.variational_distribution
        if not self.whitened:
            return MultivariateNormal(q.mean, to_dense(q.lazy_covariance_matrix))
        return unwhiten(self._cholesky_factor(), q, self.inducing_variables.prior_mean(self.mean_module))

    def inducing_marginal(self, other: InducingVariables) -> MultivariateNormal:
        r""":math:`\tilde q(u') = \int p(u' \mid u)\, q(u)\, \mathrm{d}u` for another set :math:`u'` (thesis eq. (4.6)).

        Uses :math:`\operatorname{cov}(u, u')` ``= inducing_variables.Kuu_cross(other, kernel)`` and the prior
        ``N(other.prior_mean, other.Kuu(kernel))``; returns a full covariance.

        :param other: the inducing variables :math:`u'` (any :class:`~gpytorch_hippo.inducing.InducingVariables`, any number).
        """
        self._clear_cache_if_stale()
        q, kernel = self.variational_distribution, self.kernel
        Kuu_other = other.Kuu(kernel)
        mean_other = other.prior_mean(self.mean_module)
        if mean_other is None:
            mean_other = torch.zeros(Kuu_other.shape[:-1], dtype=Kuu_other.dtype, device=Kuu_other.device)
        cross = self.inducing_variables.Kuu_cross(other, kernel)
        covar_q = None if isinstance(q, Delta) else q.lazy_covariance_matrix
        return conditional(mean_other, Kuu_other, *self._whitened(cross, q.mean, covar_q), jitter=0.0)

    def advance(self, t_new: float) -> None:
        r"""Move HiPPO inducing variables (time inputs) to ``t_new`` and carry :math:`q(u)` forward.

        The new :math:`q(u')` is :math:`\tilde q(u') = \int p(u' \mid u)\, q(u)\, \mathrm{d}u` (thesis eq. (4.6)), so
        the posterior is the one of the finished task seen through the moved variables (exactly, in
        the Gaussian family of the variational distribution: a mean-field :math:`q` keeps the marginals).
        The inducing variables refuse ``advance`` themselves while this strategy owns them. With an
        :class:`~gpytorch_hippo.online.OnlineELBO` attached, call its ``end_task()`` first: it stores
        :math:`q_{old}(a)` of the finished task, which moving the variables would otherwise overwrite.

        :param t_new: the new time :math:`t` of the bases, later than the current one (same unit as the inputs).
        """
        self._move_in_place("advance", lambda variables: variables.advance(t_new))

    def append_path(self, x_ordered: Tensor, step: int = 1) -> None:
        """Extend the path of multidimensional HiPPO inducing variables with a task's ordered inputs
        (thesis §4.4; Chen et al. (2025), OHSVGP), carrying :math:`q(u)` forward as :meth:`advance` does (nothing to carry before
        :math:`q(u)` is first used).

        :param x_ordered: the task's inputs ``(N, d)`` in path order.
        :param step: use every ``step``-th input (a positive int, default 1), at path times ``step * dt`` apart.
        """
        kernel = self.kernel
        self._move_in_place("append_path", lambda variables: variables.append_path(x_ordered, step=step, kernel=kernel))

    def replace_inducing_variables(self, inducing_variables: InducingVariables) -> None:
        r"""Use other inducing variables, of any number (e.g. OSVGP's re-drawn points), and carry
        :math:`q(u)` to them as :meth:`advance` does: :math:`\tilde q(u') = \int p(u' \mid u)\, q(u)\, \mathrm{d}u`
        (thesis eq. (4.6)). When their number changes the variational distribution is rebuilt
        (same class, batch shape and ``mean_init_std``), so optimisers must be built anew.
        Assigning ``variational_strategy.inducing_variables`` directly keeps the old :math:`q(u)`
        parameters as they are, and needs the same number of inducing variables.

        :param inducing_variables: the new inducing variables :math:`u'` (any
            :class:`~gpytorch_hippo.inducing.InducingVariables`).
        """
        _check_inducing_variables(inducing_variables)

        def install() -> None:
            self.inducing_variables.variational_owner = None
            self.inducing_variables = inducing_variables
            inducing_variables.variational_owner = type(self).__name__
            distribution = _resized(self._variational_distribution, inducing_variables.num_inducing)
            if distribution is not self._variational_distribution:
                self._variational_distribution = distribution
                self.variational_params_initialized.fill_(0)

        self._carry("replace_inducing_variables", lambda: inducing_variables, install)

    def _move_in_place(self, method: str, move: Callable[[InducingVariables], None]) -> None:
        """Move the inducing variables themselves by ``move`` (their ``method``), carrying :math:`q(u)` to them."""
        variables = self.inducing_variables
        if not callable(getattr(variables, method, None)):
            raise TypeError(
                f"{type(variables).__name__} have no {method} (it is for HiPPO inducing variables); "
                "use variational_strategy.replace_inducing_variables(new) instead"
            )

        self._carry(method, lambda: _moved_copy(variables, move), lambda: _move_owned(variables, move, type(self).__name__))

    def _carry(self, method: str, target: Callable[[], InducingVariables], install: Callable[[], None]) -> None:
        r"""Set :math:`q(u')` to :math:`\tilde q(u') = \int p(u' \mid u)\, q(u)\, \mathrm{d}u` (thesis eq. (4.6)) for the inducing
        variables ``target()``, after ``install()`` put them in place of the current ones; exactly, without the random
        jitter GPyTorch's initialisation adds (:func:`_initialize_exactly`). An unused :math:`q(u)` holds nothing to
        carry; one an :class:`~gpytorch_hippo.online.OnlineELBO` trained is carried only after its ``end_task()``."""
        carry = bool(self.variational_params_initialized.item())
        if carry and self.online_objective and not self.online_task_ended.item():
            raise RuntimeError(
                f"call OnlineELBO.end_task() before {method}: it stores q(u) of the finished task ({method} first would silently lose it)"
            )
        self._clear_cache()
        with torch.no_grad():
            carried = self.inducing_marginal(target()) if carry else None
            install()
            self._clear_cache()
            if carried is not None:
                mean, covar = carried.mean, to_dense(carried.lazy_covariance_matrix)
                if self.whitened:
                    mean, covar = whiten(self._cholesky_factor(), carried, self.inducing_variables.prior_mean(self.mean_module))
                _initialize_exactly(self._variational_distribution, mean, covar)
                self.variational_params_initialized.fill_(1)
                self._clear_cache()
        self.online_task_ended.fill_(False)

    def forward(
        self,
        x: Tensor,
        inducing_values: Tensor,
        variational_inducing_covar: LinearOperator | None = None,
        diag: bool = True,
        **kwargs,
    ) -> MultivariateNormal:
        """``q(f(x))`` with its full covariance, lazily (``diag`` is accepted for GPyTorch's seam and
        not needed: reading only the variances of the result costs :math:`O(N M^2)` anyway).

        :param x: the inputs ``(..., N, d)``.
        :param inducing_values: the mean of the variational distribution ``(..., M)`` (whitened :math:`v` or :math:`u`).
        :param variational_inducing_covar: its covariance ``(..., M, M)``; ``None`` (default) for a ``Delta`` (point mass).
        :param diag: ignored (GPyTorch's interface); the covariance is always full and lazy.
        """
        prior = self.model.forward(x, **kwargs)
        Kuf = self.inducing_variables.Kuf(self.kernel, x)
        jitter = self.inducing_variables.jitter_value(Kuf.dtype) if self.whitened else 0.0
        return conditional(
            prior.mean, prior.lazy_covariance_matrix, *self._whitened(Kuf, inducing_values, variational_inducing_covar), jitter
        )

    def _whitened(self, cross: Tensor, mean: Tensor, covar: LinearOperator | None) -> tuple[Tensor, Tensor, Tensor | None]:
        """:math:`W = L^{-1}` ``cross`` and the moments of :math:`q(v)` (:func:`whitened_moments`) for :func:`conditional`."""
        chol = self._cholesky_factor()
        W = solve_lower(chol, cross)
        mean_u = None if self.whitened else self.inducing_variables.prior_mean(self.mean_module)
        return (W, *whitened_moments(chol, mean, covar, mean_u, self.whitened))

    def __call__(self, x: Tensor, prior: bool = False, diag: bool = True, **kwargs) -> MultivariateNormal:
        self.inducing_variables.variational_owner = type(self).__name__  # also after a replacement
        if prior:
            return self.model.forward(x, **kwargs)
        if self.training:  # training data the inducing variables cannot reach would be lost silently
            self.inducing_variables.check_inputs_within_support(x)
        # train mode: a fresh graph every forward; the fingerprint lets later readers of the same step
        # (kl_divergence, inducing_posterior) reuse it, and refill after an optimiser step
        self._clear_cache_if_stale(force=self.training)
        _check_sizes(self._variational_distribution, self.inducing_variables)
        if not self.variational_params_initialized.item():
            self._variational_distribution.initialize_variational_distribution(self.prior_distribution)
            self.variational_params_initialized.fill_(1)
            # only q(u) changed: the prior and chol(K_uu) stay cached (GPyTorch's count of factorisations per pass)
            with contextlib.suppress(CachingError):
                pop_from_cache(self, "variational_distribution_memo")
            self._cache_fingerprint = _fingerprint(_watched_tensors(self))
        q = self.variational_distribution
        if not isinstance(q, MultivariateNormal | Delta):
            raise RuntimeError(f"Invalid variational distribution ({type(q).__name__}); expected a MultivariateNormal or a Delta")
        covar = None if isinstance(q, Delta) else q.lazy_covariance_matrix
        return gpytorch.Module.__call__(self, x, inducing_values=q.mean, variational_inducing_covar=covar, diag=diag, **kwargs)
