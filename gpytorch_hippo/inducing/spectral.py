r"""Frequency-domain pieces of the HiPPO covariances: spectral densities, Gauss-Legendre rules,
spherical Bessel functions and the closed-form HiPPO transforms of :math:`e^{i\omega s}`.

For a stationary kernel :math:`k(r) = \int S(\omega)\, e^{i\omega r}\, \mathrm{d}\omega` and inducing variables
:math:`u_m = \int f(s)\, \phi_m(s)\, \mathrm{d}s` (thesis §4.3), write
:math:`\hat c_m(\omega) = \int e^{i\omega s} \phi_m(s)\, \mathrm{d}s` -- the HiPPO
projection of a complex exponential.  Then

.. math::

    K_{uu}[m, n] = \int S(\omega)\, \hat c_m(\omega)\, \overline{\hat c'_n(\omega)}\, \mathrm{d}\omega,
    \qquad
    K_{uf}[m](x) = \operatorname{Re} \int S(\omega)\, \hat c_m(\omega)\, e^{-i\omega x}\, \mathrm{d}\omega.

Both integrands are even in :math:`\omega` up to conjugation, so a rule :math:`(\omega_q, w_q)` on :math:`[0, \Omega]` with
weights :math:`2 w_q S(\omega_q)` gives real features :math:`F = \sqrt{2 w S}\, [\operatorname{Re} \hat c; \operatorname{Im} \hat c]`
(``2Q x M``) and :math:`\psi(x) = \sqrt{2 w S}\, [\cos \omega x; \sin \omega x]` with :math:`K_{uu} = F^\top F'` and
:math:`K_{uf} = F^\top \psi(x)` -- the structure of random Fourier features (thesis §4.3.2) with deterministic nodes.
"""

from __future__ import annotations

import functools
import math

import gpytorch
import numpy as np
import torch
from torch import Tensor

from .covariances import RBF_CUTOFF, kernel_parts, rbf_spectral_density_of, supported_kernels

__all__ = [
    "RBF_CUTOFF",
    "SUPPORTED_KERNELS",
    "gauss_legendre",
    "hippo_support",
    "hippo_transform",
    "kernel_signature",
    "rbf_spectral_density",
    "spectral_parts",
    "spherical_jn",
]

#: the built-in kernels in words (kernels registered later: :func:`.covariances.supported_kernels`)
SUPPORTED_KERNELS = supported_kernels()


def spectral_parts(kernel: gpytorch.kernels.Kernel) -> tuple[Tensor, Tensor, float | None]:
    """``(outputscale, lengthscale (D,), nu)`` of a registered stationary kernel (:mod:`.covariances`);
    ``nu`` is the Matérn smoothness, ``None`` for any other kernel (RBF).  ``TypeError`` for a kernel
    without a registration, ``ValueError`` for a batched one.

    :param kernel: a registered GPyTorch kernel (optionally in a scale wrapper).
    """
    spec, outputscale, lengthscale, _ = kernel_parts(kernel)
    return outputscale, lengthscale, spec.nu if spec.matern else None


def kernel_signature(kernel: gpytorch.kernels.Kernel) -> tuple:
    """What a cached quantity built from ``kernel`` depends on: type, ``nu``, hyperparameter values, dtype, device.

    :param kernel: a GPyTorch kernel (its modules' types and ``nu``, and its raw parameters, are read).
    """
    values = tuple((name, p.dtype, p.device, tuple(p.detach().reshape(-1).tolist())) for name, p in kernel.named_parameters())
    types = tuple((type(m).__name__, getattr(m, "nu", None)) for m in kernel.modules())
    return types + values


def rbf_spectral_density(kernel: gpytorch.kernels.Kernel, omega: Tensor) -> Tensor:
    r""":math:`S(\omega) = \sigma^2 \ell / \sqrt{2\pi}\, \exp(-\omega^2 \ell^2 / 2)` of a 1-D RBF kernel, differentiable in
    :math:`\sigma^2` and :math:`\ell` (float64).

    :param kernel: an RBF kernel (any kernel registered with a Gaussian spectral density), optionally in a scale wrapper.
    :param omega: angular frequencies :math:`\omega`, any shape.
    """
    spec, outputscale, lengthscale, _ = kernel_parts(kernel)
    if not spec.gaussian:
        raise TypeError("rbf_spectral_density needs an RBF kernel")
    return rbf_spectral_density_of(omega, outputscale, lengthscale)


@functools.lru_cache(maxsize=1024)  # the rules of a long stream use a few hundred sizes
def _gauss_legendre_numpy(n: int) -> tuple[np.ndarray, np.ndarray]:
    k = np.arange(1, n + 1)
    x = np.cos(np.pi * (k - 0.25) / (n + 0.5))  # Tricomi's initial guesses, then Newton on P_n
    for _ in range(100):
        p_prev, p = _legendre_pair(n, x)
        derivative = n * (x * p - p_prev) / (x * x - 1)
        step = p / derivative
        x = x - step
        if np.abs(step).max() < 1e-16:
            break
    p_prev, p = _legendre_pair(n, x)
    derivative = n * (x * p - p_prev) / (x * x - 1)
    weights = 2 / ((1 - x * x) * derivative * derivative)
    return x[::-1].copy(), weights[::-1].copy()


def _legendre_pair(n: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(P_{n-1}(x), P_n(x))`` by the three-term recurrence (in place, three buffers)."""
    p_prev, p, following = np.ones_like(x), x.copy(), np.empty_like(x)
    for j in range(2, n + 1):
        np.multiply(x, p, out=following)
        following *= (2 * j - 1) / j
        p_prev *= (j - 1) / j
        following -= p_prev
        p_prev, p, following = p, following, p_prev
    return (p_prev, p) if n >= 1 else (p, p_prev)


def gauss_legendre(n: int, device=None) -> tuple[Tensor, Tensor]:
    """``n``-point Gauss-Legendre nodes and weights on ``[-1, 1]`` (float64), :math:`O(n^2)` by Newton's method, cached.

    :param n: the number of nodes, an int ``>= 2``.
    :param device: the device of the returned tensors (default: the CPU).
    :return: ``(nodes, weights)``, each ``(n,)``, nodes increasing.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"n must be an integer >= 2, got {n!r}")
    nodes, weights = _gauss_legendre_numpy(n)
    return torch.as_tensor(nodes, device=device), torch.as_tensor(weights, device=device)


def spherical_jn(M: int, x: Tensor) -> Tensor:
    r"""Spherical Bessel functions :math:`j_0, \dots, j_{M-1}` at :math:`x \ge 0`: ``(*x.shape, M)``.

    Upward recurrence :math:`j_{n+1} = (2n+1)/x\, j_n - j_{n-1}` is stable for :math:`n \le x`; above it the
    ratios :math:`r_n = j_n / j_{n-1} = 1 / ((2n+1)/x - r_{n+1})` are run downward from :math:`r = 0` well above
    ``M`` (Miller's algorithm in ratio form, so nothing overflows) and chained up from the last stable
    value.  Values below 1e-250 are set to zero (they would be subnormal, and slow).

    :param M: the number of orders, a positive int.
    :param x: the arguments, any shape, all :math:`\ge 0`.
    """
    if (x < 0).any():
        raise ValueError("spherical_jn needs x >= 0")
    safe = torch.where(x > 0, x, torch.ones_like(x))
    j0 = torch.where(x > 0, torch.sin(safe) / safe, torch.ones_like(x))
    j1 = torch.where(x > 0, torch.sin(safe) / safe**2 - torch.cos(safe) / safe, torch.zeros_like(x))
    upward = [j0, j1]
    for n in range(1, M - 1):
        upward.append((2 * n + 1) / safe * upward[n] - upward[n - 1])
    ratio = torch.zeros_like(x)
    ratios = [ratio] * M
    for n in range(M + 20 + math.ceil(2 * M ** (1 / 3)), 0, -1):
        ratio = 1 / ((2 * n + 1) / safe - ratio)
        if n < M:
            ratios[n] = ratio
    values = [j0]
    for n in range(1, M):
        chained = values[-1] * torch.where(x > 0, ratios[n], torch.zeros_like(x))
        chained = torch.where(chained.abs() < 1e-250, torch.zeros_like(chained), chained)
        values.append(torch.where(x >= n, upward[n], chained))
    return torch.stack(values, dim=-1)


def hippo_support(measure: str, M: int, theta: float, t: float, start: float) -> tuple[float, float] | None:
    r"""``(c, h)``, centre and half-width of the basis functions' support, or ``None`` where
    :func:`hippo_transform` has no closed form (a support clipped by the stream start).

    :param measure: ``"legs"``, ``"legt"``, ``"lagt"`` or ``"fout"`` (:data:`gpytorch_hippo.hippo.MEASURES`).
    :param M: the number of basis functions (LagT's support bound :math:`h = (4M + 10)\theta` grows with it).
    :param theta: window length (LegT/FouT) or time scale (LagT) :math:`\theta > 0`; ignored by LegS.
    :param t: the bases' current time :math:`t`.
    :param start: the stream start (the signal is zero before it).
    """
    if measure in ("legs", "legt"):
        lower = 0.0 if measure == "legs" else t - theta
        return None if start > lower else (t - (t - lower) / 2, (t - lower) / 2)
    if measure == "lagt":
        return None if (t - start) / theta < 80 else (t, (4 * M + 10) * theta)
    return None if t - theta < start else (t - theta / 2, theta / 2)


def hippo_transform(measure: str, M: int, theta: float, t: float, start: float, omega: Tensor) -> Tensor:
    r"""``D`` (complex, ``(Q, M)``) with :math:`\hat c_m(\omega) = e^{i\omega c} D_m(\omega)`, ``(c, h)`` from :func:`hippo_support`.

    Closed forms (:math:`\phi_m = g_m \omega^{(t)}` as in :mod:`gpytorch_hippo.hippo`):

    * LegS on :math:`[0, t]` and LegT on :math:`[t-\theta, t]`: :math:`D_m = \sqrt{2m+1}\, i^m j_m(\omega h)`
      (:math:`\int_{-1}^1 e^{iaz} P_m(z)\, dz = 2 i^m j_m(a)`);
    * LagT: :math:`D_m = (i\omega\theta)^m / (1 + i\omega\theta)^{m+1}` with :math:`c = t` (the Laplace transform of
      :math:`L_m(r) e^{-r}`), exact when the stream start cuts off less than :math:`2 e^{-(t-\mathrm{start})/(2\theta)}`
      of it (:math:`|L_m(r)| \le e^{r/2}`): :math:`(t - \mathrm{start})/\theta \ge 80`; :math:`h = (4M + 10) \theta` bounds its support;
    * FouT: :math:`D_0 = \operatorname{sinc}(\omega h)`, cos/sin pair :math:`k`:
      :math:`(-1)^k/\sqrt2\, [\operatorname{sinc}((\omega-a)h) \pm \operatorname{sinc}((\omega+a)h)]` (times
      :math:`i` for the sine), :math:`a = 2\pi k/\theta`.

    :param measure: ``"legs"``, ``"legt"``, ``"lagt"`` or ``"fout"``.
    :param M: the number of basis functions; odd for ``"fout"``.
    :param theta: window length (LegT/FouT) or time scale (LagT) :math:`\theta > 0`; ignored by LegS.
    :param t: the bases' current time :math:`t`.
    :param start: the stream start; a support it clips raises ``ValueError`` (no closed form).
    :param omega: angular frequencies ``(Q,)`` (computed in float64).
    """
    support = hippo_support(measure, M, theta, t, start)
    if support is None:
        raise ValueError(f"no closed-form HiPPO transform for measure {measure!r} with a support clipped at start = {start}")
    _, h = support
    omega = omega.double()
    m = torch.arange(M, dtype=torch.float64, device=omega.device)
    if measure in ("legs", "legt"):
        values = spherical_jn(M, omega * h) * torch.sqrt(2 * m + 1)
        return values * torch.polar(torch.ones_like(m), m * math.pi / 2)  # i^m
    if measure == "lagt":
        z = (1j * omega * theta)[:, None]
        ratio = (z / (1 + z)).expand(-1, M - 1)  # powers by products: z**m is NaN at ω = 0 (a periodic kernel's line)
        return torch.cat([torch.ones_like(z), ratio], dim=-1).cumprod(-1) / (1 + z)
    k = torch.arange(1, (M - 1) // 2 + 1, dtype=torch.float64, device=omega.device)
    a = 2 * math.pi * k / theta
    minus = torch.sinc((omega[:, None] - a) * h / math.pi)  # torch.sinc(x) = sin(πx)/(πx)
    plus = torch.sinc((omega[:, None] + a) * h / math.pi)
    sign = (-1.0) ** k / math.sqrt(2.0)
    cos_part = (sign * (minus + plus)).to(torch.complex128)
    sin_part = 1j * sign * (plus - minus)
    pairs = torch.stack([cos_part, sin_part], dim=-1).flatten(-2)
    constant = torch.sinc(omega * h / math.pi)[:, None].to(torch.complex128)
    return torch.cat([constant, pairs], dim=-1)
