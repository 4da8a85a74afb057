r"""Pseudo-time orders for inputs without a natural order (thesis §4.4).

HiPPO inducing variables for multidimensional inputs integrate along a path :math:`x(s)` through input
space: the :math:`i`-th input of a task is placed at time :math:`i\, \Delta t` (thesis eq. (4.18)).
When the data of a task has no time order (continual learning on i.i.d. inputs) one must be made
up, and the quality of OHSVGP depends on it (thesis Fig. 4.2).
:func:`order_inputs` implements the criteria of the thesis:

* ``"random"`` (OHSVGP-rand): a random permutation;
* ``"kernel_max"`` (OHSVGP-k-max): greedy kernel-similarity maximisation,
  :math:`x_1 = \operatorname{argmax}_x k(x, 0)`, :math:`x_i = \operatorname{argmax}_{x \text{ not yet chosen}} k(x, x_{i-1})`:
  consecutive inputs are close, so the signal the memory has to compress is smooth;
* ``"kernel_min"`` (OHSVGP-k-min): the same with :math:`\operatorname{argmin}` (a deliberately bad order);
* a callable ``key`` mapping inputs to scores, sorted in increasing order (e.g. the "oracle"
  order of a known time stamp or of a coordinate).

The thesis defines the first point of the *first* task with respect to the origin :math:`0`. To
continue the greedy path across tasks pass ``start=`` the last input of the previous task (in its
order); with ``start=None`` the origin is used, as in the thesis.
"""

from __future__ import annotations

from collections.abc import Callable

import gpytorch
import torch
from linear_operator import to_dense
from torch import Tensor

__all__ = ["ORDERING_CRITERIA", "order_inputs"]

#: The named criteria of :func:`order_inputs` (``criterion=``); a callable scoring the inputs is also accepted.
ORDERING_CRITERIA = ("random", "kernel_max", "kernel_min")


def _check_x(x) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() == 1:
        x = x.unsqueeze(-1)
    if x.dim() != 2 or x.shape[0] < 1:
        raise ValueError(f"x must have shape (N, D) or (N,) with N >= 1, got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got dtype {x.dtype}")
    if not torch.isfinite(x).all():
        raise ValueError("x contains NaN or infinite values")
    return x


def _check_start(start, x: Tensor) -> Tensor:
    if start is None:
        return torch.zeros(1, x.shape[-1], dtype=x.dtype, device=x.device)
    if not isinstance(start, Tensor):
        raise TypeError(f"start must be a torch.Tensor or None, got {type(start).__name__}")
    if start.numel() != x.shape[-1] or start.dim() > 2 or (start.dim() == 2 and start.shape[0] != 1):
        raise ValueError(f"start must be one input of dimension D = {x.shape[-1]} (shape ({x.shape[-1]},)), got {tuple(start.shape)}")
    start = start.reshape(1, -1).to(dtype=x.dtype, device=x.device)
    if not torch.isfinite(start).all():
        raise ValueError("start contains NaN or infinite values")
    return start


def _kernel_matrix(kernel: gpytorch.kernels.Kernel, a: Tensor, b: Tensor) -> Tensor:
    return to_dense(kernel(a, b))


def _greedy_kernel_order(x: Tensor, kernel: gpytorch.kernels.Kernel, start: Tensor, maximise: bool, block_size: int) -> Tensor:
    """Greedy path: each next point is the arg-extremum of ``k(., previous)`` over the remaining points.

    The ``N x N`` kernel matrix is evaluated once, ``block_size`` rows per kernel call (``O(N^2)``
    kernel evaluations, ``N^2`` entries of memory); the ``N`` greedy steps are then vectorised
    masked arg-extrema over one row each.
    """
    num = x.shape[0]
    gram = torch.cat([_kernel_matrix(kernel, x[i : i + block_size], x) for i in range(0, num, block_size)], dim=0)
    first_row = _kernel_matrix(kernel, start, x)[0]
    if gram.shape != (num, num) or first_row.shape != (num,):
        raise ValueError(
            f"kernel must map inputs (N, D) x (N', D) to an (N, N') matrix (a single-output kernel without "
            f"batch shape), got {tuple(gram.shape)} for N = N' = {num}"
        )
    # Turn both criteria into an argmax; chosen points get -inf so they are never picked again.
    if not maximise:
        gram, first_row = -gram, -first_row
    taken = torch.zeros(num, dtype=torch.bool, device=x.device)
    order = torch.empty(num, dtype=torch.long, device=x.device)
    scores = first_row
    for i in range(num):
        nxt = torch.argmax(scores.masked_fill(taken, float("-inf")))
        order[i] = nxt
        taken[nxt] = True
        scores = gram[nxt]
    return order


def order_inputs(
    x: Tensor,
    criterion: str | Callable[[Tensor], Tensor] = "random",
    kernel: gpytorch.kernels.Kernel | None = None,
    start: Tensor | None = None,
    generator: torch.Generator | None = None,
    block_size: int = 1024,
) -> Tensor:
    r"""Permutation that puts the inputs of one task into a pseudo-time order (thesis §4.4).

    ``x[order_inputs(x, ...)]`` are the inputs in the order in which they are placed at times
    :math:`\Delta t, 2 \Delta t, \dots` on the path of multidimensional HiPPO inducing variables (thesis eq.
    ``multi_dim_hippo_kfu``).

    :param x: inputs ``(N, D)`` (or ``(N,)``) of one task.
    :param criterion: ``"random"`` (uniform random permutation drawn with ``generator``),
        ``"kernel_max"`` (:math:`x_1 = \operatorname{argmax}_x k(x, s)`, then :math:`x_i = \operatorname{argmax} k(x, x_{i-1})` over the
        points not chosen yet), ``"kernel_min"`` (the same with ``argmin``), or a callable
        ``key(x) -> (N,)`` scores, sorted increasingly (stable; the "oracle" order).
    :param kernel: the GPyTorch kernel :math:`k` of the kernel criteria (ignored by the others). Use the
        model's kernel, e.g. ``model.covar_module``.
    :param start: the reference input :math:`s` of the first greedy step, shape ``(D,)``. ``None``: the
        origin ``0``, as the thesis defines the first task. To continue the greedy path across
        tasks pass the last ordered input of the previous task. Ignored by the other criteria.
    :param generator: random generator of the ``"random"`` criterion (for reproducibility).
    :param block_size: rows of the kernel matrix evaluated per kernel call by the kernel criteria
        (the whole :math:`N \times N` matrix is kept: :math:`N^2` entries of memory).
    :return: a ``LongTensor`` permutation of ``range(N)`` on ``x.device``. Ties are broken by the
        smallest index.
    """
    x = _check_x(x)
    num = x.shape[0]
    if callable(criterion) and not isinstance(criterion, str):
        scores = criterion(x)
        if not isinstance(scores, Tensor):
            scores = torch.as_tensor(scores)
        if scores.shape != (num,):
            raise ValueError(f"criterion (a key function) must return scores of shape ({num},), got {tuple(scores.shape)}")
        if torch.isnan(scores).any():
            raise ValueError("criterion (a key function) returned NaN scores")
        return torch.argsort(scores, stable=True).to(device=x.device, dtype=torch.long)
    if not isinstance(criterion, str):
        raise TypeError(f"criterion must be one of {ORDERING_CRITERIA} or a callable key, got {type(criterion).__name__}")
    if criterion not in ORDERING_CRITERIA:
        raise ValueError(f"criterion must be one of {ORDERING_CRITERIA} or a callable key, got {criterion!r}")
    if criterion == "random":
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
        device = generator.device if generator is not None else x.device
        return torch.randperm(num, generator=generator, device=device).to(x.device)
    if kernel is None:
        raise ValueError(f"kernel is required for criterion {criterion!r}: pass the model's kernel, e.g. kernel=model.covar_module")
    if not isinstance(kernel, gpytorch.kernels.Kernel):
        raise TypeError(f"kernel must be a gpytorch Kernel, got {type(kernel).__name__}")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    start = _check_start(start, x)
    with torch.no_grad():
        return _greedy_kernel_order(x, kernel, start, criterion == "kernel_max", block_size)
