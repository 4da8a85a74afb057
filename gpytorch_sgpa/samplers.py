r"""Samplers of an SGPA layer's head outputs: one reparameterised draw (thesis eq. (3.17)) from the
posterior terms of the standard (thesis eq. (3.4)) or decoupled (thesis eq. (3.15)) posterior.

* ``"diagonal"``: each position independently from its marginal :math:`\mathcal{N}(m_d(q), \Sigma_d(q, q))` (the
  diagonalised covariance of the thesis's sampler, App. B.4); :math:`O(B H L e M^2)` for the marginal
  variances with one :math:`S_g` per output dimension, :math:`O(B H L M^2)` with ``share_covariance``;
* ``"full"``: :math:`m + \operatorname{chol}(\Sigma)\, \varepsilon`; standard: :math:`\operatorname{chol} = L_S`; decoupled:
  :math:`m + \operatorname{chol}(K_{qq} - Q_{qq})\, \varepsilon + A C_d \varepsilon_g` with :math:`A = K_{qg} K_{gg}^{-1}`,
  :math:`Q_{qq} = A K_{gg} A^\top` (one ``L × L`` Cholesky per sequence and head, shared by the output dimensions),
  :math:`O(B H (L^3 + L^2 e + L M e + e M^2))`;
* ``"decomposed"`` (decoupled only): thesis eq. (3.15) written as :math:`\Sigma_d = (K_{qq} - Q_{qq}) + A S_{g,d} A^\top`;
  :math:`f_d(q) = m_d(q) + A_q C_d \varepsilon_d + \sqrt{k(q, q) - Q_{qq}(q, q)}\, \xi_{q,d}` with
  :math:`\varepsilon_d \sim \mathcal{N}(0, I_M)` drawn once per sequence and :math:`\xi` iid.  The marginals are exact
  (:math:`\varepsilon` and :math:`\xi` independent); the residual's off-diagonal is dropped.
  :math:`O(B H (e M^2 + L M e))` on top of the mean's solve.

Variances are clamped below at the (relative) Cholesky jitter before square roots.  Each sampler
is a function ``(terms, local_noise, jitter) -> sample`` of a :class:`PosteriorTerms`;
the posterior computes only the terms its sampler reads.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["PosteriorTerms", "SAMPLERS", "SGPA_SAMPLERS"]


class PosteriorTerms(NamedTuple):
    r"""What a posterior hands to :meth:`~gpytorch_sgpa.attention.SGPAttention.posterior` and to the samplers.

    Unneeded terms are ``None``.

    :param mean: the posterior mean, ``(B, H, L, e)``; for the decoupled ``"full"``/``"decomposed"`` samplers it
        already holds the correlated global part :math:`A^\top W_d \varepsilon_d` of the sample.
    :param variance: the marginal variances, ``(B, H, L, e)``, or ``None``.
    :param covariance: the covariance across positions per output dimension, ``(B, H, e, L, L)``, or ``None``.
    :param kl: the per-sequence KL, ``(B,)``.
    :param chol_factor: a square root of the covariance shared by the output dimensions, ``(B, H, L, L)``, or ``None``
        (the default).
    :param residual_variance: the diagonal of :math:`K_{qq} - Q_{qq}`, ``(B, H, L)``, or ``None`` (the default).
    :param global_kl: the scalar part of every sequence's KL that the global inducing variables contribute (decoupled
        only); ``None`` (the default) otherwise.
    """

    mean: Tensor
    variance: Tensor | None
    covariance: Tensor | None
    kl: Tensor
    chol_factor: Tensor | None = None
    residual_variance: Tensor | None = None
    global_kl: Tensor | None = None


def _term(value: Tensor | None, name: str, sampler: str) -> Tensor:
    """The term ``name`` a sampler reads; ``ValueError`` if the posterior did not compute it (terms of another sampler)."""
    if value is None:
        raise ValueError(f"the {sampler!r} sampler needs terms.{name}, which these posterior terms do not hold (built for another sampler)")
    return value


def diagonal_sample(terms: PosteriorTerms, local: Tensor, jitter: Tensor) -> Tensor:
    r"""Independent marginals :math:`m + \sqrt{\Sigma_d(q, q)}\, \xi` (the thesis's diagonalised sampler, App. B.4;
    Chen & Li (2023), SGPA).

    :param terms: the posterior terms (``mean`` and ``variance`` are read).
    :param local: the standard-normal draws :math:`\xi`, ``(B, H, L, e)``.
    :param jitter: the lower clamp of the variances before the square root (the relative Cholesky jitter).
    """
    return torch.addcmul(terms.mean, _term(terms.variance, "variance", "diagonal").clamp_min(jitter).sqrt(), local)


def full_sample(terms: PosteriorTerms, local: Tensor, jitter: Tensor) -> Tensor:
    r"""Full covariance :math:`m + L \xi` with :math:`L` the posterior's square-root factor (thesis eq. (3.17), the
    reparameterised sample of Chen & Li (2023), SGPA).

    :param terms: the posterior terms (``mean`` and ``chol_factor`` are read).
    :param local: the standard-normal draws :math:`\xi`, ``(B, H, L, e)``.
    :param jitter: unused (the factor already holds the jitter); accepted for the samplers' common signature.
    """
    return terms.mean + _term(terms.chol_factor, "chol_factor", "full").matmul(local)


def decomposed_sample(terms: PosteriorTerms, local: Tensor, jitter: Tensor) -> Tensor:
    r""":math:`m + A C_d \varepsilon_d` (already in ``mean``) :math:`+ \sqrt{\operatorname{diag}(K_{qq} - Q_{qq})}\, \xi`.

    :param terms: the posterior terms (``mean`` and ``residual_variance`` are read).
    :param local: the standard-normal draws :math:`\xi`, ``(B, H, L, e)``.
    :param jitter: the lower clamp of the residual variances before the square root (the relative Cholesky jitter).
    """
    residual_variance = _term(terms.residual_variance, "residual_variance", "decomposed")
    return torch.addcmul(terms.mean, residual_variance.unsqueeze(-1).clamp_min(jitter).sqrt(), local)


#: Each sampler's function, by name.
SAMPLERS = {"diagonal": diagonal_sample, "full": full_sample, "decomposed": decomposed_sample}
#: The sampler names an SGPA layer accepts (``sampler=``).
SGPA_SAMPLERS = tuple(SAMPLERS)
