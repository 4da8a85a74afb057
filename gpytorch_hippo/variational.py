r"""One variational strategy for every kind of inducing variable (thesis §4.2.1 and §2.3.2):
:math:`q(f) = \int p(f \mid u)\, q(u)\, \mathrm{d}u` with :math:`q(u) = \mathcal{N}(m, S)` (Titsias (2009), Hensman et al. (2013)).
"""

from __future__ import annotations

import copy
import itertools

import gpytorch
import torch
from gpytorch.distributions import Delta, MultivariateNormal
from gpytorch.utils.memoize import cached, clear_cache_hook
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

from probseq._compat import VariationalDistributionBase, VariationalStrategyBase, cholesky_dtype

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


def _same_tensor(cached: Tensor, current: Tensor) -> bool:
    """Whether a fingerprint tensor still describes ``current``: same values, shape, dtype and device
    (``torch.equal`` alone calls float32 and float64 copies equal, and raises across devices)."""
    return (
        cached.shape == current.shape and cached.dtype == current.dtype and cached.device == current.device and torch.equal(cached, current)
    )


class InterdomainVariationalStrategy(VariationalStrategyBase):
    r"""Sparse variational GP with arbitrary (interdomain) inducing variables.

    For inducing variables :math:`u` with :math:`q(u) = \mathcal{N}(m_u, S_u)` the approximate posterior at inputs
    :math:`X` is (thesis eq. (2.36), with :math:`K_{ZZ}, K_{XZ}` replaced by the interdomain
    :math:`K_{uu}, K_{fu}` of §4.2.1)

    .. math::
        q(f_X) = \mathcal{N}\big(m(X) + K_{Xu} K_{uu}^{-1} (m_u - \mu_u),\;
                 K_{XX} + K_{Xu} K_{uu}^{-1} (S_u - K_{uu}) K_{uu}^{-1} K_{uX}\big),

    computed as :math:`W = L^{-1} K_{uX}` with :math:`L = \operatorname{chol}(K_{uu})`. With ``whitened=True`` the
    variational distribution is over :math:`v = L^{-1}(u - \mu_u)` and the prior is :math:`\mathcal{N}(0, I)`;
    with ``whitened=False`` it is over :math:`u` itself and the prior is :math:`\mathcal{N}(\mu_u, K_{uu})`. The
    ELBO's KL term is :math:`\mathrm{KL}(q \| \mathrm{prior})` (thesis eq. (2.38)).

    With :class:`~gpytorch_hippo.inducing.InducingPoints` this is exactly GPyTorch's
    ``VariationalStrategy`` (``whitened=True``) or ``UnwhitenedVariationalStrategy``
    (``whitened=False``): same mean, covariance, KL and jitter (``Kuu`` jitter from the inducing
    variables' policy; the whitened form also adds it to the data covariance, as GPyTorch does).

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

    def __init__(
        self,
        model: gpytorch.models.ApproximateGP,
        inducing_variables: InducingVariables,
        variational_distribution: VariationalDistributionBase,
        whitened: bool = True,
        kernel: gpytorch.kernels.Kernel | None = None,
    ):
        if not isinstance(inducing_variables, InducingVariables):
            raise TypeError(
                f"inducing_variables must be an InducingVariables instance (e.g. InducingPoints), got {type(inducing_variables).__name__}"
            )
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
        # Deliberately skip _VariationalStrategy.__init__: it would register an `inducing_points`
        # parameter, which has no meaning for interdomain inducing variables (and would go stale for
        # point ones); the `inducing_points` property below gives GPyTorch's wrappers what they read.
        gpytorch.Module.__init__(self)
        self._jitter_val = None
        object.__setattr__(self, "model", model)
        self.inducing_variables = inducing_variables
        self._variational_distribution = variational_distribution
        self.register_buffer("variational_params_initialized", torch.tensor(0))
        # set by OnlineELBO.end_task, cleared by advance: an attached OnlineELBO must store the
        # finished task before the inducing variables move (see advance)
        self.register_buffer("online_task_ended", torch.tensor(False))
        self.online_objective = False  # whether an OnlineELBO uses this strategy (set by OnlineELBO)
        self.whitened = bool(whitened)
        self._explicit_kernel = kernel
        self._cache_fingerprint: list[Tensor] | None = None
        inducing_variables.variational_owner = type(self).__name__

    # ------------------------------------------------------------------ components
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
        """GPyTorch's attribute, read by its wrappers (``LMCVariationalStrategy`` takes its dtype).

        The inputs ``Z`` of :class:`~gpytorch_hippo.inducing.InducingPoints` (the live tensor, never a
        stale copy); interdomain inducing variables have no input locations, so for them an empty
        ``(*batch, M, 0)`` tensor of the variational distribution's dtype and device.
        """
        points = getattr(self.inducing_variables, "points", None)
        if isinstance(points, Tensor):
            return points
        q = self._variational_distribution
        return torch.empty(*q.batch_shape, self.inducing_variables.num_inducing, 0, dtype=q.dtype, device=q.device)

    @property
    def jitter_val(self) -> float:
        dtype = self._variational_distribution.dtype
        return self.inducing_variables.jitter_value(dtype)

    @jitter_val.setter
    def jitter_val(self, value: float) -> None:
        raise AttributeError("set the jitter on the inducing variables (inducing_variables.jitter)")

    # ------------------------------------------------------------------ caching
    def _watched_tensors(self) -> list[Tensor]:
        modules = [self, self.kernel]
        if self.mean_module is not None:
            modules.append(self.mean_module)
        tensors = []
        for module in modules:
            tensors.extend(module.parameters())
            tensors.extend(module.buffers())
        return tensors

    def _clear_cache(self) -> None:
        clear_cache_hook(self)
        self._cache_fingerprint = None

    def _clear_cache_if_stale(self, force: bool = False) -> None:
        """Drop the caches if any watched tensor changed value since they were filled (or ``force``),
        and record what the next fill depends on."""
        tensors = self._watched_tensors()
        old = self._cache_fingerprint
        fresh = (
            not force and old is not None and len(old) == len(tensors) and all(_same_tensor(a, b.detach()) for a, b in zip(old, tensors))
        )
        if not fresh:
            clear_cache_hook(self)
            self._cache_fingerprint = [t.detach().clone() for t in tensors]

    def _forget_variational_distribution(self) -> None:
        """Drop only the memo of ``q(u)`` after its parameters were set (initialisation), and record the
        new values: the prior and ``chol(K_uu)`` depend on the kernel and the inducing variables only, so
        they stay cached (GPyTorch's count of Cholesky factorisations per pass)."""
        cache = getattr(self, "_memoize_cache", {})
        self._memoize_cache = {
            key: value for key, value in cache.items() if (key[0] if isinstance(key, tuple) else key) != "variational_distribution_memo"
        }
        self._cache_fingerprint = [t.detach().clone() for t in self._watched_tensors()]

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        # A checkpoint of GPyTorch's VariationalStrategy / UnwhitenedVariationalStrategy (built with the
        # same ``whitened``): its ``inducing_points`` are the points of InducingPoints, and it has no
        # online bookkeeping.
        if prefix + "inducing_points" in state_dict and isinstance(self.inducing_variables, InducingPoints):
            state_dict[prefix + "inducing_variables.points"] = state_dict.pop(prefix + "inducing_points")
            updated = state_dict.pop(prefix + "updated_strategy", None)
            if updated is not None and not bool(updated):
                raise RuntimeError(
                    "this VariationalStrategy checkpoint predates GPyTorch's current whitening (updated_strategy=False): "
                    "load it into gpytorch.variational.VariationalStrategy once and save it again"
                )
            state_dict.setdefault(prefix + "online_task_ended", self.online_task_ended.clone())
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)

    def __getstate__(self):
        """Copies and pickles drop the caches: they are recomputed on demand, and train-mode ones
        hold tensors in the autograd graph, which ``copy.deepcopy`` refuses."""
        state = super().__getstate__()
        state["_memoize_cache"] = {}
        state["_cache_fingerprint"] = None
        return state

    @cached(name="cholesky_factor", ignore_args=True)
    def _cholesky_factor(self) -> Tensor:
        """Lower Cholesky factor of ``K_uu`` (jittered), in GPyTorch's Cholesky dtype."""
        Kuu = to_dense(self.inducing_variables.Kuu(self.kernel))
        return psd_safe_cholesky(Kuu.type(cholesky_dtype()))

    def _prior_mean_u(self) -> Tensor | None:
        return self.inducing_variables.prior_mean(self.mean_module)

    # ------------------------------------------------------------------ distributions over u
    @property
    @cached(name="prior_distribution_memo")
    def prior_distribution(self) -> MultivariateNormal:
        r""":math:`p(v) = \mathcal{N}(0, I)` (whitened) or :math:`p(u) = \mathcal{N}(\mu_u, K_{uu})` (unwhitened)."""
        q_shape = self._variational_distribution.shape()
        dtype = self._variational_distribution.dtype
        device = self._variational_distribution.device
        zeros = torch.zeros(q_shape, dtype=dtype, device=device)
        if self.whitened:
            return MultivariateNormal(zeros, DiagLinearOperator(torch.ones_like(zeros)))
        chol = self._cholesky_factor().to(dtype)
        batch_shape = torch.broadcast_shapes(q_shape[:-1], chol.shape[:-2])
        chol = chol.expand(*batch_shape, *chol.shape[-2:])
        mean_u = self._prior_mean_u()
        mean = zeros.expand(*batch_shape, q_shape[-1]) if mean_u is None else (zeros + mean_u).expand(*batch_shape, -1)
        return MultivariateNormal(mean, CholLinearOperator(TriangularLinearOperator(chol)))

    # ------------------------------------------------------------------ GPyTorch's fantasy models
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
            raise NotImplementedError(self._no_fantasy_message())
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
            raise NotImplementedError(self._no_fantasy_message())
        if self._explicit_kernel is not None or isinstance(getattr(self.model, "covar_module", None), gpytorch.kernels.Kernel):
            self._clear_cache_if_stale()  # (without a kernel GPyTorch's own method names the missing module)
        return super().get_fantasy_model(inputs, targets, mean_module=mean_module, covar_module=covar_module, **kwargs)

    def _no_fantasy_message(self) -> str:
        return (
            f"GPyTorch's fantasy models condition an exact GP on pseudo-observations at input locations, which "
            f"{type(self.inducing_variables).__name__} do not have: condition them online with "
            "gpytorch_hippo.OnlineSGPR / OnlineELBO, or gpytorch_hippo.botorch.OnlineGPModel.condition_on_observations"
        )

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
        chol = self._cholesky_factor()
        mean = (chol.to(q.mean.dtype) @ q.mean.unsqueeze(-1)).squeeze(-1)
        mean_u = self._prior_mean_u()
        if mean_u is not None:
            mean = mean + mean_u
        root = to_dense(q.lazy_covariance_matrix.root_decomposition().root)
        root = chol.to(root.dtype) @ root
        return MultivariateNormal(mean, root @ root.mT)

    def inducing_marginal(self, other: InducingVariables) -> MultivariateNormal:
        r""":math:`\tilde q(u') = \int p(u' \mid u)\, q(u)\, \mathrm{d}u` for another set :math:`u'` (thesis eq. (4.6)).

        Uses :math:`\operatorname{cov}(u, u')` ``= inducing_variables.Kuu_cross(other, kernel)`` and the prior
        ``N(other.prior_mean, other.Kuu(kernel))``; returns a full covariance.

        :param other: the inducing variables :math:`u'` (any :class:`~gpytorch_hippo.inducing.InducingVariables`, any number).
        """
        self._clear_cache_if_stale()
        q = self.variational_distribution
        kernel = self.kernel
        Kuu_other = other.Kuu(kernel)
        mean_other = other.prior_mean(self.mean_module)
        if mean_other is None:
            mean_other = torch.zeros(Kuu_other.shape[:-1], dtype=Kuu_other.dtype, device=Kuu_other.device)
        cross = self.inducing_variables.Kuu_cross(other, kernel)
        covar_q = None if isinstance(q, Delta) else q.lazy_covariance_matrix
        return self._conditional(mean_other, Kuu_other, cross, q.mean, covar_q, data_jitter=False)

    # ------------------------------------------------------------------ moving the inducing variables
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
        self._move_inducing_variables("advance", lambda variables: variables.advance(t_new))

    def append_path(self, x_ordered: Tensor, step: int = 1) -> None:
        """Extend the path of multidimensional HiPPO inducing variables with a task's ordered inputs
        (thesis §4.4; Chen et al. (2025), OHSVGP), carrying :math:`q(u)` forward as :meth:`advance` does (nothing to carry before
        :math:`q(u)` is first used).

        :param x_ordered: the task's inputs ``(N, d)`` in path order.
        :param step: use every ``step``-th input (a positive int, default 1), at path times ``step * dt`` apart.
        """
        kernel = self.kernel
        self._move_inducing_variables("append_path", lambda variables: variables.append_path(x_ordered, step=step, kernel=kernel))

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
        if not isinstance(inducing_variables, InducingVariables):
            raise TypeError(
                f"inducing_variables must be an InducingVariables instance (e.g. InducingPoints), got {type(inducing_variables).__name__}"
            )
        carry = self._check_movable("replace_inducing_variables")
        with torch.no_grad():
            carried = self.inducing_marginal(inducing_variables) if carry else None
        self.inducing_variables.variational_owner = None
        self.inducing_variables = inducing_variables
        inducing_variables.variational_owner = type(self).__name__
        old = self._variational_distribution
        if old.shape()[-1] != inducing_variables.num_inducing:
            reference = next(itertools.chain(old.parameters(), old.buffers()), None)
            fresh = type(old)(inducing_variables.num_inducing, batch_shape=old.batch_shape, mean_init_std=old.mean_init_std)
            self._variational_distribution = fresh if reference is None else fresh.to(reference)
            self.variational_params_initialized.fill_(0)
        self._clear_cache()
        if carry:
            with torch.no_grad():
                self._set_variational_distribution(carried)
        self.online_task_ended.fill_(False)

    def _check_movable(self, method: str) -> bool:
        """Whether ``q(u)`` holds something to carry; refuses to move past an unstored online task."""
        carry = bool(self.variational_params_initialized.item())  # (an unused q(u) holds nothing to carry)
        if carry and self.online_objective and not self.online_task_ended.item():
            raise RuntimeError(
                f"call OnlineELBO.end_task() before {method}: it stores q(u) of the finished task ({method} first would silently lose it)"
            )
        return carry

    def _move_inducing_variables(self, method: str, move) -> None:
        if not callable(getattr(self.inducing_variables, method, None)):
            raise TypeError(
                f"{type(self.inducing_variables).__name__} have no {method} (it is for HiPPO inducing variables); "
                "use variational_strategy.replace_inducing_variables(new) instead"
            )
        carry = self._check_movable(method)
        self._clear_cache()
        inducing_variables = self.inducing_variables
        with torch.no_grad():
            if carry:
                moved = copy.deepcopy(inducing_variables)
                moved.variational_owner = None
                move(moved)
                carried = self.inducing_marginal(moved)
            inducing_variables.variational_owner = None
            try:
                move(inducing_variables)
            finally:
                inducing_variables.variational_owner = type(self).__name__
            self._clear_cache()
            if carry:
                self._set_variational_distribution(carried)
        self.online_task_ended.fill_(False)

    def _set_variational_distribution(self, q_u: MultivariateNormal) -> None:
        """Set the variational parameters to ``q(u) = q_u`` (whitened by ``chol(K_uu)`` if need be),
        exactly: without the random jitter GPyTorch's initialisation adds to the mean."""
        mean, covar = q_u.mean, to_dense(q_u.lazy_covariance_matrix)
        if self.whitened:
            chol = self._cholesky_factor().to(mean.dtype)
            mean_u = self._prior_mean_u()
            mean = mean if mean_u is None else mean - mean_u
            mean = solve_lower(chol, mean.unsqueeze(-1)).squeeze(-1)
            covar = solve_lower(chol, solve_lower(chol, covar).mT)
        distribution = self._variational_distribution
        mean_init_std = distribution.mean_init_std
        distribution.mean_init_std = 0.0
        try:
            distribution.initialize_variational_distribution(MultivariateNormal(mean, (covar + covar.mT) / 2))
        finally:
            distribution.mean_init_std = mean_init_std
        self.variational_params_initialized.fill_(1)
        self._clear_cache()

    # ------------------------------------------------------------------ q(f)
    def _conditional(
        self,
        prior_mean: Tensor,
        prior_covar: LinearOperator,
        Kuf: Tensor,
        inducing_values: Tensor,
        variational_inducing_covar: LinearOperator | None,
        data_jitter: bool,
    ) -> MultivariateNormal:
        """``\\int p(f | u) q(u) du`` for targets with prior ``N(prior_mean, prior_covar)`` and ``cov(u, f) = Kuf``."""
        chol = self._cholesky_factor()
        W = solve_lower(chol, Kuf)  # L^{-1} K_uf
        if self.whitened:
            mean_v = inducing_values
            root_v = None
            if variational_inducing_covar is not None:
                root_v = to_dense(variational_inducing_covar.root_decomposition().root)
        else:
            diff = inducing_values
            mean_u = self._prior_mean_u()
            if mean_u is not None:
                diff = diff - mean_u
            mean_v = solve_lower(chol, diff.unsqueeze(-1)).squeeze(-1)
            root_v = None
            if variational_inducing_covar is not None:
                root = to_dense(variational_inducing_covar.root_decomposition().root)
                root_v = solve_lower(chol, root)
        mean = prior_mean + (W.mT @ mean_v.unsqueeze(-1)).squeeze(-1)
        jitter = self.inducing_variables.jitter_value(W.dtype) if data_jitter else 0.0

        # The full covariance in every mode, kept lazy (prior + low rank): the ELBO reads only its
        # diagonal, at O(N M^2), while samples and GPyTorch's multitask wrappers see the correlations.
        nystrom_residual(prior_covar.diagonal(dim1=-2, dim2=-1), W)  # warns if Kuu and Kuf are inconsistent
        num_inducing = W.shape[-2]
        if root_v is None:
            middle = -torch.eye(num_inducing, dtype=W.dtype, device=W.device)
        else:
            middle = root_v @ root_v.mT - torch.eye(num_inducing, dtype=W.dtype, device=W.device)
        covar = prior_covar.add_jitter(jitter) if jitter > 0 else prior_covar
        covar = covar + MatmulLinearOperator(W.mT, middle @ W)
        if gpytorch.settings.trace_mode.on():
            covar = covar.to_dense()
        return MultivariateNormal(mean, covar)

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
        return self._conditional(
            prior.mean,
            prior.lazy_covariance_matrix,
            Kuf,
            inducing_values,
            variational_inducing_covar,
            data_jitter=self.whitened,
        )

    def __call__(self, x: Tensor, prior: bool = False, diag: bool = True, **kwargs) -> MultivariateNormal:
        self.inducing_variables.variational_owner = type(self).__name__  # also after a replacement
        if prior:
            return self.model.forward(x, **kwargs)
        if self.training:  # training data the inducing variables cannot reach would be lost silently
            self.inducing_variables.check_inputs_within_support(x)
        # train mode: a fresh graph every forward; the fingerprint lets later readers of the same step
        # (kl_divergence, inducing_posterior) reuse it, and refill after an optimiser step
        self._clear_cache_if_stale(force=self.training)
        num_q = self._variational_distribution.shape()[-1]
        if num_q != self.inducing_variables.num_inducing:
            raise RuntimeError(
                f"the variational distribution has size {num_q} but inducing_variables has num_inducing="
                f"{self.inducing_variables.num_inducing}: change their number with "
                "variational_strategy.replace_inducing_variables(new), which resizes and carries q(u)"
            )
        if not self.variational_params_initialized.item():
            self._variational_distribution.initialize_variational_distribution(self.prior_distribution)
            self.variational_params_initialized.fill_(1)
            self._forget_variational_distribution()
        q = self.variational_distribution
        if isinstance(q, MultivariateNormal):
            covar = q.lazy_covariance_matrix
        elif isinstance(q, Delta):
            covar = None
        else:
            raise RuntimeError(f"Invalid variational distribution ({type(q).__name__}); expected a MultivariateNormal or a Delta")
        return gpytorch.Module.__call__(self, x, inducing_values=q.mean, variational_inducing_covar=covar, diag=diag, **kwargs)
