r"""Predictive metrics of the online-learning experiments (thesis §4.6, "Evaluations & metrics").

``nlpd`` and ``rmse`` are the thesis's NLPD/RMSE; ``interval_ece`` is its interval calibration
error from predictive samples (10 central intervals :math:`c_k = 0.05, 0.15, \dots, 0.95`, empirical
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
    r""":math:`\sqrt{\tfrac{1}{N} \sum_i (y_i - \hat y_i)^2}` with :math:`\hat y` the predictive mean.

    :param mean: predictive means :math:`\hat y`, any shape (the same as ``y``).
    :param y: observations, the same shape as ``mean``.
    """
    _check_same_shape(mean=mean, y=y)
    return (y - mean).pow(2).mean().sqrt().item()


def gaussian_nlpd(mean: Tensor, variance: Tensor, y: Tensor) -> float:
    r""":math:`-\tfrac{1}{N} \sum_i \log \mathcal{N}(y_i; \mu_i, \sigma_i^2)` for a Gaussian predictive (variance includes noise).

    :param mean: predictive means :math:`\mu_i`, any shape (the same as ``y``).
    :param variance: predictive variances :math:`\sigma_i^2 > 0` of ``y`` (observation noise included), the same shape.
    :param y: observations, the same shape as ``mean``.
    """
    _check_same_shape(mean=mean, variance=variance, y=y)
    if (variance <= 0).any():
        raise ValueError("variance must be positive")
    return (0.5 * torch.log(2 * math.pi * variance) + 0.5 * (y - mean).pow(2) / variance).mean().item()


def nlpd_from_log_density(log_density: Tensor) -> float:
    r"""NLPD :math:`-\tfrac{1}{N} \sum_i \log \hat p(y_i \mid x_i)` from per-point predictive log densities (any likelihood).

    :param log_density: the log densities :math:`\log \hat p(y_i \mid x_i)`, any shape (averaged over all entries).
    """
    return -log_density.mean().item()


def interval_ece(samples: Tensor, y: Tensor, levels=INTERVAL_LEVELS) -> float:
    r"""Thesis interval ECE: :math:`\tfrac{1}{K} \sum_k |\mathrm{coverage}_k - c_k|`, the coverage of the central :math:`c_k` interval.

    :param samples: predictive samples ``(S, N)`` of ``y`` (thesis: ``S = 100``).
    :param y: observations ``(N,)``.
    :param levels: the central-interval probabilities :math:`c_k \in (0, 1)`; default ``INTERVAL_LEVELS``,
        :math:`c_k = 0.05, 0.15, \dots, 0.95`.
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
