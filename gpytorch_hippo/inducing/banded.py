"""Exact HiPPO covariances for Matérn kernels at a cost linear in ``t/ℓ`` (beyond the thesis).

A Matérn kernel with ``ν ∈ {1/2, 3/2, 5/2}`` is ``k(r) = σ² q(λ|r|) e^{-λ|r|}`` (``λ = √(2ν)/ℓ``,
``q`` a polynomial): analytic in ``r`` except for the kink at ``r = 0``, and below ``2e-18 σ²``
beyond ``r = 48/λ``.  Its spectral density is rational, so the frequency rule of
:class:`~gpytorch_hippo.inducing.hippo_backends.SpectralBackend` converges only algebraically;
the same integrals are evaluated here in time, where the kernel's two properties make a composite
Gauss-Legendre rule exact to round-off and banded:

* ``Kuf[m](x) = ∫ φ_m(s) k(x - s) ds`` (``φ_m = g_m ω``, thesis eq. ``hippo_kuf``) on uniform
  panels of width ``≤ 2ℓ``.  On a panel not containing ``x`` the integrand is analytic (it equals
  one branch of ``k``), so ``p`` nodes per panel converge exponentially; the panel containing ``x``
  is split at ``x`` into two such pieces.  Panels further than ``48/λ`` from ``x`` are skipped:
  each ``x`` costs ``O(M ℓ/w · p)`` whatever ``t`` is.
* ``Kuu[m, n] = ∫ φ_m(s) Kuf[n](s) ds`` (eq. ``double_integral_kuu``): ``Kuf[n]`` is analytic
  inside the support (a convolution of the kink with an analytic function), so the same panel rule
  integrates it; ``Kuu`` costs ``O((t/ℓ) p² M + Q M²)``, linear in ``t/ℓ``.
* ``Kuu_cross`` between two sets: the same outer integral over the first set's support, with extra
  panel breaks where the second set's support (and so its ``Kuf``) ends.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from .spectral import gauss_legendre, spectral_parts

#: ``q(x) e^{-x} < 2e-18`` for ``x = λ r >= 48`` and every ``ν`` in {1/2, 3/2, 5/2}
DECAY_RANGE = 48.0
#: ``|L_m(r)| e^{-r} <= e^{-r/2}``: LagT weights beyond ``80 θ`` before ``t`` are below ``5e-18``
LAGT_RANGE = 80.0
#: panel width in length scales (and in ``θ`` for LagT's exponential measure)
PANEL_WIDTH = 8.0
#: Gauss-Legendre nodes per panel beyond what the basis needs (the kernel's variation across a panel)
BASE_NODES = 24
#: a chunk of sub-rule work: ``<= 2^22`` basis values
CHUNK_ENTRIES = 2**22


def _span(ivars) -> tuple[float, float]:
    """``[lower, t]``: the measure's support, clipped at the stream start (LagT: at ``t - 80 θ``)."""
    t, theta = ivars.t, ivars.memory.theta
    if ivars.measure == "legs":
        lower = max(0.0, ivars.start)
    elif ivars.measure in ("legt", "fout"):
        lower = max(t - theta, ivars.start)
    else:
        lower = max(t - LAGT_RANGE * theta, ivars.start)
    return lower, t


class _Panels:
    """Uniform panels on the support with ``p`` Gauss-Legendre nodes each and ``φ_m`` at the nodes."""

    def __init__(self, ivars, lengthscale: float, device):
        self.ivars = ivars
        self.lower, upper = _span(ivars)
        target = PANEL_WIDTH * lengthscale
        if ivars.measure == "lagt":
            target = min(target, PANEL_WIDTH * ivars.memory.theta)
        self.count = max(1, math.ceil((upper - self.lower) / target))
        self.width = (upper - self.lower) / self.count
        # a degree M-1 polynomial has ~ M / sqrt(P) zeros in an end panel of P (Legendre zeros crowd the ends)
        self.num_nodes = math.ceil(ivars.num_inducing / math.sqrt(self.count)) + BASE_NODES
        self.z, self.w = gauss_legendre(self.num_nodes, device=device)
        left = self.lower + self.width * torch.arange(self.count, dtype=torch.float64, device=device)
        self.nodes = left[:, None] + self.width * (self.z + 1) / 2  # (P, p)
        weights = (self.width / 2) * self.w.repeat(self.count)
        self.weighted = weights[:, None] * self.phi(self.nodes.reshape(-1))  # (P p, M)

    def phi(self, s: Tensor) -> Tensor:
        """``φ_m(s) = g_m^{(t)}(s) ω^{(t)}(s)`` for ``s`` (N,) -> (N, M)."""
        memory, t = self.ivars.memory, self.ivars.t
        return memory.basis(s, t) * memory.measure_density(s, t)[:, None]


def matern_values(kernel, r: Tensor) -> Tensor:
    """``k(r) = σ² q(λ|r|) e^{-λ|r|}`` from the kernel's own hyperparameters (differentiable).

    Closed form on the differences themselves: GPyTorch's pairwise distances lose digits for close
    points, which the exact rules here would otherwise inherit.
    """
    outputscale, lengthscale, nu = spectral_parts(kernel)
    x = math.sqrt(2 * nu) * r.abs().to(lengthscale.dtype) / lengthscale
    polynomial = {0.5: 1.0, 1.5: 1 + x, 2.5: 1 + x + x**2 / 3}[nu]
    return outputscale * polynomial * torch.exp(-x)


def _lagrange(z: Tensor, w: Tensor, y: Tensor) -> Tensor:
    """Lagrange basis of the Gauss-Legendre nodes ``z`` at ``y`` (...,) -> (..., p), barycentric form."""
    barycentric = (-1.0) ** torch.arange(z.shape[0], device=z.device) * torch.sqrt((1 - z**2) * w)
    difference = y[..., None] - z
    exact = difference == 0
    terms = barycentric / torch.where(exact, torch.ones_like(difference), difference)
    values = terms / terms.sum(-1, keepdim=True)
    return torch.where(exact.any(-1, keepdim=True), exact.to(values.dtype), values)


class BandedBackend:
    """Exact ``Kuu``/``Kuf``/``Kuu_cross`` for 1-D Matérn kernels, linear in ``t/ℓ`` (module docstring)."""

    name = "banded"

    def supports(self, ivars, kernel) -> bool:
        if ivars.input_dim != 1:
            return False
        try:
            _, lengthscale, nu = spectral_parts(kernel)
        except (TypeError, ValueError):  # not a Matérn kernel, or a batched one
            return False
        return nu is not None and lengthscale.numel() == 1 and math.isfinite(_span(ivars)[0])

    @staticmethod
    def _scales(kernel) -> tuple[float, float]:
        """``(ℓ, reach)``: the length scale and the distance beyond which ``k`` is negligible."""
        _, lengthscale, nu = spectral_parts(kernel)
        ell = float(lengthscale.detach())
        return ell, DECAY_RANGE * ell / math.sqrt(2 * nu)

    def _panels(self, ivars, kernel) -> _Panels:
        return _Panels(ivars, self._scales(kernel)[0], ivars.breakpoints.device)

    def _band(self, panels: _Panels, kernel) -> int:
        return math.ceil(self._scales(kernel)[1] / panels.width) + 1

    def _kuf_at_nodes(self, panels: _Panels, kernel, dtype) -> Tensor:
        """``Kuf`` at the panels' own nodes (``Q x M``), the inner integral of ``Kuu``.

        Uniform panels and a stationary kernel: the panel at offset ``d`` contributes through one
        ``p x p`` matrix ``K_d``; the own panel (split at each node) through one matrix ``C`` acting
        on ``φ`` at the panel's nodes (its Lagrange interpolant, exact to the rule's accuracy).
        """
        P, p, width = panels.count, panels.num_nodes, panels.width
        weighted = panels.weighted.to(dtype).reshape(P, p, -1)
        offsets = panels.width * (panels.z + 1) / 2  # node positions inside a panel
        out = torch.zeros_like(weighted)
        for d in range(1, min(self._band(panels, kernel), P - 1) + 1):
            K = matern_values(kernel, offsets[:, None] - offsets[None, :] - d * width).to(dtype)  # x in i, s in i + d
            out[: P - d] += K @ weighted[d:]
            out[d:] += K.mT @ weighted[: P - d]
        left, right = offsets / 2, (width - offsets) / 2  # own panel: [a, x] and [x, b] for each node x
        sub = torch.cat([left[:, None] * (panels.z + 1), offsets[:, None] + right[:, None] * (panels.z + 1)], dim=-1)
        sub_weights = torch.cat([left[:, None] * panels.w, right[:, None] * panels.w], dim=-1)
        interpolate = _lagrange(panels.z, panels.w, 2 * sub / width - 1)  # (p, 2p, p)
        kernel_sub = matern_values(kernel, offsets[:, None] - sub).to(dtype) * sub_weights.to(dtype)
        C = torch.einsum("xq,xqj->xj", kernel_sub, interpolate.to(dtype))
        phi = (panels.phi(panels.nodes.reshape(-1)).to(dtype)).reshape(P, p, -1)
        return (out + C @ phi).reshape(P * p, -1)

    def _kuf_at(self, panels: _Panels, kernel, times: Tensor, dtype) -> Tensor:
        """``Kuf`` at any ``times`` (N,) float64 -> (N, M): banded panel sums, own panel split at ``x``."""
        P, p, width = panels.count, panels.num_nodes, panels.width
        band = self._band(panels, kernel)
        weighted = panels.weighted.to(dtype).reshape(P, p, -1)
        out = torch.zeros(times.shape[0], weighted.shape[-1], dtype=dtype, device=times.device)
        index = torch.floor((times - panels.lower) / width).long()
        index = torch.where(times == panels.lower + P * width, P - 1, index)  # t itself is in the last panel
        for j in torch.unique(index).tolist():
            first, last = max(0, j - band), min(P, j + band + 1)
            if first >= last:
                continue  # farther than the kernel's reach from every panel: zero
            rows = (index == j).nonzero().squeeze(-1)
            x = times[rows]
            inside = 0 <= j < P
            others = [q for q in range(first, last) if not (inside and q == j)]
            if others:
                nodes = panels.nodes[others].reshape(-1)
                out[rows] += matern_values(kernel, x[:, None] - nodes).to(dtype) @ weighted[others].reshape(len(others) * p, -1)
            if inside:
                out[rows] += self._own_panel(panels, kernel, x, j, dtype)
        return out

    def _own_panel(self, panels: _Panels, kernel, x: Tensor, j: int, dtype) -> Tensor:
        """``∫_{a}^{b} φ(s) k(x - s) ds`` on the panel ``[a, b]`` containing ``x``, split at ``x``."""
        a = panels.lower + j * panels.width
        b = a + panels.width
        z, w = panels.z, panels.w
        result = []
        chunk = max(1, CHUNK_ENTRIES // (2 * z.shape[0] * panels.ivars.num_inducing))
        for start in range(0, x.shape[0], chunk):
            xc = x[start : start + chunk, None]
            left, right = (xc - a) / 2, (b - xc) / 2
            s = torch.cat([a + left * (z + 1), xc + right * (z + 1)], dim=-1)  # (n, 2p)
            weights = torch.cat([left * w, right * w], dim=-1)
            phi = panels.phi(s.reshape(-1)).reshape(*s.shape, -1).to(dtype)  # (n, 2p, M)
            K = matern_values(kernel, xc - s).to(dtype) * weights.to(dtype)
            result.append(torch.einsum("nq,nqm->nm", K, phi))
        return torch.cat(result)

    def Kuf(self, ivars, kernel, x: Tensor) -> Tensor:
        panels = self._panels(ivars, kernel)
        times = x[..., 0].double()
        flat = self._kuf_at(panels, kernel, times.reshape(-1), x.dtype)
        return flat.reshape(*times.shape, -1).mT

    def cross(self, a, b, kernel) -> Tensor:
        dtype = next(iter(kernel.parameters())).dtype
        panels_b = self._panels(b, kernel)
        if b is a:
            cov = panels_b.weighted.to(dtype).mT @ self._kuf_at_nodes(panels_b, kernel, dtype)
            return (cov + cov.mT) / 2
        nodes, weighted = self._outer_rule(a, _span(b), kernel)
        return weighted.to(dtype).mT @ self._kuf_at(panels_b, kernel, nodes, dtype)

    def _outer_rule(self, a, breaks: tuple[float, float], kernel) -> tuple[Tensor, Tensor]:
        """``a``'s panel rule with extra panel breaks where ``b``'s ``Kuf`` is not analytic."""
        panels = self._panels(a, kernel)
        edges = panels.lower + panels.width * torch.arange(panels.count + 1, dtype=torch.float64)
        extra = torch.tensor([e for e in breaks if panels.lower < e < float(edges[-1])], dtype=torch.float64)
        edges = torch.unique(torch.cat([edges, extra])).to(panels.z.device)
        half = (edges[1:] - edges[:-1]) / 2
        nodes = (edges[:-1, None] + half[:, None] * (panels.z + 1)).reshape(-1)
        weights = (half[:, None] * panels.w).reshape(-1)
        return nodes, weights[:, None] * panels.phi(nodes)
