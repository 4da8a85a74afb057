r"""Fitting an online sparse GP's hyperparameters on one task's online bound, in the style of BoTorch's
``fit_gpytorch_mll``: :func:`~gpytorch_hippo.fitting.fit_online_bound` maximises the collapsed online bound
(:meth:`~gpytorch_hippo.online.OnlineSGPR.log_bound`, thesis eq. (4.6) at the optimal :math:`q(u)`) of absorbing a task
over the model's trainable hyperparameters and returns a :class:`~gpytorch_hippo.fitting.FitReport`. It absorbs nothing: the model's
:meth:`~gpytorch_hippo.online.OnlineSGPR.update` composes it with the closed-form update.

A fit is a transaction. If the optimisation raises (a :class:`~gpytorch_hippo.inducing.cost.CovarianceCostError`
at a collapsed length scale, a non-finite bound, an interrupt), every hyperparameter is restored bit for bit to
its value at the start and the error is raised again. Unless ``max_change=None``, a fit that ends below the
bound it started from, or a refit (a model that holds a posterior) that moves a positive hyperparameter by more
than ``max_change`` times (an order of magnitude by default), is undone in the same way and reported in the record
(``FitReport.rejected``) and by a :class:`~gpytorch_hippo.fitting.RefitWarning`: one task's bound can favour such a move -- a short
task says little about a length scale, and a mismatch between the stored posterior and new data is cheapest
to explain by noise -- but it wrecks the model's forecasts.

When :meth:`~gpytorch_hippo.online.OnlineSGPR.update` is called without ``num_iter``, the model consults its
:class:`~gpytorch_hippo.fitting.RefitPolicy`: which tasks get a fit, of how many iterations, by which optimiser.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from typing import Any, NamedTuple

import torch
from torch import Tensor
from tqdm import tqdm

from probseq._validation import check_real

__all__ = ["FitReport", "RefitPolicy", "RefitWarning", "fit_before_update", "fit_online_bound"]


class RefitWarning(UserWarning):
    """A hyperparameter fit was undone (``FitReport.rejected`` says why); the model keeps the hyperparameters
    it had before the fit."""


class FitReport(NamedTuple):
    """How a hyperparameter fit ended (:func:`~gpytorch_hippo.fitting.fit_online_bound`; ``OnlineSGPR.last_fit``).

    ``status``: ``"stopped"`` (Adam ran its ``num_iter`` steps), or BoTorch's optimisation status of the
    L-BFGS-B fit (``"success"``: converged; ``"stopped"``: ``num_iter`` reached; ``"failure"``);
    ``bound_before``/``bound_after``: the task's online bound (not divided by ``N``) at the start and end.

    :param optimizer: ``"adam"`` or ``"lbfgs"``, the optimiser of the fit.
    :param iterations: the iterations run (Adam: ``num_iter``; L-BFGS-B: the steps BoTorch reports).
    :param status: how the optimisation ended, as above.
    :param message: the optimiser's message (for Adam, ``"<num_iter> Adam steps"``).
    :param bound_before: the task's online bound at the start of the fit (summed over batched streams with points).
    :param bound_after: the task's online bound at the end of the fit, after any rejection (then ``bound_before``).
    :param seconds: wall-clock seconds from the start of the optimisation to the end of the fit (the final bound included).
    :param rejected: ``""`` if the fitted hyperparameters were kept; else why they were undone (restored bit for bit).
    :param largest_change: the largest factor ``max(new / old, old / new)`` by which a positive hyperparameter
        (length scale, output scale, noise, ...) moved in the fit, before any rejection; ``1.0`` for none.
    """

    optimizer: str
    iterations: int
    status: str
    message: str
    bound_before: float
    bound_after: float
    seconds: float
    rejected: str = ""
    largest_change: float = 1.0


@dataclasses.dataclass(frozen=True)
class RefitPolicy:
    r"""When :meth:`~gpytorch_hippo.online.OnlineSGPR.update` fits the hyperparameters if its ``num_iter`` is unset
    (``OnlineSGPR(refit_every=..., refit_iter=..., refit_optimizer=..., refit_max_change=...)`` builds one): on task 1
    and on every ``every``-th task after it (tasks :math:`1, 1 + k, 1 + 2k, \dots`), by ``num_iter`` iterations of
    ``optimizer`` on the task's online bound (:func:`fit_online_bound`); the other tasks are closed-form updates.

    :param every: the spacing :math:`k` of the refitted tasks, a positive int; ``None`` (default): no fit unless
        ``update`` asks for one.
    :param num_iter: iterations of each refit, a positive int; default 50.
    :param optimizer: ``"lbfgs"`` (default) or ``"adam"`` (at the ``lr`` given to ``update``).
    :param max_change: every fit of ``update`` on a model that holds a posterior (the policy's or an explicit
        ``num_iter``'s) that moves a positive hyperparameter by more than this factor is undone
        (:func:`fit_online_bound`'s ``max_change``), as is a fit that lowers the task's bound; a number > 1, default
        10; ``None``: keep every fit as the optimiser ends it.
    """

    every: int | None = None
    num_iter: int = 50
    optimizer: str = "lbfgs"
    max_change: float | None = 10.0

    def __post_init__(self) -> None:
        for name, value, none in (("every", self.every, " or None"), ("num_iter", self.num_iter, "")):
            if (value is not None or not none) and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} (OnlineSGPR's refit_{name.replace('num_', '')}) must be a positive int{none}, got {value!r}")
        if self.optimizer not in ("adam", "lbfgs"):
            raise ValueError(f"optimizer (OnlineSGPR's refit_optimizer) must be 'adam' or 'lbfgs', got {self.optimizer!r}")
        if self.max_change is not None and not (isinstance(self.max_change, (int, float)) and self.max_change > 1):
            raise ValueError(f"max_change (OnlineSGPR's refit_max_change) must be a number > 1 or None, got {self.max_change!r}")

    def next_fit(self, num_tasks: int) -> tuple[int, str] | None:
        """``(num_iter, optimizer)`` of the fit of the next task, after ``num_tasks`` absorbed ones; ``None``: no fit.

        :param num_tasks: the tasks absorbed so far (the model's ``num_tasks``).
        """
        if self.every is None or num_tasks % self.every != 0:
            return None
        return self.num_iter, self.optimizer


def _positive_values(model: Any, names: set[str]) -> dict[str, Tensor]:
    """The constrained values of the trainable hyperparameters ``names`` that are positive (lower bound ``>= 0``)."""
    values = {}
    for name, parameter, constraint in model.named_parameters_and_constraints():
        lower = getattr(constraint, "lower_bound", None)
        if name in names and lower is not None and bool((lower >= 0).all()):
            values[name] = constraint.transform(parameter.detach()).clone()
    return values


def _change_factors(before: dict[str, Tensor], after: dict[str, Tensor]) -> dict[str, Tensor]:
    """``max(new / old, old / new)`` per entry of each positive hyperparameter (``inf`` where one of them is 0)."""
    factors = {}
    for name, old in before.items():
        new = after[name]
        ratio = torch.where((old > 0) & (new > 0), new / old, torch.full_like(old, math.inf))
        factors[name] = torch.maximum(ratio, 1 / ratio)
    return factors


def fit_online_bound(
    model: Any,
    train_x,
    train_y,
    num_iter: int = 50,
    optimizer: str = "lbfgs",
    lr: float = 0.01,
    noise: Tensor | None = None,
    mask: Tensor | None = None,
    fixed_mean: bool = False,
    max_change: float | None = 10.0,
    progress: bool = False,
) -> FitReport:
    r"""Maximise the online bound of absorbing ``(train_x, train_y)`` into ``model`` over its trainable
    hyperparameters (kernel, likelihood, mean, learnable inducing variables; never the stored task's), minimising
    :math:`-\mathcal L / N`; a transaction (module docstring). Nothing is absorbed: call
    ``model.update(train_x, train_y, num_iter=0)`` afterwards (:meth:`~gpytorch_hippo.online.OnlineSGPR.update` with
    ``num_iter > 0`` does both).

    For batched streams with a ``mask``, a stream without points in the task contributes nothing, so its own
    (batched) hyperparameters keep every bit; hyperparameters shared by all streams are fitted on the others.

    :param model: an :class:`~gpytorch_hippo.online.OnlineSGPR`.
    :param train_x: the task's inputs, as :meth:`~gpytorch_hippo.online.OnlineSGPR.update` takes them.
    :param train_y: the task's targets ``(N,)`` (``(S, N)`` for batched streams).
    :param num_iter: the most iterations, a positive int (Adam: exactly this many steps); default 50.
    :param optimizer: ``"lbfgs"`` (default; SciPy's L-BFGS-B through BoTorch's ``scipy_minimize``, stopping at
        convergence, as ``fit_gpytorch_mll``) or ``"adam"`` (``num_iter`` steps of rate ``lr``).
    :param lr: Adam's learning rate; default 0.01.
    :param noise: noise variances of the task's observations in place of the likelihood's; ``None`` (default): the likelihood's.
    :param mask: booleans ``(S, N)`` for a ragged task of batched streams (``False``: padding), as in
        :meth:`~gpytorch_hippo.online.OnlineSGPR.update`.
    :param fixed_mean: leave the mean function out of the fit (the stored task's interdomain variables cannot follow it).
    :param max_change: a refit (the model holds a posterior) that moves a positive hyperparameter by more than this
        factor is undone (for batched streams, only the streams whose own hyperparameters moved that far, unless a
        shared one did), as is any fit that ends below the bound it started from; ``None``: keep the optimiser's result
        as it ends (the thesis's protocol of a fixed number of Adam steps). The first fit, from initial values, is
        never undone for its size.
    :param progress: show a ``tqdm`` bar.
    :return: the :class:`~gpytorch_hippo.fitting.FitReport`; a rejected fit also issues a :class:`~gpytorch_hippo.fitting.RefitWarning`.
    :raises: whatever the optimisation raised, after restoring the hyperparameters it started from.
    """
    if not isinstance(num_iter, int) or isinstance(num_iter, bool) or num_iter < 1:
        raise ValueError(f"num_iter must be a positive int, got {num_iter!r}")
    if optimizer not in ("adam", "lbfgs"):
        raise ValueError(f"optimizer must be 'adam' or 'lbfgs', got {optimizer!r}")
    if max_change is not None and not (isinstance(max_change, (int, float)) and max_change > 1):
        raise ValueError(f"max_change must be a number > 1 or None, got {max_change!r}")
    frozen = ("posterior_", "mean_module.") if fixed_mean else ("posterior_",)
    parameters: dict[str, Tensor] = {name: p for name, p in model.named_parameters() if p.requires_grad and not name.startswith(frozen)}
    saved = {name: p.detach().clone() for name, p in parameters.items()}
    has_points = None if mask is None else mask.any(-1)
    num_data = max(int(mask.sum(-1).max()), 1) if mask is not None else int(getattr(train_y, "shape", (len(train_y),))[-1])

    streams: list[int] = []

    def bound() -> Tensor:
        value = model.log_bound(train_x, train_y, noise, mask=mask)
        streams[:] = list(value.shape[:1])  # (S,) for batched streams
        if has_points is not None:  # a stream without points: no term, so no gradient for its own hyperparameters
            value = torch.where(has_points, value, torch.zeros((), dtype=value.dtype))
        value = value.sum()
        if not bool(torch.isfinite(value)):
            raise ValueError(
                "the online bound is not finite during optimisation: try a smaller lr, optimizer='lbfgs', or standardise "
                "train_y (the hyperparameters were restored to those before the fit)"
            )
        return value

    def loss() -> Tensor:
        return -bound() / num_data

    def restore(which: Tensor | None = None) -> None:
        with torch.no_grad():
            for name, parameter in parameters.items():
                if which is None:
                    parameter.copy_(saved[name])
                elif parameter.dim() >= 1 and parameter.shape[0] == which.shape[0]:
                    parameter[which] = saved[name][which]

    refit = model.has_posterior
    positive_before = _positive_values(model, set(parameters))
    try:
        with torch.no_grad():
            before = float(bound())
        start = time.perf_counter()
        if optimizer == "adam":
            adam = torch.optim.Adam(list(parameters.values()), lr=lr)
            for _ in tqdm(range(num_iter), disable=not progress, desc="OnlineSGPR fit"):
                adam.zero_grad()
                loss().backward()
                adam.step()
            iterations, status, message = num_iter, "stopped", f"{num_iter} Adam steps"
        else:
            from botorch.optim.closures import ForwardBackwardClosure
            from botorch.optim.core import scipy_minimize

            result = scipy_minimize(ForwardBackwardClosure(loss, parameters), parameters, options={"maxiter": num_iter})
            iterations, status, message = result.step, result.status.name.lower(), str(result.message)
        with torch.no_grad():
            after = float(bound())
    except BaseException as error:
        restore()
        error.add_note("fit_online_bound restored the hyperparameters to their values before the fit")
        raise
    factors = _change_factors(positive_before, _positive_values(model, set(parameters)))
    largest = max((float(f.max()) for f in factors.values() if f.numel()), default=1.0)
    rejected = ""
    if max_change is not None and not after >= before:
        restore()
        rejected = f"the bound fell from {before:.6g} to {after:.6g} (try optimizer='lbfgs' or a smaller lr)"
    elif refit and max_change is not None and largest > max_change:
        moved = {name: f > max_change for name, f in factors.items() if bool((f > max_change).any())}
        per_stream = bool(streams) and all(f.dim() >= 1 and f.shape[0] == streams[0] for f in moved.values())
        worst = max(moved, key=lambda name: float(factors[name].max()))
        where = ""
        if per_stream:
            which = torch.stack([m.reshape(streams[0], -1).any(-1) for m in moved.values()]).any(0)
            restore(which)
            where = f" in stream(s) {which.nonzero().squeeze(-1).tolist()[:10]} (only their hyperparameters were restored)"
        else:
            restore()
        rejected = (
            f"{worst.replace('raw_', '')} moved {float(factors[worst].max()):.3g}x{where}, more than max_change={max_change:g} "
            "(to accept such moves pass max_change=None, OnlineSGPR(refit_max_change=None), or fit on more data at once)"
        )
    if rejected:
        with torch.no_grad():
            after = float(bound())
        warnings.warn(
            f"the hyperparameter fit was undone: {rejected}; the model keeps its hyperparameters from before the fit "
            "(FitReport.rejected says why)",
            RefitWarning,
            stacklevel=3,
        )
    return FitReport(optimizer, iterations, status, message, before, after, time.perf_counter() - start, rejected, largest)


def fit_before_update(
    model: Any,
    train_x: Tensor,
    train_y: Tensor,
    num_iter: int | None,
    optimizer: str = "adam",
    lr: float = 0.01,
    noise: Tensor | None = None,
    mask: Tensor | None = None,
    progress: bool = False,
) -> FitReport | None:
    """The fit that :meth:`~gpytorch_hippo.online.OnlineSGPR.update` runs before it absorbs a task: ``num_iter``
    iterations of ``optimizer`` if ``num_iter`` is given, else what the model's :class:`RefitPolicy` says for its next
    task (a policy fit leaves out a mean function that the stored task's interdomain variables, projections of
    :math:`f - m`, cannot follow; an explicit fit that would train it raises). Undone as the policy's ``max_change`` says.

    :param model: an :class:`~gpytorch_hippo.online.OnlineSGPR`.
    :param train_x: the task's inputs, checked (``(N, D)``; ``(S, N, D)`` for batched streams).
    :param train_y: the task's targets, checked.
    :param num_iter: the iterations, a non-negative int (``0``: no fit); ``None``: the refit policy decides.
    :param optimizer: ``"adam"`` (default) or ``"lbfgs"``, unless the refit policy decides.
    :param lr: Adam's learning rate, a positive number; default 0.01.
    :param noise: per-point noise variances in place of the likelihood's (``None``: the likelihood's).
    :param mask: booleans ``(S, N)`` of a ragged task of batched streams (``False``: padding).
    :param progress: show a ``tqdm`` bar.
    :return: the :class:`FitReport`, or ``None`` if nothing was fitted.
    """
    by_policy = num_iter is None
    if num_iter is None:
        num_iter, optimizer = model.refit_policy.next_fit(int(model.num_tasks)) or (0, optimizer)
    if not isinstance(num_iter, int) or isinstance(num_iter, bool) or num_iter < 0:
        raise ValueError(f"num_iter must be a non-negative int, got {num_iter!r}")
    lr = check_real(lr, "lr", low=0, low_open=True)
    if optimizer not in ("adam", "lbfgs"):
        raise ValueError(f"optimizer must be 'adam' or 'lbfgs', got {optimizer!r}")
    if num_iter == 0:
        return None
    stored = model.posterior_inducing_variables
    mean_is_fixed = stored is not None and stored.prior_mean(model.mean_module) is None  # interdomain: f - m
    fixed_mean = by_policy and mean_is_fixed
    if not fixed_mean and mean_is_fixed and any(p.requires_grad for p in model.mean_module.parameters()):
        raise ValueError(  # fail before optimising rather than at the first step that moves the mean
            "num_iter > 0 would train the mean function after the first task, which the stored task's "
            f"{type(stored).__name__} (projections of f - m) cannot follow: "
            "call mean_module.requires_grad_(False) first, or use InducingPoints"
        )
    max_change = model.refit_policy.max_change
    return fit_online_bound(model, train_x, train_y, num_iter, optimizer, lr, noise, mask, fixed_mean, max_change, progress)
