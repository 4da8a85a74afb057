"""Choosing inducing inputs from candidates by greedy pivoted Cholesky (OVC, Maddox et al. 2021).

OVC re-selects its inducing points at every task from the old inducing inputs together with the
new task's inputs: the greedy pivots of a partial pivoted Cholesky of ``k(X, X)`` are the inputs
whose residual prior variance (given the points already chosen) is largest (Harbrecht et al.
2012; the thesis's OVC baseline, §4.6). This module only selects; the online update that follows
is the shared :class:`~gpytorch_hippo.online.OnlineSGPR` / :class:`~gpytorch_hippo.online.OnlineELBO`.
"""

from __future__ import annotations

import gpytorch
import torch
from torch import Tensor

#: candidate sets with at most this many Gram entries (batch included) form ``k(X, X)`` once (128 MiB in float64)
_GRAM_ENTRIES = 2**24
_TINY = 1e-300


def select_pivoted_cholesky(kernel: gpytorch.kernels.Kernel, candidates: Tensor, num: int, tol: float = 1e-10) -> Tensor:
    r"""Return at most ``num`` rows of ``candidates`` ``(N, D)`` picked greedily by pivoted Cholesky of ``k(X, X)``.

    The rows come back in pivot order (the first has the largest prior variance, each next one the
    largest variance conditioned on those before). The selection stops early, as Maddox et al.'s
    (2021) does, once the largest residual variance falls to ``tol`` times the largest prior variance:
    the points chosen then explain the kernel on every candidate, and a further pivot would be a
    numerical duplicate of one of them (``num`` is an upper bound). A batched kernel gives one
    selection per batch member, ``(*batch, m, D)``, all of the same size ``m``: the selection stops
    when the first member's residual is exhausted, so no member returns a duplicate. ``num`` larger
    than ``N`` raises.

    Only the diagonal and ``num`` columns of ``k(X, X)`` are evaluated, ``O(N num²)`` time and
    ``O(N num)`` memory: with ``l_m`` the ``m``-th row of the partial factor and ``d`` the residual
    variances, pivot :math:`i_m = \operatorname{argmax} d`,
    :math:`l_m = (k(X, x_{i_m}) - L_{<m}^\top L_{<m, i_m}) / \sqrt{d_{i_m}}`, :math:`d \leftarrow d - l_m^2`.

    :param kernel: the GP's kernel :math:`k`; one with a ``batch_shape`` gives one selection per batch member.
    :param candidates: the candidate inputs ``(N, D)`` (e.g. the old inducing inputs and the new task's inputs).
    :param num: the most points to select, an int in ``[1, N]``.
    :param tol: stop once the largest residual variance is at most ``tol`` times the largest prior variance, a float
        in ``[0, 1)``; default ``1e-10``, ``0``: stop only where a residual variance reaches zero.
    :return: the selected rows ``(m, D)`` (``(*batch, m, D)`` for a batched kernel), ``m <= num``, in pivot order.
    """
    if not isinstance(candidates, Tensor) or candidates.dim() != 2:
        raise ValueError(f"candidates must be a (N, D) tensor, got {getattr(candidates, 'shape', type(candidates))}")
    if not (isinstance(num, int) and 1 <= num <= candidates.shape[0]):
        raise ValueError(f"num must be an int in [1, {candidates.shape[0]}] (number of candidates), got {num!r}")
    if not (isinstance(tol, (int, float)) and 0 <= tol < 1):
        raise ValueError(f"tol must be a float in [0, 1) (residual variance relative to the largest prior variance), got {tol!r}")
    with torch.no_grad():
        residual = kernel(candidates, diag=True).clone()  # (*batch, N)
        if not bool(torch.isfinite(residual).all()):
            raise ValueError("the kernel's prior variances at the candidates are not finite (diverged hyperparameters?)")
        threshold = tol * residual.max(-1, keepdim=True).values  # (*batch, 1)
        batch_shape = residual.shape[:-1]
        rows = candidates.expand(*batch_shape, *candidates.shape)
        # small candidate sets: one Gram matrix, then pure indexing; large ones: one kernel column per pivot
        gram = kernel(rows).to_dense() if residual.numel() * candidates.shape[0] <= _GRAM_ENTRIES else None
        factor = residual.new_zeros(*batch_shape, num, candidates.shape[0])
        pivots = residual.new_zeros(*batch_shape, num, dtype=torch.long)
        chosen_count = num
        for m in range(num):
            best, pivot = residual.max(-1, keepdim=True)  # (*batch, 1)
            if m > 0 and bool((best <= threshold).any()):
                chosen_count = m
                break
            pivots[..., m : m + 1] = pivot
            if gram is None:
                chosen = torch.take_along_dim(rows, pivot[..., None], dim=-2)  # (*batch, 1, D)
                column = kernel(rows, chosen).to_dense()[..., 0]  # k(X, x_i): (*batch, N)
            else:
                column = torch.take_along_dim(gram, pivot[..., None], dim=-1)[..., 0]
            previous = torch.take_along_dim(factor[..., :m, :], pivot[..., None], dim=-1)  # (*batch, m, 1)
            column = column - (factor[..., :m, :] * previous).sum(-2)
            factor[..., m, :] = column * best.clamp_min(_TINY).rsqrt()
            residual = residual - factor[..., m, :].square()
            residual.scatter_(-1, pivot, float("-inf"))  # never chosen twice
    return torch.take_along_dim(rows, pivots[..., :chosen_count, None], dim=-2).clone()
