"""Checks shared by the entry points of :mod:`gpytorch_hippo`: one place for what bad input raises.

* :func:`check_tensor` -- a tensor argument: ``TypeError`` for a non-tensor (or a complex one),
  ``ValueError`` naming the argument for NaN/Inf; integer inputs are promoted to a floating dtype
  as GPyTorch's arithmetic would (``torch.promote_types(x.dtype, dtype)``).
* :func:`check_finite_scalar` -- a real number argument (times, scales, steps).
* :func:`floating_dtype` -- the floating dtype a module (a kernel, inducing variables) computes in.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor

__all__ = ["check_tensor", "check_finite_scalar", "floating_dtype"]


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


def check_tensor(
    x,
    name: str,
    *,
    finite: bool = True,
    dtype: torch.dtype | None = None,
    min_dim: int = 0,
) -> Tensor:
    """Return the tensor argument ``name`` checked and in a floating dtype.

    :param finite: raise ``ValueError`` if ``x`` holds NaN or infinite values.
    :param dtype: the floating dtype the caller computes in (e.g. the kernel's); ``x`` is returned
        in ``torch.promote_types(x.dtype, dtype)``: integers become ``dtype``, a float32 input meets
        a float64 kernel in float64 (GPyTorch's promotion). ``None``: integers become torch's default
        floating dtype, floating inputs are kept as they are.
    :param min_dim: the fewest dimensions ``x`` must have.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.is_complex():
        raise TypeError(f"{name} must be a real tensor, got dtype {x.dtype}")
    if x.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dimension(s), got shape {tuple(x.shape)}")
    if dtype is not None and not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating dtype, got {dtype}")
    if not x.is_floating_point():
        x = x.to(dtype if dtype is not None else torch.get_default_dtype())
    elif dtype is not None and x.dtype != dtype:
        x = x.to(torch.promote_types(x.dtype, dtype))
    if finite and x.numel() and not bool(torch.isfinite(x).all()):
        bad = "NaN" if bool(torch.isnan(x).any()) else "infinite"
        raise ValueError(f"{name} contains {bad} values; expected finite numbers")
    return x


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
