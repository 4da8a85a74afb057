r"""The Nyström residual :math:`k(x, x) - K_{fu} K_{uu}^{-1} K_{uf}` of a sparse GP, checked rather than clamped."""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from .inducing.base import InconsistentCovarianceWarning


def nystrom_residual(kxx_diag: Tensor, whitened_cross: Tensor, computed_in: torch.dtype | None = None) -> Tensor:
    r""":math:`\operatorname{diag}(K_{XX} - Q_{XX})` with :math:`Q_{XX} = W^\top W`, :math:`W = L^{-1} K_{uX}` (thesis eq. (2.36)).

    It is a conditional variance, so it must be :math:`\ge 0`.  Exact covariances (spectral, quadrature,
    points) and Fourier-feature pairs that share their features keep it so up to round-off; an
    inconsistent pair (the thesis's ODE ``Kuf`` with Monte-Carlo ``Kuu``) can break it.  Values below
    ``-sqrt(eps) k(x, x)`` (``eps`` of the dtype the covariances were computed in) raise an
    :class:`~gpytorch_hippo.inducing.InconsistentCovarianceWarning` (a ``RuntimeWarning``) naming the cause (one
    text, so Python's warning filter shows it once per call site, not once per optimiser step); nothing is clipped.

    :param kxx_diag: the prior variances :math:`k(x_i, x_i)`, shape ``(..., N)``.
    :param whitened_cross: :math:`W = L^{-1} K_{uX}` with :math:`L` the Cholesky factor of :math:`K_{uu}`, shape ``(..., M, N)``.
    :param computed_in: the dtype in which :math:`K_{uu}`, :math:`K_{uf}` and :math:`k(x, x)` were computed, which sets the round-off
        the check tolerates (a float32 model's covariances promoted to float64 carry float32's); ``None``: ``kxx_diag``'s.
    :return: the residual ``(..., N)``, unclipped.
    """
    residual = kxx_diag - whitened_cross.square().sum(-2)
    tolerance = torch.finfo(computed_in or residual.dtype).eps ** 0.5 * kxx_diag.detach().abs()
    worst = (residual.detach() + tolerance).min() if residual.numel() else residual.new_zeros(())
    if worst < 0:
        warnings.warn(
            "negative Nyström residual k(x,x) - Kfu Kuu^-1 Kuf: Kuu and Kuf are inconsistent, e.g. HiPPO kuf='ode' "
            "with few random features; predictive variances and the bound are unreliable. "
            "Use kuf='rff', more features, or method='spectral'/'quadrature'",
            InconsistentCovarianceWarning,
            stacklevel=3,
        )
    return residual
