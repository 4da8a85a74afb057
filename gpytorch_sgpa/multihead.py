"""Multi-head attention state shared by every layer: the key/value cache of causal decoding, the
record of a forward call's KL terms, and the Cholesky factor of the GP algebra."""

from __future__ import annotations

from dataclasses import dataclass

import gpytorch
import torch
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor

from ._validation import checks_on_host

__all__ = ["SGPAStepState"]


def psd_cholesky(matrix: Tensor) -> Tensor:
    """Cholesky factor of a batch of p.s.d. matrices, with jitter escalation where it fails.

    Eager on the CPU this is ``linear_operator``'s ``psd_safe_cholesky`` (jitter × 10ⁱ added to the
    failed matrices, then ``NotPSDError``).  On accelerators and under ``torch.compile`` it never
    waits for the device: every matrix is tried as given (no gradient), those that fail get
    ``psd_safe_cholesky``'s largest jitter, and the factor is recomputed once with gradient; a
    matrix that fails even then gets a NaN factor (so the loss is NaN) instead of ``NotPSDError``.
    Where no matrix fails, both paths return the same factor.

    :param matrix: the symmetric positive semi-definite matrices, ``(..., n, n)``.
    """
    if checks_on_host(matrix):
        return psd_safe_cholesky(matrix)
    with torch.no_grad():
        failed = torch.linalg.cholesky_ex(matrix)[1] > 0
        tries = gpytorch.settings.cholesky_max_tries.value()
        largest = gpytorch.settings.cholesky_jitter.value(matrix.dtype) * 10 ** (tries - 1)
        jitter = torch.diag_embed((failed.to(matrix.dtype) * largest)[..., None].expand(matrix.shape[:-1]))  # 0 or largest
    factor, info = torch.linalg.cholesky_ex(matrix + jitter)
    return factor.masked_fill((info > 0)[..., None, None], float("nan"))


class ForwardKL:
    r"""The KL terms of a layer's most recent forward call (read by ``gpytorch_sgpa.kl_divergence``).

    ``total``: the batch-mean per-sequence KL the call returned; ``global_``: its part from the
    global inducing variables (decoupled SGPA; ``0`` for standard).  Both carry the autograd graph
    of that call, so a copy (``copy.deepcopy``, pickling) starts empty instead of copying the graph,
    which ``deepcopy`` of a non-leaf tensor would refuse.

    :param total: the batch-mean per-sequence KL of the call (a scalar tensor); ``None`` (the default): no call yet.
    :param global\_: the part of ``total`` from the global inducing variables (a scalar tensor); ``None`` (the default):
        no call yet.
    """

    __slots__ = ("total", "global_")

    def __init__(self, total: Tensor | None = None, global_: Tensor | None = None):
        self.total = total
        self.global_ = global_

    def __deepcopy__(self, memo) -> ForwardKL:
        return ForwardKL()

    def __reduce__(self):
        return (ForwardKL, ())


@dataclass
class SGPAStepState:
    r"""Key/value cache of a causal attention layer for autoregressive prediction.

    Created by the first ``forward_step`` call of a causal :class:`~gpytorch_sgpa.attention.SGPAttention`,
    :class:`~gpytorch_sgpa.attention.KernelAttention` or :class:`~gpytorch_sgpa.attention.ScaledDotProductAttention`
    and updated in place by the following ones (the maximum-likelihood layers use ``keys`` and
    ``values`` only).  ``length`` tokens have been processed.

    :param keys: the keys of the processed positions, ``(B, H, t, e)`` (for SGPA the projected queries, which are the
        amortised keys).
    :param values: the values of the processed positions, ``(B, H, t, e)``.
    :param global_factors: the decoupled layer's :class:`~gpytorch_sgpa.decoupled.GlobalFactors`, computed at the first
        step; ``None`` (the default) otherwise.
    :param projected_values: :math:`\sum_j a_j v_j^\top` over the prefix, ``(B, H, M, e)`` (decoupled); ``None``
        (the default) otherwise.
    :param whitened_keys: :math:`a_j = L^{-1} K_{g k_j}` of the prefix, ``(B, H, M, t)`` (decoupled, ``"full"`` and
        ``"diagonal"`` samplers); ``None`` (the default) otherwise.
    :param conditional_chol: the Cholesky factor of :math:`K_{qq} - A^\top A` over the prefix, ``(B, H, t, t)``
        (decoupled, ``"full"`` sampler); ``None`` (the default) otherwise.
    :param local_noise: the standard-normal draws of the prefix's positions, ``(B, H, t, e)`` (SGPA); ``None`` (the
        default) otherwise.
    :param global_noise: the standard-normal draws of the global part, ``(B, H, e, M)`` (decoupled, ``"full"`` and
        ``"decomposed"`` samplers); ``None`` (the default) otherwise.
    """

    keys: Tensor  # (B, H, t, e)
    values: Tensor  # (B, H, t, e)
    global_factors: object | None = None  # decoupled.GlobalFactors
    projected_values: Tensor | None = None  # Σ_j a_j v_jᵀ, (B, H, M, e) (orthogonal variant)
    whitened_keys: Tensor | None = None  # a_j = L⁻¹ K_g,k_j, (B, H, M, t) (full covariance)
    conditional_chol: Tensor | None = None  # chol of K_qq - AᵀA over the prefix, (B, H, t, t)
    local_noise: Tensor | None = None  # (B, H, t, e) (full covariance)
    global_noise: Tensor | None = None  # (B, H, e, M) (full covariance, decoupled)

    @property
    def length(self) -> int:
        return self.keys.shape[-2]
