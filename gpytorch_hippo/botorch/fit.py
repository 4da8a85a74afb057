"""Fitting an :class:`~gpytorch_hippo.botorch.OnlineGPModel`'s hyperparameters with BoTorch's ``fit_gpytorch_mll``:
:class:`~gpytorch_hippo.botorch.fit.OnlineCollapsedMLL`, the collapsed online bound as a marginal likelihood, and
:func:`~gpytorch_hippo.botorch.fit.fit_hyperparameters`, the transactional online refit of one output on it."""

from __future__ import annotations

import warnings
from typing import Any, cast

import torch
from botorch.exceptions.errors import ModelFittingError
from botorch.fit import fit_gpytorch_mll
from gpytorch.mlls import MarginalLogLikelihood
from torch import Tensor

from ..online import OnlineSGPR
from . import _output
from .exceptions import OnlineGPModelWarning

__all__ = ["DEFAULT_EXACT_FIT_SIZE", "OnlineCollapsedMLL", "exact_fit_indices", "fit_hyperparameters"]

#: the most kept points whose exact marginal likelihood an exact fit maximises (:func:`exact_fit_indices`)
DEFAULT_EXACT_FIT_SIZE = 1000


class OnlineCollapsedMLL(MarginalLogLikelihood):
    """The collapsed online bound of absorbing ``(train_x, train_y)`` into ``model``'s stored summary
    (:meth:`~gpytorch_hippo.online.OnlineSGPR.log_bound`, the online bound of Bui et al. (2017), thesis eq. (4.6), at
    the optimal ``q(u)``) plus the log priors of the hyperparameters, divided by the batch size, as
    ``fit_gpytorch_mll`` expects.

    :param model: an :class:`~gpytorch_hippo.botorch.OnlineGPModel` with one output (or ``model.outputs[j]``).
    :param train_x: the batch in the model's (input-transformed) space, ``(n, d)``.
    :param train_y: its outcome-transformed targets, ``(n,)``.
    :param noise: known noise variances of the batch in the outcome-transformed space, ``(n,)`` (``None``:
        the likelihood's).
    """

    def __init__(self, model: _output.OutputModel, train_x: Tensor, train_y: Tensor, noise: Tensor | None = None):
        if not isinstance(getattr(model, "online", None), OnlineSGPR):
            raise TypeError(f"model must be an OnlineGPModel with one output, got {type(model).__name__}")
        super().__init__(model.likelihood, cast(Any, model))
        self.train_x, self.train_y, self.noise = train_x, train_y, noise

    def forward(self, function_dist=None, target=None, **kwargs) -> Tensor:
        """The bound per data point for the stored batch ``(train_x, train_y)``; the arguments are ignored.

        :param function_dist: ignored (GPyTorch's interface; the collapsed bound needs no ``q(f)``).
        :param target: ignored (the targets are ``train_y``).
        """
        bound = self.model.online.log_bound(self.train_x, self.train_y, noise=self.noise)
        for _, module, prior, closure, _ in self.model.named_priors():  # the likelihood is inside the model
            bound = bound + prior.log_prob(closure(module)).sum()
        return bound / self.train_y.shape[-1]

    def compute_custom_loss(self, **kwargs) -> Tensor:
        """The loss that ``fit_gpytorch_mll`` minimises (BoTorch's hook for custom objectives)."""
        return -self()

    def state_dict(self, *args, **kwargs) -> dict:
        """The tensors only: ``fit_gpytorch_mll`` checkpoints them to roll back a failed attempt and
        cannot copy non-tensor extra state (HiPPO's recurrence step), which fitting does not change."""
        state = super().state_dict(*args, **kwargs)
        return type(state)((key, value) for key, value in state.items() if isinstance(value, Tensor))

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Loads :meth:`state_dict`'s tensors; the non-tensor extra state it leaves out is kept.

        :param state_dict: a dict of tensors, as :meth:`state_dict` returns.
        :param strict: raise on unexpected keys or missing tensors (missing ``_extra_state`` is fine); default ``True``.
        :param assign: ``torch.nn.Module.load_state_dict``'s: assign the tensors instead of copying them in; default ``False``.
        """
        result = super().load_state_dict(state_dict, strict=False, assign=assign)
        if strict and result.unexpected_keys:
            raise RuntimeError(f"unexpected keys in state_dict: {result.unexpected_keys}")
        missing = [key for key in result.missing_keys if not key.endswith("_extra_state")]
        if strict and missing:
            raise RuntimeError(f"missing keys in state_dict: {missing}")
        return result


def fit_hyperparameters(model: _output.OutputModel, x: Tensor, y: Tensor, maxiter: int = 100, noise: Tensor | None = None) -> None:
    """Maximise the collapsed online bound of absorbing ``(x, y)`` (model space) over ``model``'s trainable
    hyperparameters with ``fit_gpytorch_mll`` (L-BFGS-B, at most ``maxiter`` iterations), carrying the stored
    ``q(u)`` to them. A fit that ends below its starting bound (L-BFGS-B can stop "ABNORMAL" after a bad line search)
    is rolled back: a refit never leaves the bound lower than it found it. A fit that fails (``fit_gpytorch_mll``
    raises ``ModelFittingError`` after all its attempts) is rolled back too, with an :class:`OnlineGPModelWarning`.

    :param model: a single-output model (or ``model.outputs[j]``).
    :param x: the batch's inputs ``(n, d)`` in the model (input-transformed) space.
    :param y: its targets ``(n,)`` in the model (outcome-transformed) space.
    :param maxiter: the most L-BFGS-B iterations (default 100).
    :param noise: known noise variances ``(n,)`` of the batch in the model space; ``None`` (default): the
        likelihood's noise, which is then fitted too.
    """
    mll = OnlineCollapsedMLL(model, x, y, noise)
    with torch.no_grad():
        start = mll()
    before = {key: value.clone() for key, value in mll.state_dict().items()}
    with _output.own_update(model):
        try:
            fit_gpytorch_mll(mll, optimizer_kwargs={"options": {"maxiter": maxiter}})
        except ModelFittingError as error:
            mll.load_state_dict(before)
            warnings.warn(
                f"the hyperparameter fit on the online bound failed ({error}); the model keeps the hyperparameters it had before the fit",
                OnlineGPModelWarning,
                stacklevel=2,
            )
        model.eval()
        with torch.no_grad():
            if not mll() >= start:
                mll.load_state_dict(before)
    if model.online.has_posterior:
        model.hyperparameter_record.record(model.online)


def exact_fit_indices(targets: Tensor, size: int | None) -> Tensor | None:
    """The kept points whose exact marginal likelihood an exact fit of an :class:`~gpytorch_hippo.botorch.OnlineGPModel`
    maximises, as GPyTorch approximates past ``max_cholesky_size``: ``None`` (all of them) for at most ``size`` points
    (or ``size`` ``None``); otherwise, in the order kept, the ``size // 4`` with the highest targets and the most recent
    others, the same on every machine (ties go to the earlier point). Its cost is then :math:`O(size^3)` per iteration.

    :param targets: the kept targets ``(n,)``, in the order observed.
    :param size: the most points, a positive int, or ``None``.
    """
    n = targets.shape[-1]
    if size is None or n <= size:
        return None
    best = torch.sort(torch.argsort(-targets.detach(), stable=True)[: size // 4]).values
    chosen = torch.zeros(n, dtype=torch.bool, device=targets.device)
    chosen[best] = True
    recent = torch.nonzero(~chosen).squeeze(-1)[-(size - best.shape[0]) :]
    chosen[recent] = True
    return torch.nonzero(chosen).squeeze(-1)
