r"""Standard SGPA posterior (thesis eq. (3.4), KL of App. B.1.1): the inducing inputs are the
amortised keys only and the variational covariance is input dependent.

``q = k_a`` (shared projection), so thesis eq. (3.4) reduces to mean ``K_qk v_a`` and covariance
``S = L_S L_Sᵀ``, with row ``i`` of ``L_S`` the projection ``s_i W_s`` (strictly lower part;
diagonal through ``exp``), tied across output dimensions.  The functions take the
:class:`~gpytorch_sgpa.attention.SGPAttention` layer whose parameters they read.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .multihead import _gp_dtype, _masked_cholesky, _relative_jitter
from .samplers import PosteriorTerms


def standard_cov_factor(layer, x: Tensor, key_padding_mask: Tensor | None) -> Tensor:
    """``L_S`` of thesis eq. (3.4) (input-dependent Cholesky factor), ``(B, H, L, L)``."""
    batch, length, _ = x.shape
    if length > layer.max_len:
        raise ValueError(f"sequence length {length} exceeds max_len={layer.max_len} of mode='standard'")
    raw = layer.cov_proj(x).to(_gp_dtype(x.dtype))
    raw = raw.view(batch, length, layer.num_heads, layer.max_len).transpose(1, 2)[..., :length]
    factor = raw.tril(-1) + torch.diag_embed(raw.diagonal(dim1=-2, dim2=-1).exp())
    if key_padding_mask is not None:
        valid = (~key_padding_mask)[:, None, :].to(factor.dtype)
        factor = factor * valid.unsqueeze(-1) * valid.unsqueeze(-2)
        factor = factor + torch.diag_embed(key_padding_mask[:, None, :].to(factor.dtype)).expand_as(factor)
    return factor


def standard_kl(layer, gram, gram_values, values, factor, key_padding_mask) -> Tensor:
    """Per-sequence KL (App. B.1.1 with ``v = K⁻¹ m_u``), ``(B,)``:
    ``½ [e (tr(K⁻¹ S) - L + log|K| - log|S|) + Σ_d v_dᵀ K v_d]`` per head."""
    length = gram.shape[-1]
    valid = None if key_padding_mask is None else (~key_padding_mask)[:, None, :]
    chol = _masked_cholesky(gram, valid, _relative_jitter(layer.kernel, gram.dtype))
    whitened = torch.linalg.solve_triangular(chol, factor, upper=False)
    per_dim = (
        whitened.square().sum((-2, -1))
        - length
        + 2.0 * chol.diagonal(dim1=-2, dim2=-1).log().sum(-1)
        - 2.0 * factor.diagonal(dim1=-2, dim2=-1).log().sum(-1)
    )  # (B, H); padded positions contribute exactly 0
    return 0.5 * (layer.head_dim * per_dim.sum(-1) + (values * gram_values).sum((-3, -2, -1)))


def standard_terms(layer, x, values, gram, gram_values, amortised_mean, key_padding_mask, full_covariance) -> PosteriorTerms:
    """Mean ``K_qk v_a``, covariance ``L_S L_Sᵀ`` (tied over dimensions), KL; ``chol_factor = L_S``."""
    factor = standard_cov_factor(layer, x, key_padding_mask)
    variance = factor.square().sum(-1).unsqueeze(-1).expand_as(amortised_mean)
    covariance = None
    if full_covariance:
        covariance = factor.matmul(factor.transpose(-2, -1)).unsqueeze(2).expand(-1, -1, layer.head_dim, -1, -1)
    kl = standard_kl(layer, gram, gram_values, values, factor, key_padding_mask)
    return PosteriorTerms(amortised_mean, variance, covariance, kl, chol_factor=factor)


def standard_step_sample(layer, x_t, position, mean, state) -> Tensor:
    """Sample at the new position ``t``: row ``t`` of ``L_S`` times the noise of positions ``≤ t``."""
    if position >= layer.max_len:
        raise ValueError(f"sequence length {position + 1} exceeds max_len={layer.max_len} of mode='standard'")
    raw = layer.cov_proj(x_t).to(mean.dtype).view(x_t.shape[0], layer.num_heads, layer.max_len)[..., : position + 1]
    row = torch.cat([raw[..., :position], raw[..., position:].exp()], dim=-1).unsqueeze(-2)  # (B,H,1,t+1)
    if layer.sampler == "diagonal":
        return mean + row.square().sum(-1, keepdim=True).sqrt() * state.local_noise[..., -1:, :]
    return mean + row.matmul(state.local_noise)
