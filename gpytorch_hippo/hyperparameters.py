r"""Starting hyperparameters of an online model, fitted on its first task by an exact GP.

An online sparse GP keeps its kernel and noise fixed after the first task (thesis §4.6: "a full GP model
trained over the initial task"). :func:`fit_exact_hyperparameters` fits them there by type-II maximum likelihood,
:math:`\max_\theta \log \mathcal{N}(y; 0, K_\theta + \sigma^2 I)`, starting from :func:`grid_start`'s best
point of a length-scale/noise grid, since Adam on GPyTorch's softplus parameters leaves a far start only
slowly::

    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).double()
    likelihood = fit_exact_hyperparameters(kernel, x_first, y_first, num_iter=100, lr=0.05)
    model = OnlineSGPR(inducing, kernel, likelihood)
"""

from __future__ import annotations

import math

import gpytorch
import torch
from linear_operator.functions import pivoted_cholesky

__all__ = ["fit_exact_hyperparameters", "grid_start"]


def grid_start(kernel: gpytorch.kernels.ScaleKernel, likelihood, x: torch.Tensor, y: torch.Tensor, num_inducing: int | None = None) -> None:
    """Set ``kernel`` and ``likelihood`` to the best point of a grid by the exact log marginal
    likelihood: 30 length scales log-spaced from the median nearest-neighbour distance of ``x`` to
    its diameter, and 5 noise shares ``f`` of the variance ``v`` of ``y`` (outputscale ``v (1 - f)``,
    noise ``v f``).  Adam on GPyTorch's softplus parameters moves a length scale by about ``lr``
    per step, so a start far from the optimum is not left in 100 steps.

    With ``num_inducing`` below the number of points the grid is scored by the collapsed sparse
    bound (Titsias 2009) with the ``num_inducing`` pivoted-Cholesky points of ``x`` instead: the
    start of a sparse variational fit, which the exact likelihood can put at a noise far below
    what the bound supports.

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


def fit_exact_hyperparameters(
    kernel: gpytorch.kernels.Kernel, x: torch.Tensor, y: torch.Tensor, num_iter: int, lr: float, start: str = "grid"
) -> gpytorch.likelihoods.GaussianLikelihood:
    r"""Exact-GP type-II maximum likelihood on one task, :math:`\max_\theta \log \mathcal{N}(y; 0, K_\theta + \sigma^2 I)`;
    returns the fitted float64 ``GaussianLikelihood``.  ``start``: ``"grid"`` (default) begins at
    :func:`grid_start`'s best grid point, ``"given"`` at the kernel's current hyperparameters with noise 0.1
    (a start far from the optimum, e.g. a length scale of span/50 on a speech clip, is not left in 100 steps);
    then ``num_iter`` Adam steps of rate ``lr``.

    :param kernel: the kernel, fitted in place (a ``ScaleKernel`` for ``start="grid"``).
    :param x: the task's inputs ``(N, d)``.
    :param y: its targets ``(N,)``.
    :param num_iter: the number of Adam steps.
    :param lr: the Adam learning rate.
    :param start: ``"grid"`` (default) or ``"given"``, as above.
    """
    if start not in ("grid", "given"):
        raise ValueError(f"start must be 'grid' or 'given', got {start!r}")
    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    likelihood.noise = torch.tensor(0.1, dtype=torch.float64)
    likelihood.to(x.device)
    if start == "grid":
        if not isinstance(kernel, gpytorch.kernels.ScaleKernel):
            raise TypeError(f"start='grid' needs a ScaleKernel (it sets the outputscale), got {type(kernel).__name__}")
        grid_start(kernel, likelihood, x, y)

    class ExactGP(gpytorch.models.ExactGP):
        def forward(self, inputs):
            return gpytorch.distributions.MultivariateNormal(torch.zeros_like(inputs[:, 0]), kernel(inputs))

    model = ExactGP(x, y, likelihood)
    model.covar_module = kernel
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(num_iter):
        optimizer.zero_grad()
        (-mll(model(x), y)).backward()
        optimizer.step()
    return likelihood
