r"""Standard SGPA posterior (thesis eq. (3.4), KL of App. B.1.1): the inducing inputs are the
amortised keys only and the variational covariance is input dependent.

:math:`q = k_a` (shared projection), so thesis eq. (3.4) reduces to mean :math:`K_{qk} v_a` and covariance
:math:`S = L_S L_S^\top`, with row :math:`i` of :math:`L_S` the projection :math:`s_i W_s` (strictly lower part;
diagonal through ``exp``), tied across output dimensions.  The functions take the
:class:`~gpytorch_sgpa.attention.SGPAttention` layer whose parameters they read.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._numerics import gp_dtype, masked_cholesky, relative_jitter
from .samplers import PosteriorTerms


def standard_cov_factor(layer, x: Tensor, key_padding_mask: Tensor | None) -> Tensor:
    r""":math:`L_S` of thesis eq. (3.4) (the input-dependent Cholesky factor of the variational covariance
    :math:`S = L_S L_S^\top`), ``(B, H, L, L)``.

    :param layer: the standard-mode :class:`~gpytorch_sgpa.attention.SGPAttention` layer (its ``cov_proj``, :math:`W_s`).
    :param x: the layer input :math:`s`, ``(B, L, d_model)`` with :math:`L \le` ``max_len``.
    :param key_padding_mask: bool ``(B, L)``, ``True`` at padded positions (their rows and columns become those of the
        identity), or ``None``.
    """
    batch, length, _ = x.shape
    if length > layer.max_len:
        raise ValueError(f"sequence length {length} exceeds max_len={layer.max_len} of mode='standard'")
    raw = layer.cov_proj(x).to(gp_dtype(x.dtype))
    raw = raw.view(batch, length, layer.num_heads, layer.max_len).transpose(1, 2)[..., :length]
    factor = raw.tril(-1) + torch.diag_embed(raw.diagonal(dim1=-2, dim2=-1).exp())
    if key_padding_mask is not None:
        valid = (~key_padding_mask)[:, None, :].to(factor.dtype)
        factor = factor * valid.unsqueeze(-1) * valid.unsqueeze(-2)
        factor = factor + torch.diag_embed(key_padding_mask[:, None, :].to(factor.dtype)).expand_as(factor)
    return factor


def standard_kl(layer, gram, gram_values, values, factor, key_padding_mask) -> Tensor:
    r"""Per-sequence KL (thesis App. B.1.1 with :math:`v = K^{-1} m_u`), ``(B,)``:
    :math:`\tfrac12 [e (\operatorname{tr}(K^{-1} S) - L + \log|K| - \log|S|) + \sum_d v_d^\top K v_d]` per head.

    :param layer: the standard-mode :class:`~gpytorch_sgpa.attention.SGPAttention` layer.
    :param gram: :math:`K = K_{kk}`, the kernel matrix of the amortised keys, ``(B, H, L, L)``.
    :param gram_values: :math:`K v`, ``(B, H, L, e)``.
    :param values: the amortised values :math:`v`, ``(B, H, L, e)``, zero at padded positions.
    :param factor: :math:`L_S` of :func:`standard_cov_factor`, ``(B, H, L, L)``.
    :param key_padding_mask: bool ``(B, L)``, ``True`` at padded positions, or ``None``.
    """
    length = gram.shape[-1]
    valid = None if key_padding_mask is None else (~key_padding_mask)[:, None, :]
    chol = masked_cholesky(gram, valid, relative_jitter(layer.kernel, gram.dtype))
    whitened = torch.linalg.solve_triangular(chol, factor, upper=False)
    per_dim = (
        whitened.square().sum((-2, -1))
        - length
        + 2.0 * chol.diagonal(dim1=-2, dim2=-1).log().sum(-1)
        - 2.0 * factor.diagonal(dim1=-2, dim2=-1).log().sum(-1)
    )  # (B, H); padded positions contribute exactly 0
    return 0.5 * (layer.head_dim * per_dim.sum(-1) + (values * gram_values).sum((-3, -2, -1)))


def standard_terms(layer, x, values, gram, gram_values, amortised_mean, key_padding_mask, full_covariance) -> PosteriorTerms:
    r"""Mean :math:`K_{qk} v_a`, covariance :math:`L_S L_S^\top` (tied over dimensions), KL; ``chol_factor`` is
    :math:`L_S`.

    :param layer: the standard-mode :class:`~gpytorch_sgpa.attention.SGPAttention` layer.
    :param x: the layer input :math:`s`, ``(B, L, d_model)``.
    :param values: the amortised values :math:`v_a`, ``(B, H, L, e)``, zero at padded positions.
    :param gram: :math:`K_{qk}` (queries equal keys), ``(B, H, L, L)``.
    :param gram_values: :math:`K_{qk} v_a`, ``(B, H, L, e)``.
    :param amortised_mean: :math:`K_{qk} v_a` with the causal mask applied (``gram_values`` for a non-causal layer),
        ``(B, H, L, e)``: the posterior mean.
    :param key_padding_mask: bool ``(B, L)``, ``True`` at padded positions, or ``None``.
    :param full_covariance: whether to return the covariance ``(B, H, e, L, L)`` as well (else ``None``).
    """
    factor = standard_cov_factor(layer, x, key_padding_mask)
    variance = factor.square().sum(-1).unsqueeze(-1).expand_as(amortised_mean)
    covariance = None
    if full_covariance:
        covariance = factor.matmul(factor.transpose(-2, -1)).unsqueeze(2).expand(-1, -1, layer.head_dim, -1, -1)
    kl = standard_kl(layer, gram, gram_values, values, factor, key_padding_mask)
    return PosteriorTerms(amortised_mean, variance, covariance, kl, chol_factor=factor)


def standard_step_sample(layer, x_t, position, mean, state) -> Tensor:
    r"""Sample at the new position :math:`t`: row :math:`t` of :math:`L_S` times the noise of positions :math:`\le t`.

    :param layer: the causal standard-mode :class:`~gpytorch_sgpa.attention.SGPAttention` layer.
    :param x_t: the new position's layer input, ``(B, 1, d_model)``.
    :param position: the new position's index :math:`t` (0-based, below ``max_len``).
    :param mean: the posterior mean at position :math:`t`, ``(B, H, 1, e)``.
    :param state: the layer's :class:`~gpytorch_sgpa.multihead.SGPAStepState` (its ``local_noise`` of positions
        :math:`\le t`, ``(B, H, t + 1, e)``).
    """
    if position >= layer.max_len:
        raise ValueError(f"sequence length {position + 1} exceeds max_len={layer.max_len} of mode='standard'")
    raw = layer.cov_proj(x_t).to(mean.dtype).view(x_t.shape[0], layer.num_heads, layer.max_len)[..., : position + 1]
    row = torch.cat([raw[..., :position], raw[..., position:].exp()], dim=-1).unsqueeze(-2)  # (B,H,1,t+1)
    if layer.sampler == "diagonal":
        return mean + row.square().sum(-1, keepdim=True).sqrt() * state.local_noise[..., -1:, :]
    return mean + row.matmul(state.local_noise)
