"""Starting points of the experiment runners' hyperparameter fits.

:func:`grid_start` sets a kernel and a likelihood to the best point of a length-scale/noise grid; the
Gaussian runner (:mod:`gpytorch_hippo.experiments.online`) and the ``OnlineELBO`` runs
(:mod:`gpytorch_hippo.experiments.online_elbo`) both begin their first-task fits there.
"""

from __future__ import annotations

import math

import gpytorch
import torch
from linear_operator.functions import pivoted_cholesky

__all__ = ["grid_start"]


def grid_start(kernel: gpytorch.kernels.ScaleKernel, likelihood, x: torch.Tensor, y: torch.Tensor, num_inducing: int | None = None) -> None:
    """Set ``kernel`` and ``likelihood`` to the best point of a grid by the exact log marginal
    likelihood: 30 length scales log-spaced from the median nearest-neighbour distance of ``x`` to
    its diameter, and 5 noise shares ``f`` of the variance ``v`` of ``y`` (outputscale ``v (1 - f)``,
    noise ``v f``).  Adam on GPyTorch's softplus parameters moves a length scale by about ``lr``
    per step, so a start far from the optimum is never left in the runner's 100 steps.

    With ``num_inducing`` below the number of points the grid is scored by the collapsed sparse
    bound (Titsias 2009) with the ``num_inducing`` pivoted-Cholesky points of ``x`` instead: the
    start of a sparse variational fit, which the exact likelihood can put at a noise far below
    what the bound supports (the ``OnlineELBO`` runs, :func:`.online_elbo.first_task_start`).

    Noise levels at or below the likelihood's noise constraint are left out of the grid (GPyTorch
    refuses to set them); if every level is, a ``ValueError`` names ``y``.

    :param kernel: a ``ScaleKernel`` whose base kernel has a ``lengthscale`` (set in place, with the outputscale).
    :param likelihood: a ``GaussianLikelihood`` (its noise is set in place).
    :param x: inputs ``(N, d)``.
    :param y: targets ``(N,)``.
    :param num_inducing: score by the sparse bound with this many points when below ``N``; ``None`` (default): exact.
    """
    constraint = getattr(getattr(likelihood, "noise_covar", None), "raw_noise_constraint", None)
    noise_floor = float(getattr(constraint, "lower_bound", 0.0))
    with torch.no_grad():
        distances = torch.cdist(x, x)
        nearest = distances.masked_fill(distances == 0, math.inf).min(-1).values
        low = nearest[torch.isfinite(nearest)].median().clamp_min(1e-12)
        lengthscales = torch.logspace(math.log10(low), math.log10(max(distances.max(), 1.001 * low)), 30)
        variance = y.var().clamp_min(1e-12)
        identity = torch.eye(len(x), dtype=x.dtype, device=x.device)
        sparse = num_inducing is not None and num_inducing < len(x)
        best: tuple[float, float | None, float | None] = (-math.inf, None, None)
        for lengthscale in lengthscales.tolist():
            kernel.base_kernel.lengthscale = torch.tensor(lengthscale, dtype=x.dtype, device=x.device)
            correlation = kernel.base_kernel(x).to_dense()
            if sparse:
                factor = pivoted_cholesky(correlation, rank=num_inducing, error_tol=0.0)
                nystrom = factor @ factor.transpose(-1, -2)
                residual = (correlation.diagonal() - nystrom.diagonal()).sum().clamp_min(0.0)
            for share in (0.5, 0.1, 0.03, 0.01, 0.001):
                if float(variance) * share <= noise_floor:
                    continue
                covariance = variance * ((1 - share) * (nystrom if sparse else correlation) + share * identity)
                chol, info = torch.linalg.cholesky_ex(covariance)
                if info.item() != 0:
                    continue
                alpha = torch.cholesky_solve(y.unsqueeze(-1), chol)
                mll = -0.5 * (y @ alpha.squeeze(-1)) - chol.diagonal().log().sum()
                if sparse:
                    mll = mll - 0.5 * (1 - share) / share * residual
                if mll > best[0]:
                    best = (mll.item(), lengthscale, share)
        _, best_lengthscale, best_share = best
        if best_lengthscale is None or best_share is None:
            raise ValueError(
                f"grid_start: the variance of y ({float(variance):.3g}) is too small for the likelihood's "
                f"noise bound {noise_floor:g}; standardise y or lower the likelihood's noise_constraint"
            )
        kernel.base_kernel.lengthscale = torch.tensor(best_lengthscale, dtype=x.dtype, device=x.device)
        kernel.outputscale = (variance * (1 - best_share)).to(x.dtype)
        likelihood.noise = (variance * best_share).to(x.dtype)
