"""The class swap of BoTorch's rebuild-every-iteration loops that streams: :class:`OnlineGPStream`."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .models import OnlineGPModel

__all__ = ["OnlineGPStream"]


class OnlineGPStream:
    """Stands where a BoTorch loop names its model class, and turns the loop's rebuild on all data into one streaming
    step. ``Model = OnlineGPStream()`` once; the loop stays as BoTorch's tutorials write it::

        model = Model(X, Y, covar_module=..., likelihood=...)   # was SingleTaskGP(X, Y, ...)
        fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))

    The first call builds ``OnlineGPModel(X, Y, **options, **kwargs)``. A call whose data begin with all rows of the
    previous call (equal, with the same keyword arguments: modules of the same classes, other values equal) returns
    ``previous.observe(new rows)``: one online update at ``O(b M^2)`` for ``b`` new rows, the inducing points re-selected,
    the hyperparameters refitted on ``refit_every``'s schedule (each of the first ``refit_every`` batches, then every
    ``refit_every``-th, on at most ``exact_fit_size`` kept points). That schedule is the stream's fit: ``fit_gpytorch_mll``
    of a model the stream returns keeps its hyperparameters (it would refit ``exact_fit_size`` points each iteration).
    Any other call (fewer rows, other rows first, other keyword arguments) builds a new model from its data, as the
    first. The targets' ``Standardize`` is learned from the first call's data and then fixed, as in every stream.

    :param num_inducing: the most inducing points, re-selected from the data at every step (default 512).
    :param refit_every: the refit schedule of :meth:`~gpytorch_hippo.botorch.OnlineGPModel.observe` (default 10).
    :param options: other keyword arguments of :class:`~gpytorch_hippo.botorch.OnlineGPModel` for every model built.
    """

    def __init__(self, num_inducing: int = 512, refit_every: int = 10, **options: Any):
        self.options = dict(options, num_inducing=num_inducing, refit_every=refit_every)
        self.model: OnlineGPModel | None = None
        self.data: tuple[Tensor, Tensor, Tensor | None] | None = None
        self.keywords: dict[str, Any] = {}

    def __call__(self, train_X: Tensor, train_Y: Tensor, train_Yvar: Tensor | None = None, **kwargs: Any) -> OnlineGPModel:
        """The model of the data so far: the previous model streamed forward by the new rows, or a new one.

        :param train_X: all inputs so far, ``(n, d)``.
        :param train_Y: their targets, ``(n, m)``.
        :param train_Yvar: their known noise variances like ``train_Y`` (``None``: learned).
        :param kwargs: :class:`~gpytorch_hippo.botorch.OnlineGPModel`'s keyword arguments (``covar_module``, ...).
        """
        twice = sorted(set(kwargs) & set(self.options))
        if twice:
            raise TypeError(f"{', '.join(twice)}: a setting of every model the stream builds; pass it to OnlineGPStream(...)")
        keywords = {name: type(value) if isinstance(value, nn.Module) else value for name, value in kwargs.items()}
        start, previous = self.extends(train_X, train_Y, train_Yvar, keywords), self.model
        if start is None or previous is None:
            model = OnlineGPModel(train_X, train_Y, train_Yvar, **self.options, **kwargs)
        elif start == train_X.shape[0]:
            model = previous
        else:
            model = previous.observe(train_X[start:], train_Y[start:], None if train_Yvar is None else train_Yvar[start:])
        setattr(model, "fitted_by_stream", True)  # custom_fit keeps the schedule's hyperparameters
        self.model, self.data, self.keywords = model, (train_X, train_Y, train_Yvar), keywords
        return model

    def extends(self, X: Tensor, Y: Tensor, Yvar: Tensor | None, keywords: dict[str, Any]) -> int | None:
        """The number of rows of the previous call when ``(X, Y, Yvar)`` begin with them and ``keywords`` are the
        previous call's; ``None`` otherwise (a new model is built).

        :param X: all inputs of this call, ``(n, d)``.
        :param Y: their targets, ``(n, m)``.
        :param Yvar: their known noise variances, or ``None``.
        :param keywords: this call's keyword arguments, modules replaced by their classes.
        """
        if self.model is None or self.data is None or keywords.keys() != self.keywords.keys():
            return None
        if any(not _same(value, self.keywords[name]) for name, value in keywords.items()):
            return None
        old_X, old_Y, old_Yvar = self.data
        n = old_X.shape[0]
        if X.dim() != 2 or X.shape[0] < n or X.shape[1:] != old_X.shape[1:] or Y.shape[1:] != old_Y.shape[1:]:
            return None
        if (Yvar is None) != (old_Yvar is None):
            return None
        pairs = [(X, old_X), (Y, old_Y)] + ([] if Yvar is None or old_Yvar is None else [(Yvar, old_Yvar)])
        return n if all(new.dtype == old.dtype and new.device == old.device and torch.equal(new[:n], old) for new, old in pairs) else None


def _same(value: Any, old: Any) -> bool:
    """Whether a keyword argument is the previous call's: a module of the same class, or an equal value."""
    try:
        return bool(value == old) if not isinstance(value, Tensor) else isinstance(old, Tensor) and torch.equal(value, old)
    except (RuntimeError, TypeError):
        return False
