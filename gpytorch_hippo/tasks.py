"""One task of an online sparse GP as tensors: what :meth:`~gpytorch_hippo.online.OnlineSGPR.update` and
:meth:`~gpytorch_hippo.online.OnlineSGPR.log_bound` accept, checked and converted before any algebra.

Inputs may be tensors, NumPy or pandas numbers, or calendar times (through a
:class:`~gpytorch_hippo.timeaxis.TimeAxis`); a pandas ``train_y`` is aligned on the labels of ``train_x``'s rows.
NaN targets raise, or are left out with ``missing="drop"``. Ragged tasks of batched streams come padded with a
``mask``. Bad input raises a ``ValueError``/``TypeError`` naming the argument and the fix; nothing is imputed.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from probseq._validation import check_tensor

from .inducing.base import InducingVariables
from .timeaxis import TimeAxis, align_on_index, is_datetime_like

__all__ = ["Task", "as_inputs", "check_noise", "check_streams_finite", "check_task", "prepare_task"]


class Task(NamedTuple):
    """A task ready for the online algebra (:func:`prepare_task`).

    :param x: inputs ``(N, D)`` (``(S, N, D)`` for ``S`` batched streams), finite, in the model's dtype.
    :param y: targets ``(N,)`` (``(S, N)``), finite.
    :param noise: per-point noise variances, positive, of ``y``'s shape (``None``: the likelihood's).
    :param mask: booleans ``(S, N)``, ``False`` at padding (``None``: every point observed).
    """

    x: Tensor
    y: Tensor
    noise: Tensor | None
    mask: Tensor | None


def as_numbers(values, name: str, dtype: torch.dtype) -> Tensor:
    """NumPy/pandas numbers (or a list of them) as a tensor of ``dtype``.

    :param values: the numbers.
    :param name: the argument's name, for the error message.
    :param dtype: the model's floating dtype.
    """
    try:
        return torch.as_tensor(np.array(values, dtype=np.float64)).to(dtype)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a torch.Tensor or an array of numbers, got {type(values).__name__}") from None


def as_inputs(x, name: str, time_axis: TimeAxis | None, dtype: torch.dtype):
    """Inputs as given by the user: calendar times through ``time_axis``, NumPy/pandas numbers as tensors of
    ``dtype``; tensors unchanged (:func:`check_task` validates them).

    :param x: the inputs.
    :param name: the argument's name, for the error message.
    :param time_axis: the model's time axis (``None``: numbers only; calendar times raise a ``TypeError``).
    :param dtype: the model's floating dtype.
    """
    if time_axis is not None and not isinstance(x, Tensor):
        return time_axis(x).to(dtype)
    if isinstance(x, Tensor):
        return x
    if is_datetime_like(x):
        raise TypeError(f"{name} holds calendar times: build the model with time_axis=TimeAxis('h') (or another unit)")
    return as_numbers(x, name, dtype)


def check_task(
    train_x, train_y, dtype: torch.dtype, x_name: str = "train_x", y_name: str = "train_y", streams: int | None = None
) -> tuple[Tensor, Tensor]:
    """Finite tensors in the model's floating ``dtype`` (integers promoted), ``x`` as ``(N, D)``, ``y`` as ``(N,)``;
    for a model of ``streams`` batched streams, ``x`` of ``y``'s shape ``(S, N)`` is read as 1-D times ``(S, N, 1)``.

    :param train_x: the inputs, a tensor.
    :param train_y: the targets, a tensor.
    :param dtype: the model's floating dtype.
    :param x_name: the inputs' name, for error messages.
    :param y_name: the targets' name, for error messages.
    :param streams: ``S`` for a model of batched streams, else ``None``.
    """
    train_x = check_tensor(train_x, x_name, dtype=dtype)
    train_y = check_tensor(train_y, y_name, dtype=dtype)
    if train_x.dim() == 1 or (train_x.dim() == 2 and train_x.shape == train_y.shape and train_x.shape[0] == streams):
        train_x = train_x.unsqueeze(-1)
    if train_x.dim() < 2 or train_x.shape[-2] < 1:
        raise ValueError(f"{x_name} must have shape (N, D) or (N,) with N >= 1, got {tuple(train_x.shape)}")
    if train_y.shape != train_x.shape[:-1]:
        raise ValueError(
            f"{y_name} must have shape {tuple(train_x.shape[:-1])} to match {x_name} of shape "
            f"{tuple(train_x.shape)}, got {tuple(train_y.shape)}"
        )
    return train_x, train_y


def check_streams_finite(values, where: str = "", name: str = "train_y") -> None:
    """NaN/Inf in a batch of streams ``(S, N)``: an error naming the streams, never NaN spread to the others.

    :param values: the batch (anything but a floating tensor of at least two dimensions passes).
    :param where: words for the message after "values" (e.g. ``"at observed entries"``).
    :param name: the argument's name, for the message.
    """
    if not isinstance(values, Tensor) or values.dim() < 2 or not values.is_floating_point():
        return
    bad = ~torch.isfinite(values).reshape(-1, values.shape[-1]).all(-1)
    if bool(bad.any()):
        streams = bad.nonzero().squeeze(-1).tolist()
        raise ValueError(
            f"{name} contains NaN or infinite values {where} in stream(s) {streams[:10]}"
            f"{' ...' if len(streams) > 10 else ''} (index along the batch dimensions, flattened): "
            "pass mask= (False at entries to ignore) for ragged tasks"
        )


def check_noise(noise, train_y: Tensor) -> Tensor | None:
    """Per-point noise variances: positive, in ``train_y``'s dtype, expanded to its shape (``None`` stays ``None``).

    :param noise: the variances, broadcasting to ``train_y``'s shape, or ``None``.
    :param train_y: the task's targets.
    """
    if noise is None:
        return None
    noise = check_tensor(noise, "noise", dtype=train_y.dtype)
    if not bool((noise > 0).all()):
        raise ValueError("noise must hold positive variances")
    try:
        return noise.expand(train_y.shape)
    except RuntimeError:
        raise ValueError(f"noise must broadcast to train_y's shape {tuple(train_y.shape)}, got {tuple(noise.shape)}") from None


def _without_missing(train_x, train_y, noise, missing: str, time_axis: TimeAxis | None, dtype: torch.dtype):
    """``(x, y, noise)`` of a task as tensors, with NaN targets left out if ``missing="drop"``."""
    if missing not in ("raise", "drop"):
        raise ValueError(f"missing must be 'raise' or 'drop', got {missing!r}")
    train_y = align_on_index(train_x, train_y)
    train_x = as_inputs(train_x, "train_x", time_axis, dtype)
    if not isinstance(train_y, Tensor):
        train_y = as_numbers(train_y, "train_y", dtype)
    if isinstance(train_y, Tensor) and train_y.is_floating_point() and bool(torch.isnan(train_y).any()):
        if missing == "raise":
            raise ValueError(
                "train_y contains NaN values: pass missing='drop' to leave those observations out of the task "
                "(nothing is imputed), or remove them"
            )
        keep = ~torch.isnan(train_y)
        if train_x.dim() >= 1 and train_x.shape[0] == keep.shape[0] and keep.dim() == 1:
            train_x, train_y = train_x[keep], train_y[keep]
            if noise is not None and isinstance(noise, Tensor) and noise.shape == keep.shape:
                noise = noise[keep]
        else:
            raise ValueError("missing='drop' needs un-batched targets (N,) matching train_x's first dimension")
    return train_x, train_y, noise


def _masked(train_x, train_y, mask, inducing_variables: InducingVariables, time_axis: TimeAxis | None, dtype: torch.dtype):
    """A ragged task of batched streams: padding filled with finite values that contribute nothing
    (``mask=None`` back if no stream has a point); NaN at an observed entry names its stream."""
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor, got {getattr(mask, 'dtype', type(mask).__name__)}")
    train_x, train_y = as_inputs(train_x, "train_x", time_axis, dtype), check_tensor(train_y, "train_y", finite=False)
    if train_x.dim() == train_y.dim():
        train_x = train_x.unsqueeze(-1)
    if mask.shape != train_y.shape or train_x.shape[:-1] != train_y.shape:
        raise ValueError(
            f"mask must have train_y's shape {tuple(train_y.shape)} and train_x the shape (..., N, D) to match, "
            f"got mask {tuple(mask.shape)}, train_x {tuple(train_x.shape)}"
        )
    check_streams_finite(torch.where(mask, train_y, 0.0), "at observed entries")
    check_streams_finite(torch.where(mask.unsqueeze(-1), train_x, 0.0).sum(-1), "at observed entries", "train_x")
    if not bool(mask.any()):
        return train_x, train_y, None
    # padding takes an observed input of its own stream (finite and within that stream's reach; multiplied by
    # zero); a stream without points takes its support's end if its variables have one (it is kept as it was)
    fill = train_x[mask][0].expand(train_x.shape[:-2] + train_x.shape[-1:]).clone()
    supports = getattr(inducing_variables, "stream_supports", lambda: None)()
    if supports is not None and train_x.dim() == 3 and train_x.shape[-1] == 1:
        fill[:, 0] = supports[:, 1].to(fill)
    first = mask.to(torch.int8).argmax(-1, keepdim=True)  # (..., 1): the first observed point of each stream
    own = torch.gather(train_x, -2, first.unsqueeze(-1).expand(*first.shape, train_x.shape[-1])).squeeze(-2)
    fill = torch.where(mask.any(-1, keepdim=True), own, fill)
    train_x = torch.where(mask.unsqueeze(-1), train_x, fill.unsqueeze(-2))
    return train_x, torch.where(mask, train_y, torch.zeros((), dtype=train_y.dtype)), mask


def prepare_task(
    train_x,
    train_y,
    inducing_variables: InducingVariables,
    dtype: torch.dtype,
    time_axis: TimeAxis | None = None,
    streams: int | None = None,
    noise: Tensor | None = None,
    missing: str = "raise",
    mask: Tensor | None = None,
) -> Task | None:
    """A task as :meth:`~gpytorch_hippo.online.OnlineSGPR.update` takes it, checked and converted: calendar times
    through ``time_axis``, pandas targets aligned, NaN targets raised or dropped (``missing``), a ragged batch padded
    (``mask``), inputs within the reach of ``inducing_variables``
    (:class:`~gpytorch_hippo.inducing.InputsOutsideSupportError` otherwise).

    :param train_x: the task's inputs (tensor, NumPy, pandas, calendar times with ``time_axis``).
    :param train_y: the task's targets. A pandas ``train_y`` is aligned on the labels of ``train_x``'s rows (its index,
        or its values for a pandas ``Index`` as in ``update(series.index, series)``), as pandas aligns; other labels
        raise a ``ValueError`` (``train_y.to_numpy()`` pairs rows by position).
    :param inducing_variables: the model's inducing variables (their reach, and batched streams' supports).
    :param dtype: the model's floating dtype.
    :param time_axis: the model's :class:`~gpytorch_hippo.timeaxis.TimeAxis` (``None``: numbers only).
    :param streams: ``S`` for a model of batched streams, else ``None``.
    :param noise: per-point noise variances broadcasting to ``train_y``'s shape (rows dropped with their targets).
    :param missing: ``"raise"`` (default) or ``"drop"``: what NaN targets do.
    :param mask: booleans ``(S, N)``, ``False`` at padding of streams with fewer points (its values are ignored, NaN
        allowed; NaN at an observed entry raises an error naming the stream); ``None`` (default): every entry observed.
        Padding takes an observed input of its own stream, and a stream without points its support's end, so that the
        algebra stays finite; the model keeps such a stream's stored posterior on the variables it was computed for.
    :return: the :class:`Task`, or ``None`` for a task with no observation (no stream has a point, or no input and
        no target left).
    """
    if mask is not None:
        train_x, train_y, mask = _masked(train_x, train_y, mask, inducing_variables, time_axis, dtype)
        if mask is None:
            return None  # no stream has a point
    else:
        check_streams_finite(train_y)
    train_x, train_y, noise = _without_missing(train_x, train_y, noise, missing, time_axis, dtype)
    if train_y.numel() == 0 and train_x.numel() == 0:
        return None
    train_x, train_y = check_task(train_x, train_y, dtype, streams=streams)
    inducing_variables.check_inputs_within_support(train_x, "inputs of train_x")
    return Task(train_x, train_y, check_noise(noise, train_y), mask)
