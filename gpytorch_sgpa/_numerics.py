"""Numerics of the GP algebra shared by the attention layers: its dtype, the relative Cholesky
jitter, the Cholesky factor of padded Gram matrices, and the causal mask."""

from __future__ import annotations

import gpytorch
import torch
from torch import Tensor

from .multihead import psd_cholesky

__all__ = ["causal_mask", "gp_dtype", "masked_cholesky", "no_autocast", "relative_jitter"]


def gp_dtype(dtype: torch.dtype) -> torch.dtype:
    """The GP algebra (Gram matrices, Cholesky, solves, KL) runs in float32 at least."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def relative_jitter(kernel, dtype: torch.dtype, params=None) -> Tensor:
    """``gpytorch.settings.cholesky_jitter`` times each head's ``σ_f²``, shaped ``(H, 1, 1)``
    (``σ_f²`` from ``params``, :class:`~gpytorch_sgpa.kernels.ExpKernelParameters`, when given).

    An absolute jitter is swamped (or swamps) when ``σ_f²`` is far from 1; relative to ``σ_f²``
    it is the same fraction of every Gram matrix's scale (``k(x, x) >= σ_f²`` for both kernels).
    """
    scale = (kernel.outputscale if params is None else params.outputscale).detach().to(dtype)
    return gpytorch.settings.cholesky_jitter.value(dtype) * scale.reshape(-1, 1, 1)


def no_autocast(x: Tensor):
    """Context in which the GP algebra runs in its own dtype, not autocast's."""
    return torch.autocast(device_type=x.device.type, enabled=False)


def causal_mask(length: int, device) -> Tensor:
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()


def masked_cholesky(matrix: Tensor, valid: Tensor | None, jitter: Tensor) -> Tensor:
    """Cholesky of ``matrix + jitter I`` over the valid positions (``valid``: bool ``(B, 1, L)``);
    padded rows/columns are replaced by the identity, so they contribute exactly 0 to log-dets."""
    eye = torch.eye(matrix.shape[-1], dtype=matrix.dtype, device=matrix.device)
    if valid is None:
        return psd_cholesky(matrix + jitter * eye)
    pair = valid.unsqueeze(-1) & valid.unsqueeze(-2)
    matrix = matrix.masked_fill(~pair, 0.0) + torch.diag_embed((~valid).to(matrix.dtype))
    return psd_cholesky(matrix + jitter * torch.diag_embed(valid.to(matrix.dtype)))
