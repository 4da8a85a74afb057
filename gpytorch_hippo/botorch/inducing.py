r"""Where the inducing variables of an :class:`~gpytorch_hippo.botorch.OnlineGPModel` are: the default points, moving
HiPPO variables with the stream, and the warning where fixed points capture too little of the prior at new inputs."""

from __future__ import annotations

import warnings

import gpytorch
import torch
from linear_operator.functions import pivoted_cholesky
from torch import Tensor

from ..inducing.base import InducingVariables
from ..inducing.hippo_variables import HiPPOInducingVariables
from ..inducing.points import InducingPoints
from ..online import OnlineSGPR
from ..ordering import order_inputs
from .exceptions import InducingApproximationWarning

__all__ = [
    "DEFAULT_NUM_INDUCING",
    "default_inducing_points",
    "farthest_points",
    "move_inducing",
    "reselect_inducing",
    "select_inducing_points",
    "warn_if_approximate",
]

#: number of default inducing points (:func:`default_inducing_points`)
DEFAULT_NUM_INDUCING = 512


def default_inducing_points(train_x: Tensor, num_inducing: int | None = None) -> InducingPoints:
    """The inducing points of an :class:`~gpytorch_hippo.botorch.OnlineGPModel` built without ``inducing_variables``:
    ``num_inducing`` (default :data:`DEFAULT_NUM_INDUCING`, at most :math:`2^{14}`) fixed points, first the first batch's
    distinct model-space inputs ``train_x`` ``(n, d)`` (with more than ``num_inducing``, a farthest-point subset: the
    order in which pivoted Cholesky picks points for an isotropic stationary kernel), so that a model of up
    to ``num_inducing`` points is the exact GP of its first batch; then a scrambled Sobol sequence (seed 0)
    for later batches, in the unit cube when the inputs lie in it (BoTorch's convention: inputs scaled to
    ``[0, 1]^d``, e.g. by ``Normalize``), otherwise in their bounding box widened by 10 % of its size on
    every side. Later batches should stay in that box; for a time axis that grows,
    :class:`~gpytorch_hippo.inducing.HiPPOInducingVariables` keep the whole stream.

    :param train_x: the first batch's model-space inputs ``(n, d)`` (leading batch dimensions are flattened).
    :param num_inducing: the number of points, an int in ``[1, 2^14]``; ``None`` (default): :data:`DEFAULT_NUM_INDUCING`.
    """
    num = DEFAULT_NUM_INDUCING if num_inducing is None else num_inducing
    if isinstance(num, bool) or not isinstance(num, int) or not 1 <= num <= 2**14:
        raise ValueError(f"num_inducing must be an int in [1, 16384], got {num_inducing!r}")
    x = train_x.detach().reshape(-1, train_x.shape[-1])
    low, high = x.min(-2).values, x.max(-2).values
    if not (bool((low >= 0).all()) and bool((high <= 1).all())):
        margin = 0.1 * (high - low).clamp_min(1e-6 * (1 + high.abs().max()))
        low, high = low - margin, high + margin
    else:
        low, high = torch.zeros_like(low), torch.ones_like(high)
    data = farthest_points(torch.unique(x, dim=0), num)
    if data.shape[0] == num:
        return InducingPoints(data.clone(), learn=False)
    engine = torch.quasirandom.SobolEngine(x.shape[-1], scramble=True, seed=0)
    unit = engine.draw(num - data.shape[0], dtype=torch.float64).to(device=x.device, dtype=x.dtype)
    return InducingPoints(torch.cat([data, low + (high - low) * unit]), learn=False)


def select_inducing_points(kernel: gpytorch.kernels.Kernel, candidates: Tensor, num: int) -> Tensor:
    r"""The ``num`` rows of ``candidates`` that linear_operator's pivoted Cholesky of the kernel matrix
    :math:`K = k(X, X)` picks first (Harbrecht et al., 2012): each the candidate of largest residual variance
    :math:`k(x, x) - Q(x, x)` given those before, so the Nyström error :math:`\operatorname{tr}(K - Q)` of the chosen
    set falls greedily; fewer where the remaining candidates add no variance (:math:`\operatorname{tr}(K - Q) \le
    10^{-10} \max_i K_{ii}`). The kernel matrix is evaluated lazily, a row per pick: :math:`O(n \cdot num^2)`.

    :param kernel: the GPyTorch kernel, at its current hyperparameters.
    :param candidates: candidate points ``(n, d)`` (model space).
    :param num: the most points to choose, a positive int.
    """
    x = candidates.detach().reshape(-1, candidates.shape[-1])
    with torch.no_grad(), gpytorch.settings.lazily_evaluate_kernels(True):
        factor, pivots = pivoted_cholesky(kernel(x), rank=min(num, x.shape[0]), error_tol=1e-10, return_pivots=True)
    return x[pivots[: factor.shape[-1]]]


def reselect_inducing(online: OnlineSGPR, candidates: Tensor, num: int) -> None:
    """Replace the inducing points of ``online`` by :func:`select_inducing_points` of ``candidates`` ``(n, d)`` (model
    space; the old points and a new batch before a streaming update, whose update then moves ``q(u)`` from the old
    points to the new ones, Bui et al. (2017), at :math:`O(M^2 (M + n))`; the kept data before a recomputation).

    :param online: the model's :class:`~gpytorch_hippo.online.OnlineSGPR` with :class:`~gpytorch_hippo.inducing.InducingPoints`.
    :param candidates: the points to choose from.
    :param num: the most inducing points.
    """
    jitter = online.inducing_variables.jitter
    online.inducing_variables = InducingPoints(select_inducing_points(online.covar_module, candidates, num), learn=False, jitter=jitter)


def farthest_points(x: Tensor, num: int) -> Tensor:
    """``num`` rows of ``x`` ``(n, d)`` (all of them if fewer) chosen greedily, each the farthest from those before.

    :param x: candidate points ``(n, d)``; the first row is chosen first.
    :param num: how many to choose.
    """
    if x.shape[0] <= num:
        return x
    chosen = [0]
    distance = (x - x[0]).pow(2).sum(-1)
    for _ in range(num - 1):
        chosen.append(int(distance.argmax()))
        distance = torch.minimum(distance, (x - x[chosen[-1]]).pow(2).sum(-1))
    return x[chosen]


def move_inducing(online: OnlineSGPR, x: Tensor, ordering: str) -> None:
    """Move HiPPO inducing variables forward to cover the model-space inputs ``x`` ``(*b, n, d)`` before an update:
    1-D ones (time inputs) by ``advance(max(x))`` to the largest time of every batch element when ``x`` goes beyond
    their ``t``; multidimensional ones by ``append_path`` of an un-batched ``x`` ordered by ``ordering`` (thesis §4.4),
    a batched ``x`` (BoTorch's fantasies) keeping the path fixed. Other inducing variables stay where they are.

    :param online: the model's :class:`~gpytorch_hippo.online.OnlineSGPR`.
    :param x: the new inputs in the model (input-transformed) space.
    :param ordering: criterion of :func:`~gpytorch_hippo.ordering.order_inputs` for path variables.
    """
    ivs = online.inducing_variables
    if not isinstance(ivs, HiPPOInducingVariables):
        return
    if ivs.input_dim == 1:
        t_new = float(x.detach().max())
        if t_new > ivs.t:
            ivs.advance(t_new)
        return
    if x.dim() != 2:
        return
    start = None if ivs.path_pending.shape[0] == 0 else ivs.path_pending[-1].to(x)
    order = order_inputs(x.detach(), ordering, kernel=online.covar_module, start=start)
    ivs.append_path(x.detach()[order], kernel=online.covar_module)


def warn_if_approximate(online: OnlineSGPR, x: Tensor, noise: Tensor | None) -> None:
    r"""An :class:`~gpytorch_hippo.botorch.InducingApproximationWarning` where inducing points leave more prior variance
    at the new model-space inputs ``x`` than the observation noise: the Nyström residual
    :math:`k(x, x) - K_{xu} K_{uu}^{-1} K_{ux}` (:meth:`~gpytorch_hippo.inducing.InducingVariables.captured_variance`)
    bounds the sparse posterior variance at :math:`x` from below, while the exact GP's at an observed input is below
    the noise variance. (HiPPO variables have the captured-variance monitor of :class:`~gpytorch_hippo.online.OnlineSGPR`.)

    :param online: the model's :class:`~gpytorch_hippo.online.OnlineSGPR`.
    :param x: the new inputs ``(*b, n, d)`` in the model space.
    :param noise: their known noise variances; ``None``: the likelihood's noise.
    """
    variables: InducingVariables = online.inducing_variables
    if not isinstance(variables, InducingPoints):
        return
    x = x.detach().reshape(-1, x.shape[-1])
    kernel = online.covar_module
    captured = variables.captured_variance(kernel, x, reduction="none")
    with torch.no_grad():
        residual = kernel(x, diag=True) * (1 - captured)
        level = online.likelihood.noise.detach().max() if noise is None else noise.detach().max()
    if bool(residual.max() > level):
        warnings.warn(
            "the inducing variables capture too little of the prior at the new inputs: the residual variance "
            "k(x, x) - Q(x, x) exceeds the observation noise there (InducingVariables.captured_variance), so the "
            "posterior variance at them stays above the noise variance where SingleTaskGP's falls below it, and "
            "predictions deviate from the exact GP. Use more inducing points (num_inducing=) or place them where "
            "the inputs are (model.inducing_variables = ...); see the approximation in the BoTorch guide",
            InducingApproximationWarning,
            stacklevel=2,  # one location for every path, so Python's default filter shows it once
        )
