"""Argument checks shared by the entry points of the three packages: one named ``TypeError`` /
``ValueError`` per bad argument instead of a NaN result or an error from deep inside torch.

* :func:`check_tensor` -- a tensor argument: its type, dtype kind, shape and (unless
  ``finite=False``) values; integers are returned in a floating dtype, as GPyTorch's arithmetic
  would promote them.
* :func:`check_dtype` -- a tensor in the dtype of the parameters it meets.
* :func:`check_int`, :func:`check_real` -- Python, NumPy and 0-d tensor numbers (a real number also from a
  one-element tensor, such as a time read off an ``(N, 1)`` input).
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor

__all__ = ["check_tensor", "check_dtype", "check_int", "check_real"]


def _type_name(value) -> str:
    return f"{value.dtype} tensor" if isinstance(value, Tensor) else type(value).__name__


def check_tensor(
    x,
    name: str,
    *,
    floating: bool | None = None,
    dim: int | tuple[int, ...] | None = None,
    min_dim: int = 0,
    non_empty: bool = False,
    finite: bool = True,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """Return the real tensor argument ``name`` checked; else ``TypeError`` (type, dtype) or ``ValueError``
    (shape, values), naming ``name``.

    :param floating: ``True``: a floating-point dtype; ``False``: an integer one (not bool), returned as it
        is; ``None``: any real dtype.
    :param dim: the allowed number(s) of dimensions; ``min_dim``: the fewest.
    :param non_empty: every dimension >= 1.
    :param finite: no NaN or infinite value. This reads the values: callers that read them only on the
        host (eager mode on the CPU) pass ``False`` and check them there.
    :param dtype: the floating dtype the caller computes in (e.g. the kernel's); ``x`` is returned in
        ``torch.promote_types(x.dtype, dtype)``: integers become ``dtype``, a float32 input meets a float64
        kernel in float64 (GPyTorch's promotion). ``None``: integers become torch's default floating
        dtype, floating inputs are kept as they are.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {_type_name(x)}")
    if floating is True and not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")
    if floating is False and (x.is_floating_point() or x.is_complex() or x.dtype == torch.bool):
        raise TypeError(f"{name} must be an integer tensor, got {x.dtype}")
    if x.is_complex():
        raise TypeError(f"{name} must be a real tensor, got dtype {x.dtype}")
    if dim is not None and x.dim() not in ((dim,) if isinstance(dim, int) else dim):
        raise ValueError(f"{name} must have {dim} dimensions, got shape {tuple(x.shape)}")
    if x.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dimension(s), got shape {tuple(x.shape)}")
    if non_empty and x.numel() == 0:
        raise ValueError(f"{name} must not be empty (every dimension >= 1), got shape {tuple(x.shape)}")
    if dtype is not None and not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating dtype, got {dtype}")
    if floating is False:
        return x
    if not x.is_floating_point():
        x = x.to(dtype if dtype is not None else torch.get_default_dtype())
    elif dtype is not None and x.dtype != dtype:
        x = x.to(torch.promote_types(x.dtype, dtype))
    if finite and x.numel() and not bool(torch.isfinite(x).all()):
        bad = "NaN" if bool(torch.isnan(x).any()) else "infinite"
        raise ValueError(f"{name} contains {bad} values; expected finite numbers")
    return x


def check_dtype(x: Tensor, name: str, expected: torch.dtype) -> None:
    """``TypeError`` unless ``x`` has the dtype of the parameters it meets (``torch.autocast`` mixes dtypes itself)."""
    if x.dtype != expected and not torch.is_autocast_enabled(x.device.type):
        raise TypeError(
            f"{name} has dtype {x.dtype} but the module's parameters are {expected}: convert one of them (e.g. module.to({x.dtype}))"
        )


def check_int(value, name: str, *, low: int | None = 1) -> int:
    """``value`` as an int if it is an integer (not a bool) ``>= low``; else ``TypeError`` / ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {_type_name(value)}")
    if low is not None and value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    return int(value)


def check_real(
    value, name: str, *, low: float | None = None, high: float | None = None, low_open: bool = False, high_open: bool = False
) -> float:
    """``value`` as a finite float in the given range; else ``TypeError`` / ``ValueError``.

    Accepts Python and NumPy numbers and one-element real tensors (``x[-1]`` of an ``(N, 1)`` input), not bools.
    """
    if isinstance(value, Tensor) and value.numel() == 1 and not value.is_complex() and value.dtype != torch.bool:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {_type_name(value)}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")
    if low is not None and (value <= low if low_open else value < low):
        raise ValueError(f"{name} must be {'>' if low_open else '>='} {low}, got {value}")
    if high is not None and (value >= high if high_open else value > high):
        raise ValueError(f"{name} must be {'<' if high_open else '<='} {high}, got {value}")
    return value
