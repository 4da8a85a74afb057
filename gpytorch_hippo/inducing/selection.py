"""Choosing inducing inputs from candidates by greedy pivoted Cholesky (OVC, Maddox et al. 2021).

OVC re-selects its inducing points at every task from the old inducing inputs together with the
new task's inputs: the greedy pivots of a partial pivoted Cholesky of ``k(X, X)`` are the inputs
whose residual prior variance (given the points already chosen) is largest (Harbrecht et al.
2012; the thesis's OVC baseline, §4.5). This module only selects; the online update that follows
is the shared :class:`~gpytorch_hippo.online.OnlineSGPR` / :class:`~gpytorch_hippo.online.OnlineELBO`.
"""

from __future__ import annotations

import gpytorch
import torch
from linear_operator.functions import pivoted_cholesky
from torch import Tensor


def select_pivoted_cholesky(kernel: gpytorch.kernels.Kernel, candidates: Tensor, num: int) -> Tensor:
    """Return ``num`` rows of ``candidates`` ``(N, D)`` picked greedily by pivoted Cholesky of ``k(X, X)``.

    The rows come back in pivot order (the first has the largest prior variance, each next one the
    largest variance conditioned on those before). ``num`` larger than ``N`` raises.
    """
    if not isinstance(candidates, Tensor) or candidates.dim() != 2:
        raise ValueError(f"candidates must be a (N, D) tensor, got {getattr(candidates, 'shape', type(candidates))}")
    if not (isinstance(num, int) and 1 <= num <= candidates.shape[0]):
        raise ValueError(f"num must be an int in [1, {candidates.shape[0]}] (number of candidates), got {num!r}")
    with torch.no_grad():
        gram = kernel(candidates).to_dense()
        # linear_operator stops early if the residual trace falls under error_tol; we want exactly ``num``.
        _, pivots = pivoted_cholesky(gram, rank=num, error_tol=0.0, return_pivots=True)
    return candidates[pivots[..., :num]].clone()
