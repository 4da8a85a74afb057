"""Predictive metrics of the online-learning experiments (thesis §4.6, "Evaluations & metrics").

``nlpd`` and ``rmse`` are the thesis's NLPD/RMSE; ``interval_ece`` is its interval calibration
error from predictive samples (10 central intervals ``c_k = 0.05, 0.15, ..., 0.95``, empirical
quantiles of ``S`` samples per test point).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

INTERVAL_LEVELS = tuple(0.05 + 0.1 * k for k in range(10))


def _check_same_shape(**tensors: Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"shapes must match, got {shapes}")


def rmse(mean: Tensor, y: Tensor) -> float:
    """``sqrt(mean((y - ŷ)^2))`` with ``ŷ`` the predictive mean."""
    _check_same_shape(mean=mean, y=y)
    return (y - mean).pow(2).mean().sqrt().item()


def gaussian_nlpd(mean: Tensor, variance: Tensor, y: Tensor) -> float:
    """``-mean_i log N(y_i; mean_i, variance_i)`` for a Gaussian predictive (variance includes noise)."""
    _check_same_shape(mean=mean, variance=variance, y=y)
    if (variance <= 0).any():
        raise ValueError("variance must be positive")
    return (0.5 * torch.log(2 * math.pi * variance) + 0.5 * (y - mean).pow(2) / variance).mean().item()


def nlpd_from_log_density(log_density: Tensor) -> float:
    """NLPD from per-point predictive log densities ``log p̂(y_i | x_i)`` (any likelihood)."""
    return -log_density.mean().item()


def interval_ece(samples: Tensor, y: Tensor, levels=INTERVAL_LEVELS) -> float:
    """Thesis interval ECE: ``mean_k |coverage of the central c_k interval - c_k|``.

    :param samples: predictive samples ``(S, N)`` of ``y`` (thesis: ``S = 100``).
    :param y: observations ``(N,)``.
    """
    if samples.dim() != 2 or samples.shape[-1] != y.shape[-1] or y.dim() != 1:
        raise ValueError(f"samples must be (S, N) and y (N,), got {tuple(samples.shape)} and {tuple(y.shape)}")
    samples = samples.to(torch.float64)
    y = y.to(torch.float64)
    errors = []
    for level in levels:
        lower = torch.quantile(samples, (1 - level) / 2, dim=0)
        upper = torch.quantile(samples, (1 + level) / 2, dim=0)
        coverage = ((y >= lower) & (y <= upper)).to(torch.float64).mean().item()
        errors.append(abs(coverage - level))
    return sum(errors) / len(errors)
