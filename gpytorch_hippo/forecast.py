r"""Forecasts as a pandas table: ``forecast(model, future_times)``.

For an online GP regressor (:class:`~gpytorch_hippo.online.OnlineSGPR`) with a Gaussian likelihood, the forecast of
an observation :math:`y(x) = f(x) + \varepsilon` at a future time :math:`x` is Gaussian with

.. math::

    \mu(x) = \mathbb{E}[f(x)], \qquad s(x) = \sqrt{\operatorname{var} f(x) + \sigma^2},
    \qquad [\mu - z\, s,\ \mu + z\, s], \quad z = \Phi^{-1}\big(\tfrac{1 + \mathrm{level}}{2}\big),

where :math:`\sigma^2` is the likelihood's noise: the interval is a predictive interval for the readings, not a
credible interval for :math:`f` (``include_noise=False`` gives that one).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from probseq._optional import require

from .timeaxis import is_datetime_like

__all__ = ["forecast"]


def forecast(model, future_times, level: float = 0.95, include_noise: bool = True) -> Any:
    r"""The model's forecast at ``future_times``: a ``DataFrame`` with columns ``mean``, ``std``, ``lower``, ``upper``.

    ``mean`` is :math:`\mu(x)`, ``std`` is :math:`s(x) = \sqrt{\operatorname{var} f(x) + \sigma^2}` (the likelihood's noise
    included) and ``[lower, upper] = \mu \mp z s`` the central ``level`` interval, :math:`z = \Phi^{-1}((1 + \mathrm{level})/2)`
    (module docstring).  Calendar times (pandas ``DatetimeIndex``/``Series``, NumPy ``datetime64``) go through the
    model's :class:`~gpytorch_hippo.timeaxis.TimeAxis` and index the table as given (time zone kept); numbers index it
    as numbers.  The model is evaluated in ``eval`` mode without gradients and left in the mode it was in.

    :param model: a single-stream online GP regressor holding a posterior (``model(x)`` returns :math:`q(f(x))`,
        ``model.likelihood`` a Gaussian likelihood), e.g. :class:`~gpytorch_hippo.online.OnlineSGPR` after an ``update``.
    :param future_times: the times to forecast, non-decreasing, without NaN/NaT: calendar times (the model needs a
        ``time_axis``) or numbers in the model's time unit, 1-D.
    :param level: the interval's probability, in ``(0, 1)``.
    :param include_noise: ``True`` (default): intervals for the readings :math:`y`; ``False``: for :math:`f`.
    :raises ValueError: for a model without a posterior, a batched model, NaN/NaT or unsorted times, a bad ``level``.
    :raises TypeError: for calendar times on a model without a time axis, or times whose zone the axis does not share.
    :raises ImportError: without pandas (``pip install "probseq[data]"``).
    """
    pd = require("pandas", "data", "forecast tables")
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        raise ValueError(f"level must be a probability in (0, 1), e.g. 0.95, got {level!r}")
    if not getattr(model, "has_posterior", True):
        raise ValueError("the model holds no posterior yet: call model.update(x, y) on the observed data first")
    calendar = is_datetime_like(future_times)
    if calendar:
        axis = getattr(model, "time_axis", None)
        if axis is None:
            raise TypeError("calendar times need a model with a time axis: build it with time_axis=TimeAxis('h', ...)")
        index = pd.DatetimeIndex(np.asarray(future_times) if isinstance(future_times, np.ndarray) else future_times)
        t = axis(index)
    else:
        t = torch.as_tensor(
            np.asarray(future_times.detach().cpu() if isinstance(future_times, torch.Tensor) else future_times, dtype=np.float64)
        )
        index = pd.Index(t.numpy(), name="t")
    if t.dim() != 1:
        raise ValueError(f"future_times must be 1-D (one time per row), got shape {tuple(t.shape)}")
    if bool(torch.isnan(t).any()):
        raise ValueError("future_times contain NaN: drop those rows first")
    if bool((t[1:] < t[:-1]).any()):
        raise ValueError("future_times must be in time order: sort them first (e.g. index.sort_values())")
    dtype = next(model.parameters()).dtype
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            latent = model(t.to(dtype)[:, None])
            predictive = model.likelihood(latent) if include_noise else latent
            mean, variance = predictive.mean, predictive.variance
    finally:
        model.train(was_training)
    if mean.dim() != 1:
        raise ValueError(f"forecast takes a single-stream model; this one predicts shape {tuple(mean.shape)}: slice the streams")
    std = variance.clamp_min(0).sqrt()
    z = math.sqrt(2) * float(torch.special.erfinv(torch.tensor(float(level), dtype=torch.float64)))
    mean, std = mean.double().cpu().numpy(), std.double().cpu().numpy()
    return pd.DataFrame({"mean": mean, "std": std, "lower": mean - z * std, "upper": mean + z * std}, index=index)
