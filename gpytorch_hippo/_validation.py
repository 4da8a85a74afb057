"""Checks of :mod:`gpytorch_hippo`'s own (tensor arguments: :func:`probseq._validation.check_tensor`).

* :func:`check_finite_scalar` -- a real number argument (times, scales, steps).
* :func:`floating_dtype` -- the floating dtype a module (a kernel, inducing variables) computes in.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor

__all__ = ["check_finite_scalar", "floating_dtype"]


def floating_dtype(module: torch.nn.Module | None, default: torch.dtype | None = None) -> torch.dtype:
    """The dtype of ``module``'s first floating parameter or buffer, else ``default`` (or torch's default)."""
    if module is not None:
        for tensor in module.parameters():
            if tensor.is_floating_point():
                return tensor.dtype
        for buffer in module.buffers():
            if buffer.is_floating_point():
                return buffer.dtype
    return default if default is not None else torch.get_default_dtype()


def check_finite_scalar(value, name: str, *, positive: bool = False, nonnegative: bool = False) -> float:
    """Return the real number argument ``name`` as a finite float (``TypeError`` for a non-number,
    ``ValueError`` for NaN, ±Inf and, with ``positive``/``nonnegative``, for ``value <= 0``/``< 0``)."""
    if isinstance(value, Tensor):
        if value.numel() != 1 or value.is_complex():
            raise TypeError(f"{name} must be a real number, got a tensor of shape {tuple(value.shape)} and dtype {value.dtype}")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if positive and not value > 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    if nonnegative and not value >= 0:
        raise ValueError(f"{name} must be non-negative, got {value!r}")
    return value
