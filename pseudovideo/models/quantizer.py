r"""Vector quantisation and the VQ-VAE loss (thesis §5.3, eqs. (5.5) and (5.6)).

The nearest-code search, the codebook storage and the replacement of dead codes come from
``vector_quantize_pytorch.VectorQuantize`` (learnable codebook, no EMA update, no rotation trick);
the loss is written here because the thesis's objective weights its two terms differently from
the library's single commitment term:

.. math::

    L_\mathrm{vq} = \lVert \mathrm{sg}(f(x)) - e_k \rVert^2 + \beta \lVert f(x) - \mathrm{sg}(e_k) \rVert^2,
    \qquad k = \arg\min_i \lVert f(x) - e_i \rVert,

averaged over tokens and feature dimensions (the squared norms divided by ``dim``), with
:math:`\mathrm{sg}` the stop-gradient. The decoder sees :math:`f(x) + \mathrm{sg}(e_k - f(x))`: the
value :math:`e_k` with the straight-through gradient of :math:`f(x)`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from probseq._optional import missing
from probseq._validation import check_int, check_real, check_tensor

try:
    from vector_quantize_pytorch import VectorQuantize
except ImportError as _error:
    raise missing("vector-quantize-pytorch", "video", "pseudovideo.models.quantizer") from _error


class QuantizerOutput(NamedTuple):
    r"""What :meth:`VectorQuantizer.forward` returns.

    :param quantized: ``(..., dim)``: the codes :math:`e_k` in value, with the straight-through
        gradient of the features.
    :param indices: ``(...,)`` int64 indices :math:`k` of the nearest codes.
    :param loss: scalar :math:`L_\mathrm{vq}`, codebook term plus ``beta`` times the commitment term
        (the thesis's eq. (5.6) without the likelihood term).
    :param perplexity: scalar, ``exp`` of the entropy of the codes' empirical frequencies: 1 when every
        feature maps to one code (collapse), ``codebook_size`` when all codes are used equally.
    """

    quantized: torch.Tensor  # (..., dim): e_k in value, straight-through gradient to the features
    indices: torch.Tensor  # (...,) int64 codes
    # codebook + beta * commitment, ||sg(f(x)) - e_k||² + beta ||f(x) - sg(e_k)||²
    # (thesis eq. (5.6), the VQ-VAE loss of van den Oord et al. (2017), without the likelihood term)
    loss: torch.Tensor
    perplexity: torch.Tensor  # exp(entropy of the codes' empirical frequencies): 1 = collapse, K = uniform


class VectorQuantizer(nn.Module):
    r"""Quantise ``(..., dim)`` features to the nearest of ``codebook_size`` learnable codes.

    :param dim: the feature dimension (the last axis of the features and of each code).
    :param codebook_size: the number of codes, at least 2.
    :param beta: the commitment weight :math:`\beta > 0` of the loss (module docstring).
    :param dead_code_threshold: codes whose (decayed) usage count drops below it are re-seeded with
        features of the current batch (``VectorQuantize``'s ``threshold_ema_dead_code``; 0 disables it).
    """

    def __init__(self, dim: int, codebook_size: int = 1024, beta: float = 0.25, dead_code_threshold: float = 2.0):
        super().__init__()
        check_int(dim, "dim")
        check_int(codebook_size, "codebook_size", low=2)
        beta = check_real(beta, "beta (commitment weight)", low=0.0, low_open=True)
        dead_code_threshold = check_real(dead_code_threshold, "dead_code_threshold", low=0.0)
        self.dim, self.codebook_size, self.beta = dim, codebook_size, beta
        self.vq = VectorQuantize(
            dim=dim,
            codebook_size=codebook_size,
            learnable_codebook=True,
            ema_update=False,
            commitment_weight=0.0,
            rotation_trick=False,
            threshold_ema_dead_code=dead_code_threshold,
        )

    @property
    def codebook(self) -> torch.Tensor:
        """The ``(codebook_size, dim)`` code vectors ``e_i``."""
        return self.vq.codebook

    def forward(self, features: torch.Tensor, update_codebook: bool = True) -> QuantizerOutput:
        """Quantise ``features``; ``update_codebook=False`` leaves usage counts and dead codes untouched.

        :param features: ``(..., dim)`` finite floating-point features :math:`f(x)`.
        :param update_codebook: whether to update the codes' usage counts and re-seed dead codes.
        """
        if not isinstance(features, torch.Tensor) or not features.is_floating_point():
            raise TypeError("features must be a floating-point tensor")
        if features.dim() < 2 or features.shape[-1] != self.dim:
            raise ValueError(f"features must have shape (..., {self.dim}), got {tuple(features.shape)}")
        check_tensor(features, "features", non_empty=True)
        flat = features.reshape(1, -1, self.dim)
        codebook = self.codebook.clone()  # the codes the search sees, before any dead-code re-seeding
        _, indices, _ = self.vq(flat, freeze_codebook=not update_codebook)
        codes = F.embedding(indices, codebook).to(features.dtype).reshape(features.shape)
        indices = indices.reshape(features.shape[:-1])
        loss = F.mse_loss(codes, features.detach()) + self.beta * F.mse_loss(features, codes.detach())
        quantized = features + (codes - features).detach()
        return QuantizerOutput(quantized, indices, loss, codebook_perplexity(indices, self.codebook_size))

    def lookup(self, indices: torch.Tensor) -> torch.Tensor:
        """Code vectors ``e_k`` of integer ``indices`` (any shape), shape ``(*indices.shape, dim)``.

        :param indices: int64 or int32 code indices in ``[0, codebook_size)``, of any shape.
        """
        check_tokens(indices, self.codebook_size, "indices")
        return F.embedding(indices, self.codebook)


def codebook_perplexity(indices: torch.Tensor, codebook_size: int) -> torch.Tensor:
    r""":math:`\exp(-\sum_k p_k \log p_k)` of the empirical code frequencies :math:`p_k` in ``indices``.

    :param indices: integer code indices, of any shape.
    :param codebook_size: the number of codes :math:`K`; the result lies in :math:`[1, K]`.
    """
    frequencies = torch.bincount(indices.reshape(-1), minlength=codebook_size).double() / indices.numel()
    entropy = -(frequencies * frequencies.clamp_min(1e-300).log()).sum()
    return entropy.exp().float()


def check_tokens(tokens, codebook_size: int, name: str = "tokens") -> None:
    """Raise a named error unless ``tokens`` is an integer tensor with values in ``[0, codebook_size)``.

    :param tokens: the value checked: an int64 or int32 tensor is required.
    :param codebook_size: the number of codes; values must lie in ``[0, codebook_size)``.
    :param name: what the error messages call ``tokens``.
    """
    if not isinstance(tokens, torch.Tensor) or tokens.dtype not in (torch.int64, torch.int32):
        raise TypeError(
            f"{name} must be an int64/int32 tensor, got {tokens.dtype if isinstance(tokens, torch.Tensor) else type(tokens).__name__}"
        )
    if tokens.numel() and (tokens.min() < 0 or tokens.max() >= codebook_size):
        raise ValueError(f"{name} must lie in [0, {codebook_size}), got range [{int(tokens.min())}, {int(tokens.max())}]")
