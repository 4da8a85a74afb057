"""Checks of :mod:`gpytorch_sgpa`'s own (the shared ones are in :mod:`probseq._validation`).

The shared checks that look at types, shapes and Python numbers only cost nothing on an accelerator
(:func:`probseq._validation.check_tensor` with ``finite=False``).  :func:`check_finite` and
:func:`check_finite_result` read tensor values; callers run them only where :func:`checks_on_host`
allows (eager mode on the CPU).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["check_finite", "check_finite_result", "check_num_samples", "checks_on_host"]


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
