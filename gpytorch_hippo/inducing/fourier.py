r"""Variational Fourier features (VFF, Hensman, Durrande & Solin 2018): the OVFF baseline (thesis §4.6).

The inducing variables are RKHS inner products :math:`u_m = \langle \phi_m, f \rangle_H` of a Matérn GP restricted to a
fixed interval :math:`[a, b]` with the Fourier basis :math:`\phi = (1, \cos \omega_1 (x-a), \dots, \cos \omega_K (x-a),
\sin \omega_1 (x-a), \dots, \sin \omega_K (x-a))`, :math:`\omega_k = 2\pi k / (b - a)`. By the reproducing property

* :math:`K_{uf}(x) = \phi(x)` for :math:`x` in :math:`[a, b]` (independent of the hyperparameters), and
* :math:`K_{uu} = \langle \phi_i, \phi_j \rangle_H`, which for Matérn-:math:`\nu` (:math:`\lambda = \sqrt{2\nu}/\ell`,
  variance :math:`\sigma^2`, :math:`p = \nu + \frac{1}{2}`) and the RKHS norm of Durrande et al. (2016),
  :math:`\langle f, g \rangle_H = c_p \int_a^b [(\lambda + D)^p f][(\lambda + D)^p g]\, \mathrm{d}x + \text{boundary terms at } a`,
  is a diagonal :math:`c_p (b - a)/2\, (\lambda^2 + \omega^2)^p` (doubled at :math:`\omega = 0`) plus the low-rank boundary
  terms: the Fourier functions are orthogonal in :math:`L^2[a, b]` and :math:`(\lambda + D)^p` only changes each
  one's amplitude and phase.

``Kuu`` is returned as ``LowRankRootAddedDiagLinearOperator`` (diagonal plus rank 1, 2 or 3).
"""

from __future__ import annotations

import math

import gpytorch
import torch
from linear_operator.operators import DiagLinearOperator, LinearOperator, LowRankRootAddedDiagLinearOperator, LowRankRootLinearOperator
from torch import Tensor

from probseq._validation import check_tensor

from .._validation import floating_dtype
from .base import InducingVariables
from .covariances import resolve_kernel

#: Matérn ν -> (p, c_p): the integral of the RKHS inner product is ``c_p / σ² ∫ (λ + D)^p f (λ + D)^p g``
_MATERN_INTEGRAL = {0.5: (1, lambda lam: 1 / (2 * lam)), 1.5: (2, lambda lam: 1 / (4 * lam**3)), 2.5: (3, lambda lam: 3 / (16 * lam**5))}


def matern_parameters(kernel: gpytorch.kernels.Kernel) -> tuple[float, Tensor, Tensor]:
    r""":math:`(\nu, \lambda, \sigma^2)` of ``MaternKernel`` or ``ScaleKernel(MaternKernel)`` (any kernel registered with a Matérn
    :math:`\nu`, :mod:`.covariances`); :math:`\lambda = \sqrt{2\nu}/\ell`; batched kernels give batched values.

    :param kernel: a Matérn kernel with :math:`\nu \in \{1/2, 3/2, 5/2\}` on 1-D inputs, optionally in a scale wrapper.
    """
    spec, base, scale = resolve_kernel(kernel)
    if spec is None or spec.nu not in _MATERN_INTEGRAL:
        raise TypeError(
            "FourierInducingVariables needs a MaternKernel (nu = 0.5, 1.5 or 2.5), optionally inside a ScaleKernel, "
            f"got {type(kernel).__name__}"
        )
    if base.ard_num_dims not in (None, 1):
        raise ValueError(f"FourierInducingVariables are for 1-D inputs; the kernel has ard_num_dims={base.ard_num_dims}")
    lengthscale = base.lengthscale[..., 0, 0]
    outputscale = torch.ones_like(lengthscale) if scale is None else scale(kernel)
    return spec.nu, math.sqrt(2 * spec.nu) / lengthscale, outputscale


class FourierInducingVariables(InducingVariables):
    r""":math:`M = 2K + 1` variational Fourier features on :math:`[a, b]` for a Matérn-½, 3/2 or 5/2 kernel.

    :param num_frequencies: ``K``; frequencies :math:`\omega_k = 2\pi k/(b - a)`, :math:`k = 0, \dots, K`.
    :param a: left end of the interval (must cover every input seen, training and test).
    :param b: right end, :math:`b > a`.
    :param jitter: diagonal jitter of :meth:`Kuu` (``None``: GPyTorch's variational jitter; ``Kuu``
        is at least its diagonal :math:`\ge c_p (b - a) \lambda^{2p}`, so the jitter hardly matters).

    :meth:`Kuf` raises for inputs outside :math:`[a, b]` (the covariance there is not a Fourier
    function; the thesis chooses :math:`[a, b]` to cover all tasks). The features are the same
    functions for any hyperparameters, so two instances on the same interval with the same ``K``
    are the same variables (``Kuu_cross = Kuu``) and OVFF needs no move between tasks.
    """

    def __init__(self, num_frequencies: int, a: float, b: float, jitter: float | None = None):
        super().__init__(jitter=jitter)
        if not isinstance(num_frequencies, int) or isinstance(num_frequencies, bool) or num_frequencies < 0:
            raise ValueError(f"num_frequencies must be a non-negative int, got {num_frequencies!r}")
        a, b = float(a), float(b)
        if not (math.isfinite(a) and math.isfinite(b) and b > a):
            raise ValueError(f"the interval must satisfy a < b (both finite), got a={a!r}, b={b!r}")
        self.num_frequencies, self.a, self.b = num_frequencies, a, b

    @property
    def num_inducing(self) -> int:
        return 2 * self.num_frequencies + 1

    def extra_repr(self) -> str:
        return f"num_frequencies={self.num_frequencies}, a={self.a:g}, b={self.b:g}"

    def frequencies(self, dtype: torch.dtype = torch.float64, device=None) -> Tensor:
        r"""The frequencies :math:`\omega_0 = 0, \omega_1, \dots, \omega_K`, :math:`\omega_k = 2\pi k/(b - a)`: ``(K + 1,)``.

        :param dtype: the dtype of the result; default ``torch.float64``.
        :param device: the device of the result (default: the CPU).
        """
        return 2 * math.pi * torch.arange(self.num_frequencies + 1, dtype=dtype, device=device) / (self.b - self.a)

    def Kuf(self, kernel: gpytorch.kernels.Kernel, x: Tensor) -> Tensor:
        r""":math:`\phi(x)`, shape ``(*batch, M, N)``; ``kernel`` is checked but not needed (reproducing property).

        :param kernel: the GP's Matérn kernel (:func:`matern_parameters`); only checked.
        :param x: inputs ``(*batch, N, 1)`` within ``[a, b]`` (others raise ``ValueError``).
        """
        matern_parameters(kernel)
        x = check_tensor(x, "x", dtype=floating_dtype(kernel))  # finite; integers in the kernel's dtype
        if x.dim() < 2 or x.shape[-1] != 1:
            raise ValueError(f"x must have shape (*batch, N, 1), got {tuple(x.shape)}")
        if (x < self.a).any() or (x > self.b).any():
            raise ValueError(f"x must lie in the interval [a, b] = [{self.a:g}, {self.b:g}] of the Fourier features")
        omega = self.frequencies(x.dtype, x.device)
        phase = (x[..., 0] - self.a).unsqueeze(-2) * omega.unsqueeze(-1)  # (*batch, K+1, N)
        return torch.cat([torch.cos(phase), torch.sin(phase[..., 1:, :])], dim=-2)

    def Kuu(self, kernel: gpytorch.kernels.Kernel) -> LinearOperator:
        r""":math:`\langle \phi_i, \phi_j \rangle_{\mathcal H}`: diagonal plus the low-rank boundary terms (module docstring), plus jitter.

        :param kernel: the GP's Matérn kernel (:func:`matern_parameters`); a batched kernel gives a batch of matrices.
        """
        nu, lam, variance = matern_parameters(kernel)
        power, coefficient = _MATERN_INTEGRAL[nu]
        lam, variance = lam[..., None], variance[..., None]
        omega = self.frequencies(lam.dtype, lam.device)
        length = self.b - self.a
        spectrum = coefficient(lam) * length / 2 * (lam.square() + omega.square()) ** power / variance
        cos_diag = torch.cat([2 * spectrum[..., :1], spectrum[..., 1:]], dim=-1)
        diag = torch.cat([cos_diag, spectrum[..., 1:]], dim=-1)
        root = self._boundary_root(nu, lam, omega, variance)
        operator = LowRankRootAddedDiagLinearOperator(LowRankRootLinearOperator(root), DiagLinearOperator(diag))
        return self.add_jitter(operator)

    def _boundary_root(self, nu: float, lam: Tensor, omega: Tensor, variance: Tensor) -> Tensor:
        """``R`` with ``R Rᵀ`` = the boundary terms of ``<φ_i, φ_j>_H`` at ``a`` (Durrande et al. 2016):

        * ν=½: ``f(a)g(a)/σ²``; ν=3/2: ``[f(a)g(a) + f'(a)g'(a)/λ²]/σ²``;
        * ν=5/2: ``[9/8 f g + 9/(8λ⁴) f''g'' + 3/λ² (f'g' + f''g/8 + f g''/8)](a)/σ²``.

        At ``a`` the cosines have ``f = 1, f' = 0, f'' = -ω²`` and the sines ``f = 0, f' = ω, f'' = 0``.
        """
        scale = variance.rsqrt()
        cos_ones = torch.ones_like(omega).expand(*lam.shape[:-1], -1)
        zeros_cos = torch.zeros_like(cos_ones)
        sin_omega = omega[1:].expand(*lam.shape[:-1], -1)
        zeros_sin = torch.zeros_like(sin_omega)
        columns = [torch.cat([cos_ones, zeros_sin], -1) * scale]
        if nu == 1.5:
            columns.append(torch.cat([zeros_cos, sin_omega / lam], -1) * scale)
        elif nu == 2.5:
            # cos block: v_i = (1, -ω_i²) with the 2x2 form B = [[9/8, 3/(8λ²)], [3/(8λ²), 9/(8λ⁴)]]
            b11 = torch.full_like(lam, 9 / 8)
            b12 = 3 / (8 * lam.square())
            b22 = 9 / (8 * lam**4)
            l11 = b11.sqrt()
            l21 = b12 / l11
            l22 = (b22 - l21.square()).sqrt()
            cos_first = l11 * cos_ones - l21 * omega.square()
            cos_second = -l22 * omega.square()
            columns = [
                torch.cat([cos_first, zeros_sin], -1) * scale,
                torch.cat([cos_second.expand_as(cos_ones), zeros_sin], -1) * scale,
                torch.cat([zeros_cos, math.sqrt(3) * sin_omega / lam], -1) * scale,
            ]
        return torch.stack(columns, dim=-1)

    def _same_variables(self, other: InducingVariables) -> bool:
        return isinstance(other, FourierInducingVariables) and (other.num_frequencies, other.a, other.b) == (
            self.num_frequencies,
            self.a,
            self.b,
        )

    def input_support(self) -> tuple[float, float] | None:
        return float(self.a), float(self.b)

    def coverage_advice(self, cause: str) -> str:
        """What to change for inputs outside ``[a, b]``, or for too few frequencies
        (:meth:`~gpytorch_hippo.inducing.base.InducingVariables.coverage_advice`).

        :param cause: ``"before"``, ``"beyond"`` (inputs outside ``[a, b]``) or ``"too few"``.
        """
        if cause in ("before", "beyond"):
            return "the Fourier features live on [a, b]: choose an interval that contains every input of the stream"
        return "use more frequencies (num_frequencies) or a longer length scale"

    def _shares_jitter_with(self, other: InducingVariables) -> Tensor:
        """All of the jitter is shared with the same features (``Kuu_cross`` is ``Kuu``), none otherwise."""
        return torch.tensor(self._same_variables(other))

    def _cross_covariance(self, other: InducingVariables, kernel: gpytorch.kernels.Kernel):
        if self._same_variables(other):
            return self.Kuu(kernel).to_dense()
        if isinstance(other, FourierInducingVariables):
            raise ValueError(
                "Fourier features on different intervals or with different numbers of frequencies are features of "
                "different RKHSs; keep one FourierInducingVariables for the whole stream"
            )
        return super()._cross_covariance(other, kernel)
