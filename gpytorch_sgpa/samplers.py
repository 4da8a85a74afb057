"""Samplers of an SGPA layer's head outputs: one reparameterised draw (thesis eq. (3.17)) from the
posterior terms of the standard (thesis eq. (3.4)) or decoupled (thesis eq. (3.15)) posterior.

* ``"diagonal"``: each position independently from its marginal ``N(m_d(q), Σ_d(q, q))`` (the
  diagonalised covariance of the thesis's sampler, App. B.4); ``O(B H L e M²)`` for the marginal
  variances with one ``S_g`` per output dimension, ``O(B H L M²)`` with ``share_covariance``;
* ``"full"``: ``m + chol(Σ) ε``; standard: ``chol = L_S``; decoupled:
  ``m + chol(K_qq - Q_qq) ε + A C_d ε_g`` with ``A = K_qg K_gg⁻¹``, ``Q_qq = A K_gg Aᵀ`` (one
  ``L × L`` Cholesky per sequence and head, shared by the output dimensions),
  ``O(B H (L³ + L² e + L M e + e M²))``;
* ``"decomposed"`` (decoupled only): thesis eq. (3.15) written as ``Σ_d = (K_qq - Q_qq) + A S_g,d Aᵀ``;
  ``f_d(q) = m_d(q) + A_q C_d ε_d + sqrt(k(q, q) - Q_qq(q, q)) ξ_{q,d}`` with ``ε_d ~ N(0, I_M)``
  drawn once per sequence and ``ξ`` iid.  The marginals are exact (``ε`` and ``ξ`` independent);
  the residual's off-diagonal is dropped.  ``O(B H (e M² + L M e))`` on top of the mean's solve.

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
    """What a posterior hands to :meth:`~gpytorch_sgpa.attention.SGPAttention.posterior` and to the samplers.

    ``mean`` ``(B, H, L, e)`` (for the decoupled ``"full"``/``"decomposed"`` samplers it already
    holds the correlated global part ``Aᵀ W_d ε_d`` of the sample); ``variance`` ``(B, H, L, e)``
    marginal variances; ``covariance`` ``(B, H, e, L, L)``; ``kl`` ``(B,)``; ``chol_factor``
    ``(B, H, L, L)`` a square root of the covariance shared by the output dimensions;
    ``residual_variance`` ``(B, H, L)`` the diagonal of ``K_qq - Q_qq``; ``global_kl`` the scalar part
    of every sequence's KL that the global inducing variables contribute (decoupled only).
    Unneeded terms are ``None``.
    """

    mean: Tensor
    variance: Tensor | None
    covariance: Tensor | None
    kl: Tensor
    chol_factor: Tensor | None = None
    residual_variance: Tensor | None = None
    global_kl: Tensor | None = None


def diagonal_sample(terms: PosteriorTerms, local: Tensor, jitter: Tensor) -> Tensor:
    """Independent marginals ``m + sqrt(Σ_d(q, q)) ξ`` (the thesis's diagonalised sampler, App. B.4)."""
    return torch.addcmul(terms.mean, terms.variance.clamp_min(jitter).sqrt(), local)


def full_sample(terms: PosteriorTerms, local: Tensor, jitter: Tensor) -> Tensor:
    """Full covariance ``m + L ξ`` with ``L`` the posterior's square-root factor (thesis eq. (3.17))."""
    return terms.mean + terms.chol_factor.matmul(local)


def decomposed_sample(terms: PosteriorTerms, local: Tensor, jitter: Tensor) -> Tensor:
    """``m + A C_d ε_d`` (already in ``mean``) ``+ sqrt(diag(K_qq - Q_qq)) ξ``."""
    return torch.addcmul(terms.mean, terms.residual_variance.unsqueeze(-1).clamp_min(jitter).sqrt(), local)


#: Each sampler's function, by name.
SAMPLERS = {"diagonal": diagonal_sample, "full": full_sample, "decomposed": decomposed_sample}
#: The sampler names an SGPA layer accepts (``sampler=``).
SGPA_SAMPLERS = tuple(SAMPLERS)
