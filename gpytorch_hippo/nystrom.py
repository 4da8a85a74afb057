"""The Nyström residual ``k(x, x) - Kfu Kuu⁻¹ Kuf`` of a sparse GP, checked rather than clamped."""

from __future__ import annotations

import warnings

import torch
from torch import Tensor


def nystrom_residual(kxx_diag: Tensor, whitened_cross: Tensor) -> Tensor:
    """``diag(K_XX - Q_XX)`` with ``Q_XX = Wᵀ W``, ``W = L⁻¹ K_uX`` (thesis eq. (2.36)).

    It is a conditional variance, so it must be ``>= 0``.  Exact covariances (spectral, quadrature,
    points) and Fourier-feature pairs that share their features keep it so up to round-off; an
    inconsistent pair (the thesis's ODE ``Kuf`` with Monte-Carlo ``Kuu``) can break it.  Values below
    ``-sqrt(eps) k(x, x)`` raise a ``RuntimeWarning`` naming the cause (one text, so Python's
    warning filter shows it once per call site, not once per optimiser step); nothing is clipped here.
    """
    residual = kxx_diag - whitened_cross.square().sum(-2)
    tolerance = torch.finfo(residual.dtype).eps ** 0.5 * kxx_diag.detach().abs()
    worst = (residual.detach() + tolerance).min() if residual.numel() else residual.new_zeros(())
    if worst < 0:
        warnings.warn(
            "negative Nyström residual k(x,x) - Kfu Kuu^-1 Kuf: Kuu and Kuf are inconsistent, e.g. HiPPO kuf='ode' "
            "with few random features; predictive variances and the bound are unreliable. "
            "Use kuf='rff', more features, or method='spectral'/'quadrature'",
            RuntimeWarning,
            stacklevel=3,
        )
    return residual
