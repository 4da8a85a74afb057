"""Argument checks shared by the BoTorch models of :mod:`gpytorch_hippo.botorch` (single- and multi-output)."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import gpytorch
import torch
from botorch.exceptions.errors import BotorchTensorDimensionError
from botorch.models.utils.assorted import validate_input_scaling
from torch import Tensor

from probseq._compat import validate_tensor_args

from ..inducing.base import InducingVariables
from ..ordering import ORDERING_CRITERIA

__all__ = [
    "check_X_Y",
    "check_Yvar",
    "check_first_batch",
    "check_output_indices",
    "check_points_near",
    "check_noise",
    "check_settings",
    "check_stream_batch",
    "inducing_per_output",
    "split_third_argument",
    "validate_like_single_task_gp",
]


def check_first_batch(train_X, train_Y, train_Yvar) -> int:
    """The first batch of a model, as ``SingleTaskGP`` takes it (``train_Y`` ``None``: none); returns ``m``."""
    if train_Y is None:
        return 1
    num_outputs = train_Y.shape[-1] if isinstance(train_Y, Tensor) and train_Y.dim() >= 2 else 1
    check_X_Y(train_X, train_Y, "train_X", "train_Y", num_outputs)
    if train_X.dim() != 2:
        raise ValueError(f"train_X must have shape (n, d), got {tuple(train_X.shape)}")
    check_Yvar(train_Yvar, train_Y, "train_Yvar")
    return num_outputs


def check_settings(likelihood, fit_maxiter, refit_every, ordering, inducing_variables=None, num_inducing=None, exact_fit_size=None) -> None:
    """The constructor's options: a ``GaussianLikelihood`` (known noise comes as ``train_Yvar``), ``fit_maxiter >= 0``,
    ``refit_every`` ``None`` or ``>= 1``, an ordering criterion of :func:`~gpytorch_hippo.ordering.order_inputs`, and
    ``num_inducing`` only for the default inducing points, ``exact_fit_size`` ``None`` or ``>= 1``."""
    if isinstance(likelihood, gpytorch.likelihoods.FixedNoiseGaussianLikelihood):
        raise TypeError(
            "likelihood: for known observation noise pass train_Yvar (and Yvar to observe, noise= to "
            "condition_on_observations) with a GaussianLikelihood, instead of a FixedNoiseGaussianLikelihood"
        )
    settings = (("fit_maxiter", fit_maxiter, False), ("refit_every", refit_every, True), ("exact_fit_size", exact_fit_size, True))
    for name, value, allow_none in settings:
        if value is None and allow_none:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "fit_maxiter" else 1):
            raise ValueError(f"{name} must be a {'non-negative' if name == 'fit_maxiter' else 'positive'} int, got {value!r}")
    if ordering not in ORDERING_CRITERIA:
        raise ValueError(f"ordering must be one of {ORDERING_CRITERIA}, got {ordering!r}")
    if inducing_variables is not None and num_inducing is not None:
        raise ValueError("num_inducing sets the number of the default inducing points: pass it or inducing_variables, not both")


def inducing_per_output(inducing_variables, num_outputs: int) -> list[InducingVariables | None]:
    """The inducing variables of each output: one set (copied per output when ``num_outputs > 1``), ``None`` (the
    default points) or a sequence of ``num_outputs`` sets."""
    if isinstance(inducing_variables, InducingVariables) or inducing_variables is None:
        if num_outputs == 1:
            return [inducing_variables]
        return [copy.deepcopy(inducing_variables) for _ in range(num_outputs)]
    if not (
        isinstance(inducing_variables, Sequence)
        and len(inducing_variables) == num_outputs
        and all(isinstance(v, InducingVariables) for v in inducing_variables)
    ):
        raise TypeError(
            f"inducing_variables must be one InducingVariables instance or a sequence of {num_outputs} "
            f"(one per output), got {inducing_variables!r}"
        )
    return list(inducing_variables)


def check_keywords(kwargs: dict, allowed: set[str], where: str) -> None:
    """A ``TypeError`` naming the keyword arguments of ``where`` outside ``allowed``."""
    unknown = sorted(set(kwargs) - allowed)
    if unknown:
        raise TypeError(f"{where} got unexpected keyword arguments {unknown}")


def check_noise(noise: Tensor, num_outputs: int, name: str, points: str) -> Tensor:
    """Noise variances of ``(*batch, points, num_outputs)``, one column per output, else BoTorch's dimension error."""
    if noise.dim() < 2 or noise.shape[-1] != num_outputs:
        raise BotorchTensorDimensionError(
            f"{name} must have shape (*batch, {points}, {num_outputs}) (one column per output, like Y), got {tuple(noise.shape)}"
        )
    return noise


def check_stream_batch(X, Y, Yvar, num_outputs: int, known_noise: bool) -> None:
    """A streaming batch (``observe``): ``X`` ``(n, d)``, ``Y`` ``(n, m)`` and, for a model of known noise, ``Yvar``."""
    check_X_Y(X, Y, "X", "Y", num_outputs)
    if X.dim() != 2:
        raise ValueError(f"X must have shape (n, d) in observe (streaming data), got {tuple(X.shape)}")
    check_Yvar(Yvar, Y, "Yvar")
    if known_noise and Yvar is None:
        raise ValueError("this model was built with train_Yvar (known noise): pass the batch's noise variances as Yvar")


def check_output_indices(indices, num_outputs: int, name: str, distinct: bool = False) -> list[int]:
    """``indices`` as a list: a non-empty list of ints in ``[0, num_outputs)`` (``distinct``: without repeats)."""
    values = list(indices)
    if (
        not values
        or any(isinstance(j, bool) or not isinstance(j, int) or not 0 <= j < num_outputs for j in values)
        or (distinct and len(set(values)) != len(values))
    ):
        kind = "distinct ints" if distinct else "ints"
        raise ValueError(f"{name} must be a non-empty list of {kind} in [0, {num_outputs}), got {indices!r}")
    return values


def validate_like_single_task_gp(x: Tensor, y: Tensor, noise: Tensor | None) -> None:
    """BoTorch's input checks of ``SingleTaskGP`` on the model-space data ``(n, d)``, ``(n,)``: its warnings for
    float32 inputs, inputs outside the unit cube and unstandardised outcomes."""
    Y = y.unsqueeze(-1)
    Yvar = None if noise is None else noise.unsqueeze(-1)
    validate_tensor_args(X=x, Y=Y, Yvar=Yvar)
    validate_input_scaling(train_X=x, train_Y=Y, train_Yvar=Yvar)


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
