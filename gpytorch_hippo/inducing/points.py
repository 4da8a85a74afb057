"""Ordinary inducing points :math:`u = f(Z)` (the SVGP/SGPR inducing variables, thesis §2.3.2)."""

from __future__ import annotations

import gpytorch
import torch
from linear_operator.operators import LinearOperator
from torch import Tensor

from probseq._validation import check_tensor

from .._validation import floating_dtype
from .base import InducingVariables


class InducingPoints(InducingVariables):
    r"""Point inducing variables :math:`u_m = f(z_m)`.

    :math:`K_{uu} = k(Z, Z) + \mathrm{jitter}\, I` and :math:`K_{uf} = k(Z, X)`; with these,
    :class:`~gpytorch_hippo.variational.InterdomainVariationalStrategy` is GPyTorch's
    ``VariationalStrategy`` (thesis eq. (2.36)) and
    :class:`~gpytorch_hippo.online.OnlineSGPR` is OSGPR of Bui et al. (2017).

    :param points: inducing inputs :math:`Z` of shape ``(*batch, M, D)`` (or ``(M,)`` for 1-D inputs).
    :param learn: register :math:`Z` as a trainable parameter (``True``) or a fixed buffer.
    :param jitter: diagonal jitter of :meth:`Kuu` (``None``: GPyTorch's variational jitter).

    The jitter is treated as white noise of variance ``jitter`` added to :math:`f` at the inducing
    inputs only: :math:`K_{uu} = k(Z, Z) + \mathrm{jitter}\, I`, :math:`K_{uf} = k(Z, X)`, and between two point sets with
    the same jitter ``Kuu_cross`` :math:`= k(Z, Z') + \mathrm{jitter}\, [z_i = z'_j]`. This is a valid joint
    covariance, so an online update whose old and new points (partly) coincide loses nothing to
    the jitter: OSGPR with fixed points reproduces batch SGPR (with the same jittered :math:`K_{ZZ}`)
    to round-off.
    """

    def __init__(self, points: Tensor, learn: bool = True, jitter: float | None = None):
        super().__init__(jitter=jitter)
        points = check_tensor(points, "points")  # integers: torch's default floating dtype, as GPyTorch's modules
        if points.dim() == 1:
            points = points.unsqueeze(-1)
        if points.dim() < 2 or points.shape[-2] < 1 or points.shape[-1] < 1:
            raise ValueError(f"points must have shape (*batch, M, D) with M >= 1, got {tuple(points.shape)}")
        points = points.detach().clone()
        if learn:
            self.register_parameter("points", torch.nn.Parameter(points))
        else:
            self.register_buffer("points", points)

    @property
    def num_inducing(self) -> int:
        return self.points.shape[-2]

    def _check_inputs(self, x: Tensor, name: str, kernel=None) -> Tensor:
        """``x`` finite and in the dtype shared with the points and ``kernel`` (``torch.promote_types``)."""
        x = check_tensor(x, name, dtype=torch.promote_types(self.points.dtype, floating_dtype(kernel, self.points.dtype)))
        if x.dim() < 2 or x.shape[-1] != self.points.shape[-1]:
            raise ValueError(
                f"{name} must have shape (*batch, N, {self.points.shape[-1]}) to match the inducing points, got {tuple(x.shape)}"
            )
        return x

    def _checked_points(self, dtype: torch.dtype | None = None) -> Tensor:
        """The points, finite (they are trained), in ``dtype`` (differentiably)."""
        points = check_tensor(self.points, "points")
        return points if dtype is None or points.dtype == dtype else points.to(dtype)

    def Kuu(self, kernel: gpytorch.kernels.Kernel) -> LinearOperator:
        r""":math:`k(Z, Z) + \mathrm{jitter}\, I` (see :class:`InducingVariables` for the jitter policy).

        :param kernel: the GP's kernel :math:`k`; the points are cast to the dtype shared with it.
        """
        dtype = torch.promote_types(self.points.dtype, floating_dtype(kernel, self.points.dtype))
        return self.add_jitter(kernel(self._checked_points(dtype)))

    def Kuf(self, kernel: gpytorch.kernels.Kernel, x: Tensor) -> Tensor:
        """:math:`k(Z, x)` of shape ``(*batch, M, N)``.

        :param kernel: the GP's kernel :math:`k`.
        :param x: inputs ``(*batch, N, D)``, ``D`` that of the points; finite (batch dimensions broadcast with the points').
        """
        x = self._check_inputs(x, "x", kernel)
        points = self._checked_points(x.dtype)
        batch_shape = torch.broadcast_shapes(points.shape[:-2], x.shape[:-2])
        points = points.expand(*batch_shape, *points.shape[-2:])
        x = x.expand(*batch_shape, *x.shape[-2:])
        return kernel(points, x).to_dense()

    def prior_mean(self, mean_module: gpytorch.means.Mean | None) -> Tensor | None:
        """:math:`m(Z)`, so that :math:`u = f(Z)` including the mean (GPyTorch's convention); ``None`` without a mean.

        :param mean_module: the GP's prior mean function :math:`m`; ``None`` or a ``ZeroMean``: zero (returns ``None``).
        """
        if mean_module is None or isinstance(mean_module, gpytorch.means.ZeroMean):
            return None
        return mean_module(self.points)

    def _shares_jitter_with(self, other: InducingVariables) -> Tensor:
        """Points that coincide with a point of ``other`` of the same jitter share its noise."""
        if not isinstance(other, InducingPoints) or other.jitter_value(self.points.dtype) != self.jitter_value(self.points.dtype):
            return torch.tensor(False)
        return (self.points.unsqueeze(-2) == other.points.unsqueeze(-3)).all(-1).any(-1)

    def _cross_covariance(self, other: InducingVariables, kernel: gpytorch.kernels.Kernel):
        if isinstance(other, InducingPoints):
            covariance = self.Kuf(kernel, other.points)
            jitter = self.jitter_value(covariance.dtype)
            if jitter > 0 and other.jitter_value(covariance.dtype) == jitter:
                # The jitter is white noise added to f for the inducing variables, so two sets share
                # it exactly where their points coincide: Kuu_cross(self, self) == Kuu(self), which
                # keeps online updates with unchanged points exact (see the class docstring).
                coincide = (self.points.unsqueeze(-2) == other.points.unsqueeze(-3)).all(-1)
                covariance = covariance + jitter * coincide.to(covariance.dtype)
            return covariance
        # cov(f(Z), u') = cov(u', f(Z))^T: let ``other`` compute it from its Kuf.
        return other.Kuf(kernel, self.points).mT
