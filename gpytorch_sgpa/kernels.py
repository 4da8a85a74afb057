"""Kernels for (sparse Gaussian process) attention.

Thesis App. B.3 ("Training settings"): kernel attention uses either the exponential kernel
``k(x, x') = σ_f² exp(Σ_j x_j x'_j / σ_j²)`` (text tasks) or the ARD-RBF kernel
``k(x, x') = σ_f² exp(-½ Σ_j (x_j - x'_j)² / σ_j²)`` (image tasks).  Both are GPyTorch kernels; the
output scale ``σ_f²`` comes from :class:`gpytorch.kernels.ScaleKernel`.

Attention evaluates one kernel per head on tensors shaped ``(batch, heads, L, d)``.  The kernels
built by :func:`make_attention_kernel` carry ``batch_shape=(heads,)`` so every head has its own
hyperparameters, and :func:`evaluate_kernel` evaluates them densely on such tensors (the head
dimension is the kernel's batch dimension; any leading dimensions broadcast).
"""

from __future__ import annotations

import math

import torch
from gpytorch.kernels import Kernel, RBFKernel, ScaleKernel
from torch import Tensor

__all__ = ["ExponentialKernel", "KERNEL_NAMES", "make_attention_kernel", "evaluate_kernel"]

KERNEL_NAMES = ("rbf", "exponential")


class ExponentialKernel(Kernel):
    r"""Exponential (dot-product) kernel ``k(x, x') = exp(Σ_j x_j x'_j / σ_j²)``.

    The kernel of Tsai et al. (2019) used for kernel attention in the thesis (App. B.3).  The
    lengthscales ``σ_j`` are GPyTorch lengthscales (ARD when ``ard_num_dims`` is given); wrap the
    kernel in :class:`~gpytorch.kernels.ScaleKernel` for the output scale ``σ_f²``.  The kernel is
    positive definite because it is the exponential of the linear kernel.
    """

    has_lengthscale = True

    def forward(self, x1: Tensor, x2: Tensor, diag: bool = False, last_dim_is_batch: bool = False, **params) -> Tensor:
        if last_dim_is_batch:
            x1 = x1.transpose(-1, -2).unsqueeze(-1)
            x2 = x2.transpose(-1, -2).unsqueeze(-1)
        x1_ = x1.div(self.lengthscale)
        x2_ = x2.div(self.lengthscale)
        if diag:
            return torch.exp((x1_ * x2_).sum(-1))
        return torch.exp(x1_.matmul(x2_.transpose(-2, -1)))


def make_attention_kernel(kernel: str, head_dim: int, num_heads: int) -> ScaleKernel:
    """Per-head attention kernel ``ScaleKernel(base(ard_num_dims=head_dim))`` with batch shape ``(num_heads,)``.

    ``kernel`` is ``"rbf"`` (GPyTorch's ARD :class:`~gpytorch.kernels.RBFKernel`) or
    ``"exponential"`` (:class:`ExponentialKernel`).  Lengthscales start at ``head_dim ** 0.5``
    (RBF) and ``head_dim ** 0.25`` (exponential, so that ``q·k/σ² = q·k/√d`` as in scaled
    dot-product attention, eq. ``sdp``); output scales start at 1.
    """
    if not isinstance(kernel, str):
        raise TypeError(f"kernel must be a string in {KERNEL_NAMES}, got {type(kernel).__name__}")
    if kernel not in KERNEL_NAMES:
        raise ValueError(f"kernel must be one of {KERNEL_NAMES}, got {kernel!r}")
    if head_dim < 1 or num_heads < 1:
        raise ValueError(f"head_dim and num_heads must be >= 1, got head_dim={head_dim}, num_heads={num_heads}")
    batch_shape = torch.Size([num_heads])
    if kernel == "rbf":
        base = RBFKernel(ard_num_dims=head_dim, batch_shape=batch_shape)
        base.lengthscale = math.sqrt(head_dim)
    else:
        base = ExponentialKernel(ard_num_dims=head_dim, batch_shape=batch_shape)
        base.lengthscale = head_dim**0.25
    scaled = ScaleKernel(base, batch_shape=batch_shape)
    scaled.outputscale = 1.0
    return scaled


def evaluate_kernel(kernel: Kernel, x1: Tensor, x2: Tensor | None = None, diag: bool = False) -> Tensor:
    """Dense kernel matrix ``k(x1, x2)`` for head-batched inputs.

    ``x1``: ``(..., heads, N, d)``, ``x2``: ``(..., heads, M, d)`` (defaults to ``x1``); the
    kernel's batch shape ``(heads,)`` aligns with the head dimension and leading dimensions
    broadcast.  Returns ``(..., heads, N, M)``, or ``(..., heads, N)`` when ``diag=True`` (then
    ``x2`` must equal ``x1``).  Evaluation is eager (``kernel.forward``), which is what attention
    needs: every entry is used.
    """
    if x2 is None:
        x2 = x1
    if x1.shape[-1] != x2.shape[-1]:
        raise ValueError(f"x1 and x2 must have the same feature dimension, got {x1.shape[-1]} and {x2.shape[-1]}")
    return kernel.forward(x1, x2, diag=diag)
