"""Argument checks shared by the public entry points: one named ``TypeError`` / ``ValueError`` per
bad argument instead of a NaN result or an error from deep inside torch."""

from __future__ import annotations

import math
import numbers

import torch

__all__ = ["check_tensor", "check_int", "check_real", "check_generator"]


def _type_name(value) -> str:
    return f"{value.dtype} tensor" if isinstance(value, torch.Tensor) else type(value).__name__


def check_tensor(
    x,
    name: str,
    *,
    floating: bool | None = None,
    dim: int | None = None,
    finite: bool = False,
    non_empty: bool = False,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``x`` if it is a tensor of the required kind, else a ``TypeError`` / ``ValueError`` naming ``name``.

    ``floating``: ``True`` floating point, ``False`` integer (not bool); ``dim``: number of dimensions;
    ``finite``: no NaN/Inf (reads the values); ``non_empty``: every dimension >= 1; ``dtype``: the
    dtype of the parameters ``x`` meets.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {_type_name(x)}")
    if floating is True and not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")
    if floating is False and (x.is_floating_point() or x.is_complex() or x.dtype == torch.bool):
        raise TypeError(f"{name} must be an integer tensor, got {x.dtype}")
    if dtype is not None and x.dtype != dtype:
        raise TypeError(f"{name} has dtype {x.dtype} but the model's parameters are {dtype}: convert one of them")
    if dim is not None and x.dim() != dim:
        raise ValueError(f"{name} must have {dim} dimensions, got shape {tuple(x.shape)}")
    if non_empty and x.numel() == 0:
        raise ValueError(f"{name} must not be empty (every dimension >= 1), got shape {tuple(x.shape)}")
    if finite and x.is_floating_point() and not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains NaN or infinite values")
    return x


def check_int(value, name: str, *, low: int | None = 1) -> int:
    """``value`` as an int if it is an integer (not a bool) ``>= low``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {_type_name(value)}")
    if low is not None and value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    return int(value)


def check_real(
    value, name: str, *, low: float | None = None, high: float | None = None, low_open: bool = False, high_open: bool = False
) -> float:
    """``value`` as a finite float in the given range (Python/NumPy numbers, 0-d tensors; not bools)."""
    if isinstance(value, torch.Tensor) and value.dim() == 0 and not value.is_complex() and value.dtype != torch.bool:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {_type_name(value)}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if low is not None and (value <= low if low_open else value < low):
        raise ValueError(f"{name} must be {'>' if low_open else '>='} {low}, got {value}")
    if high is not None and (value >= high if high_open else value > high):
        raise ValueError(f"{name} must be {'<' if high_open else '<='} {high}, got {value}")
    return value


def check_generator(generator, name: str = "generator") -> None:
    """``TypeError`` unless ``generator`` is a ``torch.Generator`` or ``None``."""
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"{name} must be a torch.Generator or None, got {type(generator).__name__}")
