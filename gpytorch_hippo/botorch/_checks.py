"""Argument checks shared by the BoTorch models of :mod:`gpytorch_hippo.botorch` (single- and multi-output)."""

from __future__ import annotations

import torch
from torch import Tensor

from ..inducing.base import InducingVariables

__all__ = ["check_X_Y", "check_Yvar", "check_points_near", "split_third_argument"]


def check_points_near(inducing_variables: InducingVariables, x: Tensor) -> None:
    """Inducing points live in the model's input space, after ``input_transform``: refuse a set of which
    most points lie outside the transformed inputs' box widened by its size on every side (raw-scale
    points under ``Normalize``, which would leave the posterior at the prior)."""
    points = getattr(inducing_variables, "points", None)
    if not isinstance(points, Tensor) or points.shape[-1] != x.shape[-1]:
        return
    low, high = x.min(-2).values, x.max(-2).values
    span = (high - low).clamp_min(1e-12)
    near = ((points >= low - span) & (points <= high + span)).all(-1)
    if near.to(x.dtype).mean() < 0.5:
        raise ValueError(
            "inducing_variables: InducingPoints must be given in the model's input space, after input_transform "
            f"(the first batch spans {low.tolist()} to {high.tolist()} there, e.g. the unit cube for Normalize); "
            f"{int((~near).sum())} of the {near.numel()} points lie far from it"
        )


def split_third_argument(train_Yvar, inducing_variables):
    """``OnlineGPModel(X, Y, inducing_variables)``, the former positional form, keeps working: the third
    argument is ``train_Yvar`` (as ``SingleTaskGP``'s) unless it is inducing variables."""
    is_variables = isinstance(train_Yvar, InducingVariables) or (
        isinstance(train_Yvar, (list, tuple)) and len(train_Yvar) > 0 and all(isinstance(v, InducingVariables) for v in train_Yvar)
    )
    if not is_variables:
        if train_Yvar is not None and not isinstance(train_Yvar, Tensor):
            raise TypeError(f"train_Yvar must be a tensor of observation noise variances or None, got {type(train_Yvar).__name__}")
        return train_Yvar, inducing_variables
    if inducing_variables is not None:
        raise TypeError("inducing variables were given twice: as the third positional argument and as inducing_variables=")
    return None, train_Yvar


def check_Yvar(Yvar: Tensor | None, Y: Tensor, name: str) -> None:
    """Known noise variances: the shape of ``Y``, finite and non-negative."""
    if Yvar is None:
        return
    if not isinstance(Yvar, Tensor) or Yvar.shape != Y.shape:
        raise ValueError(f"{name} must be a tensor of the shape of the targets {tuple(Y.shape)}, got {getattr(Yvar, 'shape', type(Yvar))}")
    if not bool(torch.isfinite(Yvar).all()) or bool((Yvar < 0).any()):
        raise ValueError(f"{name} must hold finite, non-negative noise variances")


def check_X_Y(X, Y, x_name: str, y_name: str, num_outputs: int = 1) -> None:
    """BoTorch's shapes: ``X`` of ``(*b, n, d)``, ``Y`` of ``(*b', n, m)``, finite."""
    for name, value in ((x_name, X), (y_name, Y)):
        if not isinstance(value, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if X.dim() < 2 or X.shape[-2] < 1:
        raise ValueError(f"{x_name} must have shape (*batch, n, d) with n >= 1, got {tuple(X.shape)}")
    if Y.dim() < 2 or Y.shape[-1] != num_outputs or Y.shape[-2] != X.shape[-2]:
        raise ValueError(
            f"{y_name} must have shape (*batch, {X.shape[-2]}, {num_outputs}) to match {x_name} and the model's outputs, "
            f"got {tuple(Y.shape)}"
        )
    if not torch.isfinite(X).all():
        raise ValueError(f"{x_name} contains NaN or infinite values")
    if not torch.isfinite(Y).all():
        raise ValueError(f"{y_name} contains NaN or infinite values")
