r"""The collapsed online bound of Bui, Nguyen & Turner (2017) and its optimal :math:`q(u)`, as functions, for any
:class:`~gpytorch_hippo.inducing.InducingVariables` (thesis §4.2.2; OHSGPR with HiPPO variables, OSGPR with points).

:class:`~gpytorch_hippo.online.OnlineSGPR` holds the state and calls these functions; they change nothing.

**The update.** A task :math:`(X, y)` is absorbed by maximising the online ELBO (thesis eq. (4.6)) in closed form
over :math:`q(b)`. Writing :math:`L = \operatorname{chol}(K_{bb})`, :math:`v = L^{-1}(b - \mu_b)`,
:math:`W = L^{-1} K_{bX}` and, for the old inducing variables, :math:`L' = \operatorname{chol}(K'_{aa})` (old
hyperparameters), the ratio :math:`q_{old}(a) / p_{old}(a)` is a Gaussian factor
:math:`\exp(-\tfrac12 w^T \Lambda' w + w^T \eta' + c')` in :math:`w = L'^{-1}(a - \mu'_a)`
(:class:`~gpytorch_hippo.stored.StoredTask`). Under the new prior :math:`w = \delta + T^T v + \varepsilon` with
:math:`T = L^{-1} K_{ba} L'^{-T}`, :math:`\delta = L'^{-1}(\mu_a - \mu'_a)` and
:math:`\operatorname{cov}(\varepsilon) = C = L'^{-1}(K_{aa} - Q_{aa}) L'^{-T}`; so the optimal
:math:`q(v) = \mathcal{N}(B^{-1}\eta, B^{-1})` with

.. math::
    B = I + W W^T / \sigma^2 + T \Lambda' T^T,\qquad
    \eta = W (y - m(X)) / \sigma^2 + T (\eta' - \Lambda' \delta),

and the collapsed bound is

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
data, and the per-task bounds sum to the batch bound. The new summary is :math:`(L, B - I, \eta, \mu_b)`.

**The jitter.** :math:`K'_{aa}` includes the jitter of the old variables, white noise :math:`e` on them
(:math:`a = g(f) + e`, :class:`~gpytorch_hippo.inducing.InducingVariables`). Where the new variables
do not share it (HiPPO bases after ``advance``, points that moved), the ratio is averaged over
that noise before it is used, :math:`\Lambda', \eta'` above becoming those of :math:`\mathbb{E}_e[r(g + e)]`
(:func:`smooth_ratio`; :math:`C` and :math:`K_{aa}` then exclude the noise, and the bound gains the
average's log-normaliser). Taken literally, Bui et al.'s ratio would pass the jitter on as
information about :math:`f` at every step. The algebra runs in float64 (:func:`to_working_dtype`) whatever the
model's dtype, and the stored summary stays in float64.

**Prediction.** :math:`q(f(x)) = \mathcal N(m(x) + W_x^T m_w, K_{xx} + W_x^T (G B^{-1} G^T - I) W_x)` with
:math:`W_x = L^{-1} K_{ux}` at today's hyperparameters and :math:`G = L^{-1} L'` (:func:`prediction_factors`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import gpytorch
import torch
from linear_operator import to_dense
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor

from probseq._compat import cholesky_dtype

from ._validation import floating_dtype
from .inducing.base import InducingVariables
from .inducing.points import InducingPoints
from .nystrom import nystrom_residual
from .stored import StoredTask, check_mean_unchanged
from .variational import solve_lower

__all__ = [
    "CollapsedUpdate",
    "b_factor",
    "check_parts",
    "collapsed_update",
    "distinct_inputs",
    "inducing_moments",
    "keep_streams_without_points",
    "prediction_factors",
    "smooth_ratio",
    "to_working_dtype",
    "unwhiten_ratio",
    "whitened_mean",
    "with_shared_matrix",
]


def to_working_dtype(tensor: Tensor) -> Tensor:
    r"""``tensor`` in the dtype of the online algebra: at least GPyTorch's Cholesky dtype
    (:func:`probseq._compat.cholesky_dtype`, float64), so that a float32 model is the float64 model
    rounded once at its outputs (:math:`K_{uu}` is conditioned only by its jitter, :math:`\kappa \approx M / 10^{-6}`).

    :param tensor: a floating tensor; one of the working dtype (float64) already is returned as it is.
    """
    return tensor.to(torch.promote_types(tensor.dtype, cholesky_dtype()))


def check_parts(
    inducing_variables: InducingVariables,
    covar_module: gpytorch.kernels.Kernel,
    likelihood: gpytorch.likelihoods.GaussianLikelihood,
    mean_module: gpytorch.means.Mean | None,
) -> tuple[InducingVariables, gpytorch.kernels.Kernel, gpytorch.likelihoods.GaussianLikelihood, gpytorch.means.Mean]:
    """The parts of a collapsed online model, checked (a ``TypeError`` naming the wrong one), ``None`` mean as ``ZeroMean``.

    :param inducing_variables: any :class:`~gpytorch_hippo.inducing.InducingVariables`.
    :param covar_module: a GPyTorch kernel.
    :param likelihood: a homoskedastic ``GaussianLikelihood`` (the collapsed bound needs one noise variance).
    :param mean_module: a GPyTorch mean, or ``None``.
    """
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
    return inducing_variables, covar_module, likelihood, mean_module


def smooth_ratio(precision: Tensor, shift: Tensor, noise: Tensor) -> tuple[Tensor, Tensor, Tensor]:
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

    :param precision: ``P`` ``(..., M, M)``, symmetric.
    :param shift: ``h`` ``(..., M)``.
    :param noise: the jitter variances ``(..., M)``, ``>= 0``.
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


def unwhiten_ratio(precision: Tensor, shift: Tensor, chol: Tensor) -> tuple[Tensor, Tensor]:
    """``(L'^{-T} Λ L'^{-1}, L'^{-T} η)``: a ratio ``exp(-½ wᵀΛw + wᵀη)`` in ``w = L'^{-1} z`` written in ``z``.

    :param precision: ``Λ`` ``(..., M, M)``.
    :param shift: ``η`` ``(..., M)``.
    :param chol: ``L'`` ``(..., M, M)``, lower triangular.
    """
    upper = chol.mT
    half = torch.linalg.solve_triangular(upper, precision, upper=True)  # L'^{-T} Λ
    unwhitened = torch.linalg.solve_triangular(upper, half.mT, upper=True)  # L'^{-T} Λ L'^{-1}
    return 0.5 * (unwhitened + unwhitened.mT), torch.linalg.solve_triangular(upper, shift.unsqueeze(-1), upper=True).squeeze(-1)


def b_factor(precision: Tensor) -> Tensor:
    """``chol(B) = chol(I + Λ)`` of a whitened precision ``Λ`` ``(..., M, M)``.

    :param precision: ``Λ``, symmetric positive semi-definite.
    """
    return psd_safe_cholesky(precision + torch.eye(precision.shape[-1], dtype=precision.dtype, device=precision.device))


class CollapsedUpdate(NamedTuple):
    r"""The result of :func:`collapsed_update`: the bound and the new summary.

    :param bound: the collapsed online bound :math:`\mathcal L` of the task (module docstring), in the targets' dtype.
    :param precision: :math:`B - I` of the optimal :math:`q(v)` ``(..., M, M)`` (float64).
    :param shift: :math:`\eta` ``(..., M)``.
    :param chol: :math:`L = \operatorname{chol}(K_{bb})` ``(..., M, M)``.
    :param b_chol: :math:`\operatorname{chol}(B)` ``(..., M, M)``.
    :param prior_mean: :math:`\mu_b`, the prior mean of the new inducing variables ``(..., M)`` (zeros for interdomain
        ones, which project :math:`f - m`).
    :param captured: :math:`\operatorname{diag}(Q_{XX}) / \operatorname{diag}(K_{XX})` at the task's inputs
        ``(..., N)`` (detached), for the captured-variance monitor.
    """

    bound: Tensor
    precision: Tensor
    shift: Tensor
    chol: Tensor
    b_chol: Tensor
    prior_mean: Tensor
    captured: Tensor


def _unchanged_points(old: InducingVariables, new: InducingVariables, old_chol: Tensor, chol: Tensor, W: Tensor) -> bool:
    """Whether a task's inducing points and ``K_uu`` are exactly the stored task's, with nothing to
    differentiate (the identities of the short update hold at these hyperparameters only)."""
    if not (isinstance(old, InducingPoints) and isinstance(new, InducingPoints)) or old.jitter != new.jitter:
        return False
    if chol.requires_grad or W.requires_grad or old.points.shape != new.points.shape or old_chol.shape != chol.shape:
        return False
    return torch.equal(old.points, new.points.detach()) and torch.equal(old_chol, chol)


def distinct_inputs(x: Tensor) -> Tensor:
    """``x`` ``(..., N, D)`` with each leading dimension of stride 0 (a view repeating the same inputs, as BoTorch's
    fantasies expand them) narrowed to size 1: the same values, broadcasting back to ``x``'s shape.

    :param x: inputs ``(..., N, D)``.
    """
    for dim in range(x.dim() - 2):
        if x.stride(dim) == 0 and x.shape[dim] > 1:
            x = x.narrow(dim, 0, 1)
    return x


def collapsed_update(
    kernel: gpytorch.kernels.Kernel,
    inducing_variables: InducingVariables,
    mean_module: gpytorch.means.Mean,
    x: Tensor,
    y: Tensor,
    noise: Tensor,
    mask: Tensor | None = None,
    stored: StoredTask | None = None,
    stored_b_chol: Tensor | None = None,
) -> CollapsedUpdate:
    r"""The collapsed online bound of absorbing ``(x, y)`` and the optimal :math:`q(v)` in natural form (module
    docstring); differentiable with respect to the hyperparameters.

    :param kernel: today's kernel :math:`k`.
    :param inducing_variables: today's inducing variables :math:`b`.
    :param mean_module: today's mean function :math:`m`.
    :param x: the task's inputs ``(..., N, D)``.
    :param y: the task's targets ``(..., N)``.
    :param noise: the noise variances :math:`\sigma_i^2`, broadcasting to ``y``'s shape.
    :param mask: booleans ``(..., N)``, ``False`` for padding that contributes nothing (ragged tasks of batched
        streams); ``None`` (default): every point counts.
    :param stored: the summary of the tasks before (``None``: the first task, Titsias' bound).
    :param stored_b_chol: :math:`\operatorname{chol}(B') = \operatorname{chol}(I + \Lambda')` of ``stored``
        (:func:`b_factor`); needed with ``stored``.
    """
    chol = psd_safe_cholesky(to_working_dtype(to_dense(inducing_variables.Kuu(kernel))))
    distinct = distinct_inputs(x)  # fantasies of the same inputs: W, and so B, once for all of them
    W = solve_lower(chol, to_working_dtype(inducing_variables.Kuf(kernel, distinct)))
    precision_noise = torch.atleast_1d(to_working_dtype(noise))  # σ_i² with its own batch shape
    noise = precision_noise.expand(y.shape)
    resid = to_working_dtype(y - mean_module(x))
    prior_variance = to_working_dtype(kernel(distinct, diag=True))
    residual = nystrom_residual(prior_variance, W, floating_dtype(kernel))  # diag(K_XX - Q_XX)
    captured = (W.detach().square().sum(-2) / prior_variance.detach()).expand(y.shape)  # diag(Q_XX) / diag(K_XX), for the monitor
    per_point = torch.log(2 * math.pi * noise) + (resid.square() + residual) / noise
    if mask is not None:  # a padded point: no column of W, no residual, no term of the bound
        observed = mask.to(W.dtype)
        W, resid, per_point = W * observed.unsqueeze(-2), resid * observed, per_point * observed
    precision = (W / precision_noise.unsqueeze(-2)) @ W.mT
    shift = (W @ (resid / noise).unsqueeze(-1)).squeeze(-1)
    bound = -0.5 * per_point.sum(-1)
    if stored is not None:
        if stored_b_chol is None:
            raise ValueError("stored_b_chol is needed with stored: pass b_factor(stored.precision)")
        bound, precision, shift = _absorb_stored(
            kernel, inducing_variables, mean_module, stored, stored_b_chol, chol, W, bound, precision, shift
        )
    b_chol = b_factor(precision)
    c = solve_lower(b_chol, shift.unsqueeze(-1)).squeeze(-1)
    bound = bound - b_chol.diagonal(dim1=-2, dim2=-1).log().sum(-1) + 0.5 * c.square().sum(-1)  # -½ log|B| + ½ ηᵀB⁻¹η
    prior_mean = inducing_variables.prior_mean(mean_module)
    prior_mean = torch.zeros_like(shift) if prior_mean is None else to_working_dtype(prior_mean)
    return CollapsedUpdate(bound.to(y.dtype), precision, shift, chol, b_chol, prior_mean.expand(shift.shape), captured)


def _absorb_stored(
    kernel: gpytorch.kernels.Kernel,
    ivs: InducingVariables,
    mean_module: gpytorch.means.Mean,
    stored: StoredTask,
    old_b_chol: Tensor,
    chol: Tensor,
    W: Tensor,
    bound: Tensor,
    precision: Tensor,
    shift: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    r"""``(bound, precision, shift)`` of the new data plus the stored task's terms: :math:`T \Lambda' T^T`,
    :math:`T (\eta' - \Lambda' \delta)` and :math:`-\tfrac12 \operatorname{tr}(\Lambda' C)
    - \tfrac12 \delta^T \Lambda' \delta + \delta^T \eta' + \tfrac12\log|B'| - \tfrac12 \eta'^T B'^{-1} \eta'`
    (module docstring), the ratio averaged over unshared jitter."""
    old = stored.inducing_variables
    check_mean_unchanged(old, stored.mean_module, mean_module)
    old_chol, old_precision, old_shift, old_prior_mean = map(
        to_working_dtype, (stored.chol, stored.precision, stored.shift, stored.prior_mean)
    )
    old_mean_now = old.prior_mean(mean_module)
    delta = -old_prior_mean if old_mean_now is None else to_working_dtype(old_mean_now) - old_prior_mean  # μ_a - μ'_a
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
        return bound, precision, shift
    R = solve_lower(chol, to_working_dtype(ivs.Kuu_cross(old, kernel)))  # L^{-1} K_ba
    # the stored ratio in the old variables' own coordinates z = a - μ'_a, averaged over their jitter
    old_kuu = to_working_dtype(to_dense(old.Kuu(kernel)))
    old_noise = old.unshared_jitter(ivs, old_kuu)
    ratio_precision, ratio_shift = unwhiten_ratio(old_precision, old_shift, old_chol)
    ratio_precision, ratio_shift, smoothing = smooth_ratio(ratio_precision, ratio_shift, old_noise)
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
    return bound, precision, shift


def keep_streams_without_points(observed: Tensor, new: tuple[Tensor, ...], old: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """The new summary for streams with a point in the task, the stored one, unchanged, for the others.

    :param observed: booleans ``(S,)``, ``True`` for the streams with a point in the task.
    :param new: the new summary's tensors, each with the streams first.
    :param old: the stored summary's tensors, in the same order.
    """
    kept = []
    for fresh, stored in zip(new, old):
        selector = observed.reshape(observed.shape + (1,) * (fresh.dim() - observed.dim()))
        kept.append(torch.where(selector, fresh, to_working_dtype(stored).expand_as(fresh)))
    return tuple(kept)


def with_shared_matrix(operation: Callable[[Tensor, Tensor], Tensor], matrix: Tensor, columns: Tensor) -> Tensor:
    """``operation(matrix, columns)`` (a product or a solve, column by column) for ``matrix`` ``(..., M, M)`` and
    ``columns`` ``(..., M, n)`` of broadcasting batch shapes, the batch dimensions along which ``matrix`` is shared
    folded into the columns: one operation per distinct matrix, whose gradient in it is then built once rather than
    per copy (fantasies of the same inputs share :math:`B`).

    :param operation: ``(matrix, columns) -> result`` ``(..., M', n)``, batched over leading dimensions.
    :param matrix: ``(..., M, M)``.
    :param columns: ``(..., M, n)``.
    """
    batch = torch.broadcast_shapes(matrix.shape[:-2], columns.shape[:-2])
    matrix = matrix.reshape((1,) * (len(batch) + 2 - matrix.dim()) + matrix.shape)
    shared = [d for d in range(len(batch)) if matrix.shape[d] == 1 and batch[d] > 1]
    if not shared:
        return operation(matrix, columns)
    own = [d for d in range(len(batch)) if d not in shared]
    columns = columns.expand(*batch, *columns.shape[-2:]).permute(*own, len(batch), *shared, len(batch) + 1)
    result = operation(
        matrix.reshape(*[matrix.shape[d] for d in own], *matrix.shape[-2:]),
        columns.reshape(*[batch[d] for d in own], columns.shape[len(own)], -1),
    )
    result = result.reshape(*[batch[d] for d in own], result.shape[-2], *[batch[d] for d in shared], -1)
    position = {d: i for i, d in enumerate(own)} | {d: len(own) + 1 + i for i, d in enumerate(shared)}
    return result.permute(*[position[d] for d in range(len(batch))], len(own), result.dim() - 1)


def whitened_mean(shift: Tensor, b_chol: Tensor) -> Tensor:
    r"""The mean :math:`B^{-1} \eta` of the whitened posterior :math:`q(v) = \mathcal N(B^{-1} \eta, B^{-1})`.

    :param shift: :math:`\eta` ``(..., M)``.
    :param b_chol: :math:`\operatorname{chol}(B)` ``(..., M, M)``.
    """
    return with_shared_matrix(lambda chol, rhs: torch.cholesky_solve(rhs, chol), b_chol, to_working_dtype(shift).unsqueeze(-1)).squeeze(-1)


def inducing_moments(stored: StoredTask, b_chol: Tensor) -> tuple[Tensor, Tensor]:
    r"""Mean and covariance of the stored :math:`q(a) = \mathcal{N}(\mu'_a + L' B'^{-1}\eta', L' B'^{-1} L'^T)`.

    :param stored: the stored summary.
    :param b_chol: :math:`\operatorname{chol}(B')` of ``stored`` (:func:`b_factor`).
    """
    mean_v = whitened_mean(stored.shift, b_chol)
    chol = to_working_dtype(stored.chol)
    factor = chol @ solve_lower(b_chol, torch.eye(b_chol.shape[-1], dtype=b_chol.dtype, device=b_chol.device)).mT
    mean = to_working_dtype(stored.prior_mean) + (chol @ mean_v.unsqueeze(-1)).squeeze(-1)
    return mean, factor @ factor.mT


def prediction_factors(
    kernel: gpytorch.kernels.Kernel, mean_module: gpytorch.means.Mean, stored: StoredTask, b_chol: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    r"""The factors of :math:`q(f(x))` that do not depend on :math:`x`: :math:`L = \operatorname{chol}(K_{aa})` at today's
    hyperparameters, the whitened mean :math:`m_w = L^{-1}(\mu'_a - \mu_a) + G B'^{-1}\eta'` and
    :math:`C = G B'^{-1} G^T - I` with :math:`G = L^{-1} L'`, so that
    :math:`q(f(x)) = \mathcal N(m(x) + W^T m_w, K_{xx} + W^T C W)`, :math:`W = L^{-1} K_{ax}`.

    :param kernel: today's kernel.
    :param mean_module: today's mean function.
    :param stored: the stored summary (its inducing variables are :math:`a`).
    :param b_chol: :math:`\operatorname{chol}(B')` of ``stored`` (:func:`b_factor`).
    """
    ivs = stored.inducing_variables
    chol_now = psd_safe_cholesky(to_working_dtype(to_dense(ivs.Kuu(kernel))))
    # q(b) was stored whitened by the Cholesky factor L' of the hyperparameters of its task;
    # G = L_now^{-1} L' maps it to the current whitening (identity if nothing changed).
    G = solve_lower(chol_now, to_working_dtype(stored.chol))
    mean_v = whitened_mean(stored.shift, b_chol)
    mean_now = ivs.prior_mean(mean_module)
    offset = to_working_dtype(stored.prior_mean)
    offset = offset if mean_now is None else offset - to_working_dtype(mean_now)
    mean_w = solve_lower(chol_now, offset.unsqueeze(-1)).squeeze(-1) + (G @ mean_v.unsqueeze(-1)).squeeze(-1)
    V = solve_lower(b_chol, G.mT)
    middle = V.mT @ V - torch.eye(V.shape[-1], dtype=V.dtype, device=V.device)
    return chol_now, mean_w, middle
