"""Inducing-variable schedules: the only thing that differs between OHSGPR and its baselines."""

from __future__ import annotations

import gpytorch
import torch
from torch import Tensor

from ..inducing import FourierInducingVariables, HiPPOInducingVariables, InducingPoints, InducingVariables
from ..inducing.selection import select_pivoted_cholesky
from ..online import OnlineSGPR


def _check_count(name: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


class InducingSchedule:
    """Where a method's inducing variables are for each task.

    :meth:`first` builds them for the first task, :meth:`next` returns those of a later task given
    the current ones (the same object moved in place, or a new one). :attr:`num_iter` is the
    number of Adam steps a later task spends on the online bound (``0``: closed form only).
    """

    num_iter: int = 0

    def first(
        self, x: Tensor, t_end: float, kernel: gpytorch.kernels.Kernel, generator: torch.Generator | None = None
    ) -> InducingVariables:
        """The inducing variables of the first task.

        :param x: the first task's inputs ``(N, d)``.
        :param t_end: the first task's last time (where time-indexed variables are placed).
        :param kernel: the model's kernel (used by schedules that choose points by it).
        :param generator: random generator for schedules that draw at random; ``None`` (default): the global one.
        """
        raise NotImplementedError

    def next(
        self, current: InducingVariables, x: Tensor, t_end: float, kernel: gpytorch.kernels.Kernel, generator: torch.Generator | None = None
    ) -> InducingVariables:
        """The inducing variables of a later task, given the current ones (moved in place or new).

        :param current: the inducing variables of the previous task.
        :param x: the new task's inputs ``(N, d)``.
        :param t_end: the new task's last time.
        :param kernel: the model's kernel (used by schedules that choose points by it).
        :param generator: random generator for schedules that draw at random; ``None`` (default): the global one.
        """
        raise NotImplementedError


class _PointsSchedule(InducingSchedule):
    """Point schedules: choose ``M`` of the candidates (old points ∪ new inputs); optionally train them."""

    def __init__(self, num_inducing: int, num_iter: int = 0):
        self.num_inducing = _check_count("num_inducing", num_inducing)
        if not isinstance(num_iter, int) or isinstance(num_iter, bool) or num_iter < 0:
            raise ValueError(f"num_iter must be a non-negative int, got {num_iter!r}")
        self.num_iter = num_iter

    def _choose(self, candidates: Tensor, num: int, kernel, generator) -> Tensor:
        raise NotImplementedError

    def _points(self, candidates: Tensor, kernel, generator) -> InducingPoints:
        """At most ``min(M, number of candidates)`` points: a first task smaller than ``M`` gets all its
        inputs, and the set grows to ``M`` over the next tasks (pivoted Cholesky stops earlier once the
        chosen points explain the kernel on every candidate)."""
        num = min(self.num_inducing, candidates.shape[0])
        return InducingPoints(self._choose(candidates, num, kernel, generator), learn=self.num_iter > 0)

    def first(self, x, t_end, kernel, generator=None):
        """At most ``M`` points chosen among the first task's inputs.

        :param x: the first task's inputs ``(N, d)``, the candidates.
        :param t_end: the first task's last time (unused by point schedules).
        :param kernel: the model's kernel (pivoted Cholesky chooses by it; random points ignore it).
        :param generator: random generator of the random draw; ``None`` (default): the global one.
        """
        return self._points(x, kernel, generator)

    def next(self, current, x, t_end, kernel, generator=None):
        """At most ``M`` new points chosen among the current points and the new inputs.

        :param current: the current :class:`~gpytorch_hippo.inducing.InducingPoints` (``(M, d)`` points).
        :param x: the new task's inputs ``(N, d)``; the candidates are ``current`` points followed by them.
        :param t_end: the new task's last time (unused by point schedules).
        :param kernel: the model's kernel (pivoted Cholesky chooses by it; random points ignore it).
        :param generator: random generator of the random draw; ``None`` (default): the global one.
        """
        if not isinstance(current, InducingPoints):
            raise TypeError(f"{type(self).__name__} moves InducingPoints, got {type(current).__name__}")
        candidates = torch.cat([current.points.detach(), x.to(current.points.dtype)], dim=-2)
        return self._points(candidates, kernel, generator)


class RandomPointsSchedule(_PointsSchedule):
    """OSGPR / OSVGP (Bui et al. 2017; thesis §4.6): ``M`` points drawn without replacement from the
    old points ∪ the new inputs; ``num_iter > 0`` then optimises them on the online bound (the thesis
    uses ~1000 Adam steps), ``num_iter = 0`` keeps them fixed (``osgpr-fixed``).

    :param num_inducing: the number ``M`` of points, a positive int.
    :param num_iter: Adam steps on the online bound per later task, which then trains the points; ``0`` (default):
        fixed points, closed-form update only.
    """

    def _choose(self, candidates, num, kernel, generator):
        where = generator.device if generator is not None else None  # a CUDA generator draws on CUDA
        pick = torch.randperm(candidates.shape[0], generator=generator, device=where)[:num]
        return candidates[pick]


class PivotedCholeskySchedule(_PointsSchedule):
    """OVC (Maddox et al. 2021; thesis §4.6): at most ``M`` greedy pivots of ``k(C, C)`` over the candidates
    ``C`` = old points ∪ new inputs (:func:`~gpytorch_hippo.inducing.select_pivoted_cholesky`, which stops
    when the residual variance is exhausted), fixed
    (OVC, as Chang et al. 2023) or optimised for ``num_iter`` steps (OVC-optZ).

    :param num_inducing: the most points ``M``, a positive int.
    :param num_iter: Adam steps on the online bound per later task, which then trains the points; ``0`` (default):
        fixed points, closed-form update only.
    """

    def _choose(self, candidates, num, kernel, generator):
        return select_pivoted_cholesky(kernel, candidates, num)


class HiPPOSchedule(InducingSchedule):
    """OHSGPR: ``HiPPOInducingVariables(M, measure, t=t_end, **options)`` advanced to each task's end.

    :param num_inducing: the number ``M`` of HiPPO inducing variables, a positive int.
    :param measure: the HiPPO measure (one of :data:`~gpytorch_hippo.hippo.MEASURES`); default ``"legs"``.
    :param options: further keyword arguments of :class:`~gpytorch_hippo.inducing.HiPPOInducingVariables`.
    """

    def __init__(self, num_inducing: int, measure: str = "legs", **options):
        self.num_inducing = _check_count("num_inducing", num_inducing)
        self.measure, self.options = measure, options

    def first(self, x, t_end, kernel, generator=None):
        """New HiPPO inducing variables at ``t = t_end``.

        :param x: the first task's inputs (unused).
        :param t_end: the first task's last time, the time of the bases.
        :param kernel: the model's kernel (unused).
        :param generator: unused (the variables are deterministic).
        """
        return HiPPOInducingVariables(self.num_inducing, self.measure, t=t_end, **self.options)

    def next(self, current, x, t_end, kernel, generator=None):
        """``current`` advanced in place to ``t_end``.

        :param current: the HiPPO inducing variables of the previous task.
        :param x: the new task's inputs (unused).
        :param t_end: the new task's last time, later than ``current``'s.
        :param kernel: the model's kernel (unused).
        :param generator: unused.
        """
        current.advance(t_end)
        return current


class FourierSchedule(InducingSchedule):
    """OVFF: :math:`2K + 1` Fourier features on ``[a, b]`` covering all tasks (the thesis uses the first
    and last time of the whole series), unchanged between tasks; needs a Matérn kernel.

    :param num_frequencies: the number of frequencies :math:`K` (a non-negative int): :math:`M = 2K + 1` features.
    :param a: left end of the interval, at most the first time of the whole stream (training and test).
    :param b: right end, ``b > a``, at least its last time.
    """

    def __init__(self, num_frequencies: int, a: float, b: float):
        self.variables_args = (num_frequencies, a, b)
        FourierInducingVariables(*self.variables_args)  # validate now

    def first(self, x, t_end, kernel, generator=None):
        """New Fourier features on ``[a, b]``.

        :param x: the first task's inputs (unused).
        :param t_end: the first task's last time (unused).
        :param kernel: the model's kernel (unused).
        :param generator: unused.
        """
        return FourierInducingVariables(*self.variables_args)

    def next(self, current, x, t_end, kernel, generator=None):
        """``current`` unchanged.

        :param current: the Fourier features of the previous task.
        :param x: the new task's inputs (unused).
        :param t_end: the new task's last time (unused).
        :param kernel: the model's kernel (unused).
        :param generator: unused.
        """
        return current


def learn_task(
    model: OnlineSGPR,
    schedule: InducingSchedule,
    x: Tensor,
    y: Tensor,
    t_end: float,
    generator: torch.Generator | None = None,
    num_iter: int | None = None,
    lr: float = 0.01,
    progress: bool = False,
) -> Tensor | None:
    """Absorb one later task: move the inducing variables by ``schedule``, then ``model.update``.

    ``num_iter`` defaults to ``schedule.num_iter``; which parameters Adam moves is decided by their
    ``requires_grad`` (trainable inducing points, and the kernel and likelihood unless frozen).
    Returns the task's online bound (``None`` for an empty task, which :meth:`OnlineSGPR.update` leaves out).

    :param model: the :class:`~gpytorch_hippo.online.OnlineSGPR`, which has absorbed the earlier tasks.
    :param schedule: the schedule that moves its inducing variables.
    :param x: the task's inputs ``(N, d)``, or ``(N,)`` for time inputs.
    :param y: the task's observations ``(N,)``.
    :param t_end: the task's last time (where HiPPO variables are advanced to).
    :param generator: random generator passed to ``schedule.next``; ``None`` (default): the global one.
    :param num_iter: Adam steps on the online bound; ``None`` (default): ``schedule.num_iter``.
    :param lr: Adam learning rate (default 0.01).
    :param progress: show a progress bar over the steps (default ``False``).
    """
    if not isinstance(model, OnlineSGPR):
        raise TypeError(f"model must be an OnlineSGPR, got {type(model).__name__}")
    if x.dim() == 1:
        x = x.unsqueeze(-1)
    current = model.inducing_variables
    moved = schedule.next(current, x, t_end, model.covar_module, generator)
    if moved is not current:
        model.inducing_variables = moved.to(dtype=x.dtype, device=x.device)
    num_iter = schedule.num_iter if num_iter is None else num_iter
    return model.update(x, y, num_iter=num_iter, lr=lr, progress=progress)
