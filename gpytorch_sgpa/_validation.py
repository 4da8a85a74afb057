"""Argument checks shared by the public entry points.

:func:`check_tensor`, :func:`check_int` and :func:`check_real` look at types, shapes and Python
numbers only, so they cost nothing on an accelerator.  :func:`check_finite` and
:func:`check_finite_result` read tensor values; callers run them only where
:func:`checks_on_host` allows (eager mode on the CPU).
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor

__all__ = [
    "check_tensor",
    "check_finite",
    "check_finite_result",
    "check_int",
    "check_real",
    "check_dtype",
    "check_num_samples",
    "checks_on_host",
]


def _type_name(value) -> str:
    return f"{value.dtype} tensor" if isinstance(value, Tensor) else type(value).__name__


def check_tensor(
    x, name: str, *, floating: bool | None = None, dim: int | tuple[int, ...] | None = None, non_empty: bool = False
) -> Tensor:
    """``x`` if it is a tensor of the required kind; else ``TypeError`` (type, dtype) or ``ValueError``.

    ``floating``: ``True`` a floating-point dtype, ``False`` an integer one (not bool), ``None``
    any; ``dim``: the allowed number(s) of dimensions; ``non_empty``: every dimension >= 1.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {_type_name(x)}")
    if floating is True and not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")
    if floating is False and (x.is_floating_point() or x.is_complex() or x.dtype == torch.bool):
        raise TypeError(f"{name} must be an integer tensor, got {x.dtype}")
    if dim is not None and x.dim() not in ((dim,) if isinstance(dim, int) else dim):
        raise ValueError(f"{name} must have {dim} dimensions, got shape {tuple(x.shape)}")
    if non_empty and x.numel() == 0:
        raise ValueError(f"{name} must not be empty (every dimension >= 1), got shape {tuple(x.shape)}")
    return x


def check_dtype(x: Tensor, name: str, expected: torch.dtype) -> None:
    """``TypeError`` unless ``x`` has the dtype of the parameters it meets (``torch.autocast`` mixes dtypes itself)."""
    if x.dtype != expected and not torch.is_autocast_enabled(x.device.type):
        raise TypeError(
            f"{name} has dtype {x.dtype} but the module's parameters are {expected}: convert one of them (e.g. module.to({x.dtype}))"
        )


def all_finite(x: Tensor) -> bool:
    """Whether every value of ``x`` is finite: one reduction (a sum of finite values is finite or
    overflows to ±inf, never NaN; NaN and ±inf propagate), the elementwise test only when the sum
    is not finite (overflow or a non-finite value), so large activations are never misreported."""
    if x.numel() == 0 or bool(torch.isfinite(x.detach().sum())):
        return True
    return bool(torch.isfinite(x).all())


def check_finite(x: Tensor, name: str, *, allow_negative_infinity: bool = False) -> None:
    """``ValueError`` if ``x`` holds NaN or infinite values (reads the values); with
    ``allow_negative_infinity``, ``-inf`` passes (masked logits)."""
    if allow_negative_infinity:
        if bool(torch.isnan(x).any() | torch.isposinf(x).any()):
            raise ValueError(f"{name} contains NaN or +inf values")
    elif not all_finite(x):
        raise ValueError(f"{name} contains NaN or infinite values")


def check_finite_result(results, x: Tensor, name: str) -> None:
    """``ValueError`` if any of ``results`` is not finite although the input ``x`` was: ``x`` then
    overflows the computation in its dtype (or the module's parameters are not finite)."""
    for result in results:
        if isinstance(result, Tensor) and result.is_floating_point() and not all_finite(result):
            if not x.is_floating_point():
                raise ValueError(f"the result for these {name} is not finite: the module's parameters are not finite")
            largest = float(x.detach().abs().max())
            raise ValueError(
                f"{name} is finite but the result is not: {name} (largest magnitude {largest:.3g}) is too large "
                f"for {x.dtype}, or the module's parameters are not finite; rescale {name} (e.g. normalise it)"
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

    Accepts Python and NumPy numbers and 0-d real tensors, not bools.
    """
    if isinstance(value, Tensor) and value.dim() == 0 and not value.is_complex() and value.dtype != torch.bool:
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


def check_num_samples(num_samples) -> None:
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}")


def checks_on_host(x: Tensor) -> bool:
    """Whether to run input checks that read tensor values on the host (eager mode on the CPU).

    On an accelerator such a check would make the host wait for the device every call, and under
    ``torch.compile`` it would break the graph, so there they are skipped; the docstrings of the
    callers say what then happens to bad input.
    """
    return x.device.type == "cpu" and not torch.compiler.is_compiling()
