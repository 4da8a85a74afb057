r"""Exact HiPPO covariances for Matérn kernels at a cost linear in :math:`t/\ell` (beyond the thesis).

A Matérn kernel with :math:`\nu \in \{1/2, 3/2, 5/2\}` is :math:`k(r) = \sigma^2 q(\lambda|r|)\, e^{-\lambda|r|}`
(:math:`\lambda = \sqrt{2\nu}/\ell`, :math:`q` a polynomial): analytic in :math:`r` except for the kink at :math:`r = 0`, and
below :math:`2 \cdot 10^{-18} \sigma^2` beyond :math:`r = 48/\lambda`.  Its spectral density is rational, so the frequency rule of
:class:`~gpytorch_hippo.inducing.hippo_backends.SpectralBackend` converges only algebraically;
the same integrals are evaluated here in time, where the kernel's two properties make a composite
Gauss-Legendre rule exact to round-off and banded:

* :math:`K_{uf}[m](x) = \int \phi_m(s)\, k(x - s)\, \mathrm{d}s` (:math:`\phi_m = g_m \omega`, thesis eq. (4.9)) on uniform
  panels of width :math:`\le 2\ell`.  On a panel not containing :math:`x` the integrand is analytic (it equals
  one branch of :math:`k`), so :math:`p` nodes per panel converge exponentially; the panel containing :math:`x`
  is split at :math:`x` into two such pieces.  Panels further than :math:`48/\lambda` from :math:`x` are skipped:
  each :math:`x` costs :math:`O(M \ell/w \cdot p)` whatever :math:`t` is.
* :math:`K_{uu}[m, n] = \int \phi_m(s)\, K_{uf}[n](s)\, \mathrm{d}s` (thesis eq. (4.11)): :math:`K_{uf}[n]` is analytic
  inside the support (a convolution of the kink with an analytic function), so the same panel rule
  integrates it; ``Kuu`` costs :math:`O((t/\ell) p^2 M + Q M^2)`, linear in :math:`t/\ell`.
* ``Kuu_cross`` between two sets: the same outer integral over the first set's support, with extra
  panel breaks where the second set's support (and so its ``Kuf``) ends.

A Matérn or RBF kernel times a periodic one (:func:`~.covariances.quasi_periodic_spec`) keeps both properties (at most
the kink at 0, the Matérn factor's reach); its panels are measured in the rule length scale that resolves the
highest harmonic, and the far panels of ``Kuu`` are dense ``p x p`` blocks (one per panel offset: uniform panels and
a stationary kernel) instead of the Matérn closed form's rank :math:`\nu + 1/2`.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from .._validation import floating_dtype
from .cost import check_work
from .covariances import DECAY_RANGE, MATERN_POLYNOMIALS, kernel_parts
from .spectral import gauss_legendre

__all__ = [
    "BASE_NODES",
    "CHUNK_ENTRIES",
    "DECAY_RANGE",
    "LAGT_RANGE",
    "MATERN_POLYNOMIALS",
    "MAX_NODES",
    "PANEL_WIDTH",
    "BandedBackend",
    "Panels",
    "matern_values",
    "separable_far_panels",
    "support_span",
]
#: ``|L_m(r)| e^{-r} <= e^{-r/2}``: LagT weights beyond ``80 θ`` before ``t`` are below ``5e-18``
LAGT_RANGE = 80.0
#: panel width in length scales (and in ``θ`` for LagT's exponential measure)
PANEL_WIDTH = 8.0
#: most Gauss-Legendre nodes per panel (more panels instead)
MAX_NODES = 96
#: a chunk of own-panel work: ``<= 2^22`` values
CHUNK_ENTRIES = 2**22
#: Gauss-Legendre nodes per panel beyond what the basis needs (the kernel's variation across a panel)
BASE_NODES = 24


def support_span(ivars) -> tuple[float, float]:
    r"""``[lower, t]``: the measure's support, clipped at the stream start (LagT: at :math:`t - 80 \theta`).

    :param ivars: 1-D HiPPO inducing variables (or a view with their ``t``, ``start``, ``measure`` and ``memory``).
    """
    t, theta = ivars.t, ivars.memory.theta
    if ivars.measure == "legs":
        lower = max(0.0, ivars.start)
    elif ivars.measure in ("legt", "fout"):
        lower = max(t - theta, ivars.start)
    else:
        lower = max(t - LAGT_RANGE * theta, ivars.start)
    return lower, t


class Panels:
    r"""Uniform panels on the support with ``p`` Gauss-Legendre nodes each and :math:`\phi_m` at the nodes.

    :param ivars: the 1-D HiPPO inducing variables whose support (:func:`support_span`) is divided.
    :param lengthscale: the kernel's length scale :math:`\ell`: panels are at most :data:`PANEL_WIDTH` :math:`\ell` wide
        (and :data:`PANEL_WIDTH` :math:`\theta` for LagT).
    :param device: the device of the nodes and basis values.
    :param window: ``(lo, hi)``: only the panels meeting the time range ``[lo, hi]`` get nodes; ``None`` (default): all.
    """

    def __init__(self, ivars, lengthscale: float, device, window=None):
        """``window = (lo, hi)``: only the panels meeting the time range ``[lo, hi]`` get nodes and ``φ``
        (a local rule, whose cost does not grow with the support's length); ``None``: all panels."""
        self.ivars = ivars
        self.lower, upper = support_span(ivars)
        target = PANEL_WIDTH * lengthscale
        if ivars.measure == "lagt":
            target = min(target, PANEL_WIDTH * ivars.memory.theta)
        # at least enough panels that p <= MAX_NODES: the own-panel rule costs O(p^3)
        enough = math.ceil((ivars.num_inducing / (MAX_NODES - BASE_NODES)) ** 2)
        self.count = max(1, math.ceil((upper - self.lower) / target), enough)
        self.width = (upper - self.lower) / self.count
        # a degree M-1 polynomial has ~ M / sqrt(P) zeros in an end panel of P (Legendre zeros crowd the ends)
        self.num_nodes = math.ceil(ivars.num_inducing / math.sqrt(self.count)) + BASE_NODES
        self.z, self.w = gauss_legendre(self.num_nodes, device=device)
        self.first, self.last = 0, self.count
        if window is not None:
            self.first = min(self.count, max(0, math.floor((window[0] - self.lower) / self.width)))
            self.last = max(self.first, min(self.count, math.floor((window[1] - self.lower) / self.width) + 1))
        # nodes, φ and the weighted φ of the panels formed, and Kuf at the nodes: about 4 x nodes x M values
        formed = float(self.last - self.first) * self.num_nodes
        check_work(4 * formed * ivars.num_inducing, "the banded panel rule (4 x nodes x M)", ivars, lengthscale=lengthscale)
        index = torch.arange(self.first, self.last, dtype=torch.float64, device=device)
        left = self.lower + self.width * index
        self.nodes = left[:, None] + self.width * (self.z + 1) / 2  # (P, p), panels first..last-1
        density = ivars.memory.density_at_nodes(self.nodes.reshape(-1), ivars.t)
        scale = ((self.width / 2) * self.w * density.reshape(self.nodes.shape)).reshape(-1)
        weighted = ivars.memory.basis_at_nodes(self.nodes.reshape(-1), ivars.t, scale)  # φ with the rule's weights folded in
        self.weighted = weighted.reshape(self.last - self.first, self.num_nodes, ivars.num_inducing)  # (P, p, M); P = 0 allowed

    @functools.cached_property
    def phi_nodes(self) -> Tensor:
        """``φ_m`` at the nodes, ``(P, p, M)`` (formed when a rule needs it without the weights)."""
        return self.phi(self.nodes.reshape(-1)).reshape(self.weighted.shape)

    def phi(self, s: Tensor) -> Tensor:
        r""":math:`\phi_m(s) = g_m^{(t)}(s)\, \omega^{(t)}(s)` for ``s`` ``(N,)`` -> ``(N, M)``.

        :param s: times ``(N,)``, float64.
        """
        memory, t = self.ivars.memory, self.ivars.t
        return memory.basis(s, t) * memory.measure_density(s, t)[:, None]


def matern_values(kernel, r: Tensor) -> Tensor:
    r""":math:`k(r) = \sigma^2 q(\lambda|r|)\, e^{-\lambda|r|}` from the kernel's own hyperparameters (differentiable): the
    ``values`` of its registration (:mod:`.covariances`; also of a Matérn or RBF kernel times a periodic one).

    Closed form on the differences themselves: GPyTorch's pairwise distances lose digits for close
    points, which the exact rules here would otherwise inherit.

    :param kernel: a registered Matérn kernel (optionally in a scale wrapper), one length scale.
    :param r: differences :math:`x - s`, any shape.
    """
    spec, outputscale, lengthscale, _ = kernel_parts(kernel)
    return spec.values(r, outputscale, lengthscale)


def separable_far_panels(kernel, centred: Tensor, width: float):
    r""":math:`k(x - s) = \sum_{ij} A[x, i]\, E_d[i, j]\, B[s, j]` for ``x`` in panel ``i`` and ``s`` in panel ``i + d``, ``d >= 1``.

    ``centred``: the nodes' offsets from their panel's centre.  There :math:`|x - s| = d w + b - a` never
    changes sign, so the kernel is the analytic branch :math:`\sigma^2 q(\lambda\tau) e^{-\lambda\tau}`; with
    :math:`\alpha = -\lambda a`, :math:`\beta = \lambda b`, :math:`\delta = \lambda d w` and the trinomial expansion of
    :math:`q(\delta + \alpha + \beta)`: :math:`A = \alpha^i e^{-\alpha}`, :math:`B = \beta^j e^{-\beta}`,
    :math:`E_d[i, j] = \sigma^2 e^{-\delta} \sum_k c_k \frac{k!}{i!\, j!\, (k-i-j)!} \delta^{k-i-j}`
    -- rank :math:`\nu + 1/2` instead of ``p``: the Markov (state-space) structure of Matérn kernels.
    Returns ``A``, ``B`` (``p x r``) and the function ``d -> E_d``.

    :param kernel: a registered Matérn kernel (optionally in a scale wrapper), one length scale.
    :param centred: the nodes' offsets from their panel's centre, ``(p,)``.
    :param width: the panels' width :math:`w`, in the inputs' unit.
    """
    spec, outputscale, lengthscale, _ = kernel_parts(kernel)
    nu = spec.matern_nu()
    rate = math.sqrt(2 * nu) / lengthscale.reshape(())
    coefficients = MATERN_POLYNOMIALS[nu]
    rank = len(coefficients)
    alpha, beta = -rate * centred, rate * centred
    A = torch.stack([alpha**i * torch.exp(-alpha) for i in range(rank)], dim=-1)
    B = torch.stack([beta**j * torch.exp(-beta) for j in range(rank)], dim=-1)

    def mixing(d: int) -> Tensor:
        delta = rate * d * width
        rows = []
        for i in range(rank):
            row = []
            for j in range(rank):
                terms = [
                    c * math.factorial(k) / (math.factorial(i) * math.factorial(j) * math.factorial(k - i - j)) * delta ** (k - i - j)
                    for k, c in enumerate(coefficients)
                    if k >= i + j
                ]
                row.append(sum(terms, torch.zeros_like(delta)))
            rows.append(torch.stack(row))
        return outputscale * torch.exp(-delta) * torch.stack(rows)

    return A, B, mixing


def _interpolated_sum(values: Tensor, y: Tensor, z: Tensor, w: Tensor) -> Tensor:
    """``C[n, j] = Σ_q values[n, q] L_j(y[n, q])`` with ``L_j`` the Lagrange basis of the Gauss-Legendre
    nodes ``z`` (weights ``w``), in barycentric form: ``L_j(y) = (b_j / (y - z_j)) / Σ_k b_k / (y - z_k)``."""
    barycentric = ((-1.0) ** torch.arange(z.shape[0], device=z.device) * torch.sqrt((1 - z**2) * w)).to(values.dtype)
    difference = (y[..., None] - z).to(values.dtype)
    # y on a node: L is that node's indicator; a tiny difference gives it without dividing by zero
    inverse = difference.masked_fill_(difference == 0, 1e-300).reciprocal_()
    denominator = inverse @ barycentric
    return torch.einsum("nq,nqj->nj", values / denominator, inverse) * barycentric


class BandedBackend:
    r"""Exact ``Kuu``/``Kuf``/``Kuu_cross`` for 1-D Matérn kernels and Matérn or RBF times periodic, linear in
    :math:`t/\ell` (module docstring)."""

    name = "banded"

    def supports(self, ivars, kernel) -> bool:
        """Whether ``ivars`` are 1-D with a finite support and ``kernel`` a registered Matérn kernel with one length scale,
        or a Matérn or RBF kernel times a periodic one.

        :param ivars: the HiPPO inducing variables.
        :param kernel: the GP's kernel :math:`k`.
        """
        if ivars.input_dim != 1:
            return False
        try:
            spec, _, lengthscale, _ = kernel_parts(kernel)
        except (TypeError, ValueError):  # not registered, or a batched kernel
            return False
        takes = spec.matern or spec.envelope is not None
        return takes and lengthscale.numel() == 1 and math.isfinite(support_span(ivars)[0])

    @staticmethod
    def _scales(kernel) -> tuple[float, float]:
        """``(ℓ, reach)``: the length scale and the distance beyond which ``k`` is negligible."""
        spec, _, lengthscale, _ = kernel_parts(kernel)
        ell = float(lengthscale.detach())
        return ell, spec.known_reach() * ell

    def _panels(self, ivars, kernel) -> Panels:
        return Panels(ivars, self._scales(kernel)[0], ivars.breakpoints.device)

    def _band(self, panels: Panels, kernel) -> int:
        return math.ceil(self._scales(kernel)[1] / panels.width) + 1

    def _own_panel(self, panels: Panels, kernel, offsets: Tensor, dtype) -> Tensor:
        """``C (n, p)``: ``∫_panel φ(s) k(x - s) ds = C φ(panel nodes)`` for ``x`` at ``offsets`` in the panel.

        The panel is split at ``x`` into two Gauss-Legendre rules (the integrand is analytic on each
        piece) and ``φ`` on the panel is its Lagrange interpolant at the panel's nodes, exact to the
        accuracy of the panel rule itself.
        """
        z, w, width = panels.z, panels.w, panels.width
        left, right = offsets[:, None] / 2, (width - offsets[:, None]) / 2  # [a, x] and [x, b]
        sub = torch.cat([left * (z + 1), offsets[:, None] + right * (z + 1)], dim=-1)  # (n, 2p) offsets
        weights = torch.cat([left * w, right * w], dim=-1)
        kernel_sub = matern_values(kernel, offsets[:, None] - sub).to(dtype) * weights.to(dtype)
        return _interpolated_sum(kernel_sub, 2 * sub / width - 1, z, w)

    def _kuf_at_nodes(self, panels: Panels, kernel, dtype) -> Tensor:
        """``Kuf`` at the panels' own nodes (``Q x M``), the inner integral of ``Kuu``.

        Uniform panels and a stationary kernel: the own panel contributes through one ``p x p``
        matrix ``C`` (:meth:`_own_panel`), the panel at offset ``d`` through the separable form of
        :func:`separable_far_panels` (Matérn: cost ``O(P r M)`` per offset instead of ``O(P p² M)``), or through one
        ``p x p`` block :math:`k(a - b - d w)` (any other kernel).
        """
        P, p, width = panels.count, panels.num_nodes, panels.width
        weighted = panels.weighted.to(dtype)
        offsets = width * (panels.z + 1) / 2  # node positions inside a panel
        out = self._own_panel(panels, kernel, offsets, dtype) @ panels.phi_nodes.to(dtype)
        if not kernel_parts(kernel).spec.matern:
            for d in range(1, min(self._band(panels, kernel), P - 1) + 1):
                later = matern_values(kernel, offsets[:, None] - offsets - d * width).to(dtype)  # x in panel i, s in i + d
                out[: P - d] += later @ weighted[d:]
                out[d:] += later.mT @ weighted[: P - d]  # k is even: x in panel i + d, s in panel i
            return out.reshape(P * p, -1)
        A, B, mixing = separable_far_panels(kernel, offsets - width / 2, width)
        A, B = A.to(dtype), B.to(dtype)
        towards_later, towards_earlier = B.mT @ weighted, A.mT @ weighted  # (P, r, M)
        from_later, from_earlier = torch.zeros_like(towards_later), torch.zeros_like(towards_later)
        for d in range(1, min(self._band(panels, kernel), P - 1) + 1):
            E = mixing(d).to(dtype)
            from_later[: P - d] += E @ towards_later[d:]  # x in panel i, s in panel i + d
            from_earlier[d:] += E.mT @ towards_earlier[: P - d]  # x in panel i + d, s in panel i
        out = out + A @ from_later + B @ from_earlier
        return out.reshape(P * p, -1)

    def _kuf_at(self, panels: Panels, kernel, times: Tensor, dtype) -> Tensor:
        """``Kuf`` at any ``times`` (N,) float64 -> (N, M): banded panel sums, own panel split at ``x``."""
        P, p, width = panels.count, panels.num_nodes, panels.width
        band = self._band(panels, kernel)
        weighted = panels.weighted.to(dtype)
        out = torch.zeros(times.shape[0], weighted.shape[-1], dtype=dtype, device=times.device)
        index = torch.floor((times - panels.lower) / width).long()
        # x on a panel edge needs no split (each side is analytic), and splitting there would put
        # one piece's nodes on the panel's nodes, where the interpolant's x-derivative is lost
        on_edge = times == panels.lower + index * width
        for j in torch.unique(index).tolist():
            first, last = max(panels.first, j - band), min(panels.last, j + band + 1)
            if first >= last:
                continue  # farther than the kernel's reach from every panel (of the window): zero
            inside = 0 <= j < P
            if inside and not panels.first <= j < panels.last:
                raise ValueError(f"panel {j} of an input lies outside the window [{panels.first}, {panels.last})")
            for edge in (True, False):
                rows = ((index == j) & (on_edge == edge)).nonzero().squeeze(-1)
                if rows.numel() == 0:
                    continue
                split = inside and not edge
                others = [q - panels.first for q in range(first, last) if not (split and q == j)]
                if others:
                    K = matern_values(kernel, times[rows, None] - panels.nodes[others].reshape(-1)).to(dtype)
                    out[rows] += K @ weighted[others].reshape(len(others) * p, -1)
                if split:
                    chunk = max(1, CHUNK_ENTRIES // (2 * p * p))  # the own-panel rule holds n x 2p x p values
                    for start in range(0, rows.shape[0], chunk):
                        part = rows[start : start + chunk]
                        own = self._own_panel(panels, kernel, times[part] - (panels.lower + j * width), dtype)
                        out[part] += own @ panels.phi_nodes[j - panels.first].to(dtype)
        return out

    def local_kuf(self, ivars, kernel, times: Tensor, dtype) -> Tensor:
        """``Kuf`` at ``times`` (N,) float64 -> (N, M) from the panels within the kernel's reach of
        ``times`` only: the cost per input does not grow with ``t`` (used by the Lyapunov backend).

        :param ivars: the HiPPO inducing variables (or a view of them at another time).
        :param kernel: the GP's Matérn kernel.
        :param times: the inputs ``(N,)``, float64.
        :param dtype: the dtype of the result.
        """
        ell, reach = self._scales(kernel)
        low, high = (float(times.min()), float(times.max())) if times.numel() else (0.0, -1.0)
        panels = Panels(ivars, ell, ivars.breakpoints.device, window=(low - 2 * reach, high + 2 * reach))
        return self._kuf_at(panels, kernel, times, dtype)

    def Kuf(self, ivars, kernel, x: Tensor) -> Tensor:
        r""":math:`\operatorname{cov}(u, f(x))` by the banded panel rule: ``(*batch, M, N)`` in ``x``'s dtype.

        :param ivars: the HiPPO inducing variables.
        :param kernel: the GP's Matérn kernel.
        :param x: inputs ``(*batch, N, 1)``.
        """
        panels = self._panels(ivars, kernel)
        times = x[..., 0].double()
        flat = self._kuf_at(panels, kernel, times.reshape(-1), x.dtype)
        return flat.reshape(*times.shape, -1).mT

    def cross(self, a, b, kernel) -> Tensor:
        r""":math:`\operatorname{cov}(u_a, u_b)` without jitter, ``(M, M')`` in the kernel's dtype; ``Kuu`` (symmetrised)
        when ``b`` is ``a``.

        :param a: the first set of HiPPO inducing variables (the outer integral runs over its support).
        :param b: the second set, or ``a`` itself.
        :param kernel: the GP's Matérn kernel.
        """
        dtype = floating_dtype(kernel)
        panels_b = self._panels(b, kernel)
        if b is a:
            cov = panels_b.weighted.to(dtype).reshape(-1, a.num_inducing).mT @ self._kuf_at_nodes(panels_b, kernel, dtype)
            return (cov + cov.mT) / 2
        nodes, weighted = self._outer_rule(a, support_span(b), kernel)
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


#: former private names (tests and older code import them)
_span, _Panels = support_span, Panels
