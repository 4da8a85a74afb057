r"""The captured-variance monitor of :class:`~gpytorch_hippo.online.OnlineSGPR`: whether the inducing variables can
hold the stream, checked after each update and paced by counts, so that the same data give the same
warnings and values on every machine.

The fraction of the prior variance that the inducing variables capture at an input :math:`x` is
:math:`c(x) = k_{xu} K_{uu}^{-1} k_{ux} / k(x, x) = \lVert L^{-1} k_{ux} \rVert^2 / k(x, x)`
(:meth:`~gpytorch_hippo.inducing.base.InducingVariables.captured_variance`). Two checks, both reusing the update's
:math:`L = \operatorname{chol}(K_{uu})`:

* **at the task's inputs**, every task, from the update's own :math:`W = L^{-1} K_{uX}` (no new covariance):
  inputs beyond the variables' reach (points fixed over ``[0, 10]``, data at ``t > 10``) capture nothing, and the
  posterior there stays the prior;
* **over the inputs seen so far** (1-D inputs: a ``grid_size``-point grid over their range within the variables'
  reach; batched HiPPO streams: over each stream's support), which sees a lost past (LegS keeps the ends of a stream best
  and its middle worst). One :math:`K_{uf}` of ``grid_size`` points and a triangular solve: about the work of an
  update of ``grid_size`` points, but more for points far in a long stream's past (the Lyapunov backend's update
  costs the same at every task, its :math:`K_{uf}` at old inputs grows with the span in length scales). It runs on
  the first task and then whenever the work absorbed since its last run, counted as :math:`\sum (N + M)` over the
  tasks (``N`` points per stream, ``M`` inducing variables), reaches both ``grid_size / cost_fraction`` and
  ``spacing`` times the work absorbed before that run: successive runs are at least a doubling of the stream apart
  (a number of runs logarithmic in its length), so that the check's share of the time stays small even where its
  cost grows with the stream (measured ≤ 5 % of the updates': ``benchmarks/captured_variance_cost.py``).

The monitor warns (:class:`~gpytorch_hippo.inducing.base.CapturedVarianceWarning`) when the lower of the two falls below
``threshold``, and again whenever it falls below half the level of its last warning. Its state is plain Python
(copied by ``deepcopy`` and pickling, not in the model's ``state_dict``: a reloaded model checks on its next task).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor

from .inducing.base import CapturedVarianceWarning
from .variational import solve_lower

__all__ = ["CHECK_COST_FRACTION", "CapturedVarianceMonitor"]

#: the default share of the updates' work that the captured-variance check over the inputs seen so far may take
CHECK_COST_FRACTION = 0.05


class CapturedVarianceMonitor:
    """Checks after each update how much of the prior variance the inducing variables capture (module docstring).

    :param threshold: warn below this captured fraction, in ``[0, 1]``; default 0.9.
    :param grid_size: points of the check over the inputs seen so far, a positive int; default 32.
    :param cost_fraction: the check over the inputs seen so far runs when the work since its last run, counted
        as ``sum(N + M)`` over the tasks, reaches ``grid_size / cost_fraction`` (and ``spacing`` times the work before);
        in ``(0, 1]``; default :data:`~gpytorch_hippo.monitor.CHECK_COST_FRACTION` (5 %).
    :param spacing: ... and ``spacing`` times the work absorbed before that run, a number ``>= 0``; default 1 (runs at
        least a doubling of the stream apart); ``0`` with ``cost_fraction=1`` checks every task of at least
        ``grid_size - M`` points.
    """

    def __init__(self, threshold: float = 0.9, grid_size: int = 32, cost_fraction: float = CHECK_COST_FRACTION, spacing: float = 1.0):
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold <= 1:
            raise ValueError(f"captured_variance_warning (the monitor's threshold) must be in [0, 1] or None, got {threshold!r}")
        if isinstance(grid_size, bool) or not isinstance(grid_size, int) or grid_size < 1:
            raise ValueError(f"grid_size must be a positive int, got {grid_size!r}")
        if isinstance(cost_fraction, bool) or not isinstance(cost_fraction, (int, float)) or not 0 < cost_fraction <= 1:
            raise ValueError(f"cost_fraction must be in (0, 1], got {cost_fraction!r}")
        if isinstance(spacing, bool) or not isinstance(spacing, (int, float)) or spacing < 0:
            raise ValueError(f"spacing must be a number >= 0, got {spacing!r}")
        self.threshold, self.grid_size, self.cost_fraction = float(threshold), grid_size, float(cost_fraction)
        self.spacing = float(spacing)
        #: the captured fraction below which the next warning is issued (the threshold, halved at each warning)
        self.level = self.threshold
        #: ``sum(N + M)`` over the tasks since the last check over the inputs seen so far (``None``: none yet)
        self.work_since_check: int | None = None
        #: ``sum(N + M)`` over all tasks seen
        self.work_total = 0
        #: the captured fraction over the inputs seen so far at its latest check (``None`` before one)
        self.last_seen: float | None = None
        #: the captured fraction at the latest task's inputs (the lowest stream's; ``None`` before a task)
        self.last_at_inputs: float | None = None

    @property
    def last_captured_variance(self) -> float | None:
        """The lower of :attr:`last_seen` and :attr:`last_at_inputs` (``None`` before a task)."""
        values = [v for v in (self.last_seen, self.last_at_inputs) if v is not None]
        return min(values) if values else None

    def _seen_range(self, model: Any, train_x: Tensor) -> None:
        """Grow ``model.seen_input_range`` (1-D inputs; not for batched streams with supports of their own) by the task's inputs."""
        if train_x.shape[-1] != 1 or getattr(model.inducing_variables, "stream_supports", lambda: None)() is not None:
            return
        low, high = torch.aminmax(train_x.detach())
        seen = model.seen_input_range
        if seen is not None:
            low, high = torch.minimum(low, seen[0].to(low)), torch.maximum(high, seen[1].to(high))
        model.seen_input_range = torch.stack([low, high])

    def _seen_grid(self, model: Any, train_x: Tensor) -> Tensor:
        """The grid over the inputs seen so far within the variables' reach (none for inputs of more than one dimension:
        there the check at the task's inputs is the check)."""
        ivs, size = model.inducing_variables, self.grid_size
        supports = getattr(ivs, "stream_supports", lambda: None)()
        if supports is not None:  # batched streams with their own supports: a grid over each stream's
            unit = torch.linspace(0, 1, size, dtype=torch.float64)
            return (supports[:, :1] + (supports[:, 1:] - supports[:, :1]) * unit).unsqueeze(-1).to(train_x)
        if train_x.shape[-1] != 1:
            return train_x[..., :0, :]
        low, high = (float(v) for v in model.seen_input_range)
        support = ivs.input_support()
        if support is not None:
            low, high = max(low, support[0]), min(high, support[1])
        return torch.linspace(low, high, size if low <= high else 0, dtype=train_x.dtype, device=train_x.device).unsqueeze(-1)

    @torch.no_grad()
    def observe(self, model: Any, train_x: Tensor, chol: Tensor, at_inputs: Tensor, mask: Tensor | None = None) -> None:
        r"""Check after an update; warn as the module docstring says.

        :param model: the :class:`~gpytorch_hippo.online.OnlineSGPR` just updated (its ``seen_input_range`` grows here).
        :param train_x: the task's inputs ``(..., N, D)`` (padded for ragged batched streams).
        :param chol: the update's :math:`L = \operatorname{chol}(K_{uu})` in the working dtype (float64).
        :param at_inputs: the captured fraction :math:`c(x_i)` at the task's inputs ``(..., N)``, from the update's ``W``.
        :param mask: ``False`` at padding ``(..., N)``; ``None``: every point observed.
        """
        ivs, kernel = model.inducing_variables, model.covar_module
        if mask is None:
            present, per_point = None, at_inputs
            captured = at_inputs.mean(-1)
        else:  # streams without points count as fully captured; padding is left out
            present, per_point = mask.any(-1), torch.where(mask, at_inputs, torch.inf)
            captured = torch.where(mask, at_inputs, 0).sum(-1) / mask.sum(-1).clamp(min=1)
            captured = torch.where(present, captured, 1.0)
        self.last_at_inputs = float(captured.min())
        worst = ("this task's inputs", train_x, per_point, captured, self.last_at_inputs)
        self._seen_range(model, train_x)
        task_work = int(train_x.shape[-2]) + int(ivs.num_inducing)
        work = (0 if self.work_since_check is None else self.work_since_check) + task_work
        self.work_total += task_work
        due = self.work_since_check is None or (
            work * self.cost_fraction >= self.grid_size and work >= self.spacing * (self.work_total - work)
        )
        grid = self._seen_grid(model, train_x) if due else None
        if grid is not None and grid.shape[-2] > 0:
            W = solve_lower(chol, ivs.Kuf(kernel, grid).to(chol.dtype))
            grid_per_point = W.square().sum(-2) / kernel(grid, diag=True).to(chol.dtype)
            grid_captured = grid_per_point.mean(-1)
            self.last_seen, work = float(grid_captured.min()), 0
            if self.last_seen < worst[-1]:
                worst = ("the inputs seen so far within their reach", grid, grid_per_point, grid_captured, self.last_seen)
        self.work_since_check = work
        where, points, per_point, captured, value = worst
        if value >= self.level:
            return
        worst_text = f"{float(per_point.min()):.1%} at worst"
        if captured.dim() == 1:  # batched streams: name the worst one
            worst_text += f", stream {int(captured.argmin())}"
        elif points.shape[-1] == 1:
            worst_text += f", at x = {points[per_point.reshape(-1, points.shape[-2]).min(0).values.argmin(), 0].item():.4g}"
        self.level = value / 2
        warnings.warn(
            f"the {ivs.num_inducing} inducing variables keep only {value:.1%} of the prior variance over {where} "
            f"({worst_text}; InducingVariables.captured_variance; threshold {self.threshold:.0%}): expect underfitting and lost "
            f"memory there; {ivs.coverage_advice('too few')} (warned again below {self.level:.1%}; "
            "model.last_captured_variance holds the latest value)",
            CapturedVarianceWarning,
            stacklevel=4,
        )
