r"""Exact LegS covariances carried forward in time at a cost per step that does not grow with :math:`t`.

HiPPO-LegS coefficients :math:`c(t) = \int_{\mathrm{start}}^t f(s)\, \phi(s, t)\, \mathrm{d}s` obey
:math:`\mathrm{d}c/\mathrm{d}t = (A c + B f(t)) / t`
(thesis eqs. (2.10), (2.14), (2.15); :math:`A`, :math:`B` as returned by
:func:`gpytorch_hippo.hippo.transition`, :math:`A` lower triangular with eigenvalues :math:`-1, \dots, -M`), so in
:math:`\tau = \log t` the ODE is time-invariant, :math:`\mathrm{d}c/\mathrm{d}\tau = A c + B f(e^\tau)`.  For a GP prior
:math:`f` this gives

* :math:`K(t) = K_{uu}(t)`: :math:`\mathrm{d}K/\mathrm{d}\tau = A K + K A^\top + B k(t)^\top + k(t) B^\top` (a Lyapunov ODE), with
  :math:`k(t) = \operatorname{cov}(c(t), f(t)) = K_{uf}(t, x = t)`;
* :math:`C(t_a, t_b) = \operatorname{cov}(c(t_a), c(t_b))`, :math:`t_b \ge t_a`:
  :math:`\mathrm{d}C/\mathrm{d}\tau_b = C A^\top + K_{uf}(t_a, x = t_b) B^\top`
  from :math:`C(t_a, t_a) = K(t_a)`.

Both are integrated *exactly* over a step :math:`t_a \to t_b` by variation of constants.  The flow is
:math:`\Phi = e^{A (\tau_b - \tau_a)}`, which for LegS is the re-expansion of the bases: :math:`\phi(x, t_b) = \Phi \phi(x, t_a)`
for :math:`x \le t_a` (a polynomial identity; computed by a Gauss-Legendre projection, exact to round-off).
With :math:`e^{A s} B = e^{-s} g(e^{-s})` (the impulse response) the forcing integrals, written in
:math:`x = e^\sigma`, are ordinary covariances of :math:`d = \int_{t_a}^{t_b} f(x)\, \phi(x, t_b)\, \mathrm{d}x`
(:math:`c(t_b) = \Phi c(t_a) + d`):

.. math::

    C(t_a, t_b) &= K(t_a) \Phi^\top + X,
    \qquad X = \int_{t_a}^{t_b} K_{uf}(t_a, x)\, \phi(x, t_b)^\top \mathrm{d}x, \\
    K(t_b) &= \Phi K(t_a) \Phi^\top + \Phi X + X^\top \Phi^\top + D,
    \qquad D = \operatorname{cov}(d) = \iint_{[t_a, t_b]^2} k(x - y)\, \phi(x, t_b)\, \phi(y, t_b)^\top.

:math:`K_{uf}(t_a, x)` vanishes (below 1e-18 of :math:`\sigma^2`) once :math:`x` is more than the kernel's reach :math:`R`
beyond :math:`t_a` (RBF :math:`9.5 \ell`, Matérn :math:`48 \ell/\sqrt{2\nu}`), so :math:`X` needs :math:`x` in
:math:`[t_a, t_a + R]` only and :math:`K_{uf}` itself only :math:`s` within :math:`R` of :math:`x` (:func:`local_kuf`): both
cost :math:`O(M)` per point whatever :math:`t` is.  :math:`D` is an exact backend (banded for Matérn, quadrature for RBF)
on the new segment :math:`[t_a, t_b]` alone, whose cost depends on :math:`t_b - t_a`, not on :math:`t`; long steps are
cut into pieces of at most :data:`MAX_STEP` length scales.  By stationarity :math:`D` is also the :math:`K_{uu}`
of a LegS set over :math:`[0, L]` (:math:`L = t_b - t_a`) seen through the re-expansion :math:`T` of the bases at
:math:`t_b` in the segment's own bases, :math:`D = (L/t_b)^2 T K_{uu}(L) T^\top`: a stream of equal-length tasks keeps
:math:`K_{uu}(L)`.  :math:`\|\Phi\|_2 \le \sqrt{t_a / t_b}`, so errors of earlier steps are damped, not amplified.

A Matérn or RBF kernel times a periodic one (:func:`.covariances.quasi_periodic_spec`) has the Matérn (RBF) factor's
reach and smoothness, so the same rules take it with its rule length scale, which resolves the highest harmonic.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping

import torch
from torch import Tensor

from .._validation import floating_dtype
from ..hippo import normalized_legendre
from .banded import BandedBackend, Panels, support_span
from .cost import MAX_ENTRIES
from .covariances import CovarianceBackend, StationaryKernelSpec, kernel_parts, resolve_kernel, supported_kernels, unsupported_kernel
from .hippo_backends import QuadratureBackend, SpectralBackend
from .spectral import gauss_legendre, kernel_signature

#: longest step (in length scales) integrated at once: bounds the segment rule of ``D``
MAX_STEP = 128.0
#: Gauss-Legendre nodes per panel of the rules of ``X`` and ``D`` beyond what the basis needs (the kernel's variation)
FORCING_NODES = 24
#: widest span of inputs (in kernel reaches) whose ``Kuf`` one panel rule forms (:func:`local_kuf`)
CHUNK_REACHES = 64.0


class _At:
    """The geometry of a LegS set at time ``t`` with support ``[start, t]``: what the exact backends read."""

    measure = "legs"
    input_dim = 1
    num_panels = None

    def __init__(self, ivars, t: float, start: float):
        self.memory, self.num_inducing, self.num_nodes = ivars.memory, ivars.num_inducing, ivars.num_nodes
        self.t, self.start = float(t), float(start)
        self.backends = ivars.backends
        self.breakpoints = torch.tensor([self.start, self.t], dtype=torch.float64, device=ivars.breakpoints.device)

    def input_support(self) -> tuple[float, float]:
        """``[lower, t]`` of these bases (as :meth:`HiPPOInducingVariables.input_support`)."""
        return support_span(self)


def kernel_scales(kernel) -> tuple[float, float, StationaryKernelSpec]:
    r""":math:`(\ell, R, \mathrm{spec})`: beyond the reach :math:`R` the kernel is below :math:`2 \cdot 10^{-18} \sigma^2`
    (RBF: :math:`e^{-45}`); ``spec`` its registration (:mod:`.covariances`), which has a reach (:meth:`LyapunovBackend.check`).

    :param kernel: a registered 1-D kernel with a reach (optionally in a scale wrapper), one length scale.
    """
    spec, _, lengthscale, _ = kernel_parts(kernel)
    ell = float(lengthscale.detach())
    return ell, spec.known_reach() * ell, spec


def kernel_function(kernel):
    r"""``r -> k(r)`` (RBF: :math:`\sigma^2 \exp(-r^2/(2\ell^2))`) from the kernel's own hyperparameters (differentiable), read once.

    :param kernel: a registered kernel (optionally in a scale wrapper) without a batch shape.
    """
    spec, outputscale, lengthscale, _ = kernel_parts(kernel)
    return lambda r: spec.values(r, outputscale, lengthscale)


def local_kuf(at, kernel, times: Tensor, dtype) -> Tensor:
    r""":math:`K_{uf}[m](x) = \int k(x - s)\, \phi_m(s, t)\, \mathrm{d}s` (thesis eq. (4.9)) at ``times`` (N,) -> (N, M).

    Only ``s`` within the kernel's reach of ``x`` contributes, so the rule is local: Matérn through
    :meth:`BandedBackend.local_kuf` (panels split at the kink), RBF (an analytic kernel) by the same composite
    Gauss-Legendre panels (width :math:`\le 4\ell`; the integrand is analytic, no split), grouped by the
    panel of ``x`` and summed over the panels within the reach.  Inputs more than four reaches
    apart get rules of their own, so the cost is :math:`O(M)` per input even for inputs spread over the
    whole stream (a grid over ``[start, t]``), not :math:`O(M t / \ell)`.

    :param at: the LegS set (or a view of it at time ``t`` with support ``[start, t]``).
    :param kernel: a registered Matérn or RBF kernel with a reach, one length scale.
    :param times: the inputs ``(N,)``, float64.
    :param dtype: the dtype of the result.
    """
    ell, reach, spec = kernel_scales(kernel)
    out = torch.zeros(times.shape[0], at.num_inducing, dtype=dtype, device=times.device)
    order = torch.argsort(times)
    ordered = times[order]
    gaps = (ordered[1:] - ordered[:-1]) > 4 * reach
    # dense inputs over a long stretch (a prediction grid over the whole stream) go in chunks of at most
    # CHUNK_REACHES reaches, so that each chunk's panels stay within the cost guard's budget
    chunk = torch.div(ordered - ordered[:1], CHUNK_REACHES * reach, rounding_mode="floor")
    cuts = gaps | (chunk[1:] != chunk[:-1])
    for rows in torch.tensor_split(order, (cuts.nonzero().squeeze(-1) + 1).tolist()):
        if rows.numel() == 0:
            continue
        if spec.kinked:
            out[rows] = BandedBackend().local_kuf(at, kernel, times[rows], dtype)
        else:
            out[rows] = _analytic_window_kuf(at, kernel, ell, reach, times[rows], dtype)
    return out


def _analytic_window_kuf(at, kernel, ell: float, reach: float, times: Tensor, dtype) -> Tensor:
    """:func:`local_kuf` for an RBF (analytic) kernel with the panels of ``[min(times) - R, max(times) + R]``.

    Nodes in panel ``j ± (band + 1)`` are at least ``band`` panel widths ``>= R`` from an input in
    panel ``j``; the inputs go in blocks of ``band + 1`` consecutive panels, each block one kernel
    matrix and one product with the weighted basis (few Python steps; at most 1.5x the banded work).
    """
    panels = _window_panels(at, ell, (float(times.min()) - reach, float(times.max()) + reach))
    out = torch.zeros(times.shape[0], at.num_inducing, dtype=dtype, device=times.device)
    band = math.ceil(reach / panels.width)
    block = band + 1
    index = torch.floor((times - panels.lower) / panels.width).long()
    weighted, values = panels.weighted.to(dtype), kernel_function(kernel)
    blocks = torch.div(index - panels.first + band, block, rounding_mode="floor")
    for b in torch.unique(blocks).tolist():
        low = panels.first - band + b * block  # the block's panels: low .. low + block - 1
        first, last = max(panels.first, low - band), min(panels.last, low + block + band)
        if first >= last:
            continue
        rows = (blocks == b).nonzero().squeeze(-1)
        nodes = panels.nodes[first - panels.first : last - panels.first].reshape(-1)
        K = values(times[rows, None] - nodes).to(dtype)
        out[rows] = K @ weighted[first - panels.first : last - panels.first].reshape(-1, at.num_inducing)
    return out


def _window_panels(at, ell: float, window: tuple[float, float]) -> Panels:
    """The panels of ``at``'s support meeting ``window``, from the Lyapunov backend's last panels
    when those are of the same set (``t``, ``start``, ``M``) and length scale and cover the window:
    a task's ``Kuf`` at its inputs leaves the panels up to ``t`` that the next step's forcing needs."""
    backend = at.backends.get("lyapunov")
    key = (at.t, at.start, at.num_inducing, ell, str(at.breakpoints.device))
    cached = getattr(backend, "_panels", None)
    if cached is not None and cached[0] == key:
        panels = cached[1]
        first = min(panels.count, max(0, math.floor((window[0] - panels.lower) / panels.width)))
        last = max(first, min(panels.count, math.floor((window[1] - panels.lower) / panels.width) + 1))
        if panels.first <= first and last <= panels.last:
            return panels
    panels = Panels(at, ell / 2, at.breakpoints.device, window=window)
    if isinstance(backend, LyapunovBackend):
        backend._panels = (key, panels)
    return panels


def _weighted_bases(memory, rules: list[tuple[Tensor, float, Tensor]]) -> list[Tensor]:
    """``w ⊙ g(x, t)`` (rows ``x``, ``(N, M)``) for several rules ``(x, t, w)`` in one Legendre recurrence
    (LegS: ``g(x, t) = q(2x/t - 1)``), whose cost at the sizes of a step is mostly per call."""
    z = torch.cat([2 * x / t - 1 for x, t, _ in rules])
    values = normalized_legendre(z, memory.M, torch.cat([w for _, _, w in rules]))
    return list(values.split([x.shape[0] for x, _, _ in rules]))


def _propagator_rules(memory, t_a: float, t_b: float) -> list[tuple[Tensor, float, Tensor]]:
    z, w = gauss_legendre(memory.M + 2, device=memory.A.device)
    x = t_a * (z + 1) / 2
    return [(x, t_a, torch.ones_like(w)), (x * (t_a / t_b), t_a, (t_a / t_b) * w / 2)]  # g(x/t_a), weighted g(x/t_b)


def propagator(memory, t_a: float, t_b: float) -> Tensor:
    r""":math:`\Phi = e^{A \log(t_b/t_a)}` as the exact re-expansion :math:`\phi(x, t_b) = \Phi \phi(x, t_a)`, :math:`x \le t_a`:
    :math:`\Phi = (t_a/t_b) \int_0^1 g(z t_a/t_b)\, g(z)^\top \mathrm{d}z` by an exact Gauss-Legendre rule (module docstring).

    :param memory: the LegS :class:`~gpytorch_hippo.hippo.HiPPO` memory of the set (its ``M`` and device).
    :param t_a: the earlier time :math:`t_a > 0`.
    :param t_b: the later time :math:`t_b \ge t_a`.
    :return: :math:`\Phi`, ``(M, M)`` float64.
    """
    g, weighted = _weighted_bases(memory, _propagator_rules(memory, t_a, t_b))
    return weighted.mT @ g


def _forcing_rule(ivars, kernel, t_a: float, t_b: float) -> tuple[Tensor, float, Tensor]:
    """The nodes, ``t_b`` and weights (with ``1/t_b`` of ``φ``) of :func:`forcing`'s rule in ``x``."""
    ell, reach, _ = kernel_scales(kernel)
    high = min(t_b, t_a + reach)
    count = max(1, math.ceil((high - t_a) / ell))
    half = (high - t_a) / (2 * count)
    angle = [math.acos(min(1.0, max(-1.0, 2 * (t_a + 2 * half * k) / t_b - 1))) for k in range(count + 1)]
    zeros = ivars.num_inducing * max(a - b for a, b in zip(angle, angle[1:]))
    num_nodes = FORCING_NODES + math.ceil(min(zeros, ivars.num_inducing / math.sqrt(max(1.0, t_b / ell))))
    z, w = gauss_legendre(num_nodes, device=ivars.breakpoints.device)
    left = t_a + 2 * half * torch.arange(count, dtype=torch.float64, device=z.device)
    return (left[:, None] + half * (z + 1)).reshape(-1), t_b, (half * w / t_b).repeat(count)


def forcing(ivars, kernel, t_a: float, t_b: float, rule=None, weighted_basis: Tensor | None = None) -> Tensor:
    r""":math:`X = \int_{t_a}^{t_b} K_{uf}(t_a, x)\, \phi(x, t_b)^\top \mathrm{d}x = \operatorname{cov}(c(t_a), d)` (M x M),
    over :math:`x \le t_a + R` only.

    Composite Gauss-Legendre in ``x`` on panels of :math:`\le \ell`: :math:`K_{uf}(t_a, x)` is analytic for :math:`x > t_a`
    (one branch of the kernel) and :math:`\phi(\cdot, t_b)` a degree ``M - 1`` polynomial, :math:`P_{M-1}(\cos \theta)`
    with :math:`\theta = \arccos(2x/t_b - 1)`, so a panel spanning :math:`\Delta\theta` holds about :math:`M \Delta\theta / \pi`
    of its zeros: :math:`M \Delta\theta` nodes (:math:`\pi` per zero) beyond the kernel's, at most the end-panel count
    :math:`M / \sqrt{t_b / \ell}` of :class:`~.banded.Panels` (zeros crowd :math:`t_b`; away from it far fewer nodes are needed).
    ``rule``, ``weighted_basis``: that rule and its weighted :math:`\phi` when the caller formed them already.

    :param ivars: the LegS inducing variables (their ``M``, ``start`` and memory).
    :param kernel: a registered Matérn or RBF kernel with a reach.
    :param t_a: the step's start :math:`t_a`.
    :param t_b: the step's end :math:`t_b > t_a`.
    :param rule: ``(nodes, t_b, weights)`` of the rule in ``x``; ``None`` (default): formed here.
    :param weighted_basis: the rule's weighted :math:`\phi(x, t_b)`, ``(Q, M)``; ``None`` (default): formed here.
    """
    rule = _forcing_rule(ivars, kernel, t_a, t_b) if rule is None else rule
    if weighted_basis is None:
        (weighted_basis,) = _weighted_bases(ivars.memory, [rule])
    return local_kuf(_At(ivars, t_a, ivars.start), kernel, rule[0], torch.float64).mT @ weighted_basis


def segment_covariance(ivars, kernel, t_a: float, t_b: float, lower: float | None = None) -> Tensor:
    r""":math:`D = \operatorname{cov}(\int_{t_a}^{t_b} f\, \phi(\cdot, t_b))` (thesis eq. (4.11) on ``[t_a, t_b]`` alone); ``lower``:
    the support's start that sets the node density (default the variables' ``start``, clipped at 0).

    Matérn: the banded backend on that support.  RBF: :func:`segment_rule` in both variables (the
    integrand is analytic), :math:`D = W^\top (k(\mathrm{nodes}, \mathrm{nodes}) W)` with ``k`` banded: the panel pairs within
    the reach only.

    :param ivars: the LegS inducing variables (their ``M``, ``start``, memory and backends).
    :param kernel: a registered Matérn or RBF kernel with a reach.
    :param t_a: the segment's start.
    :param t_b: the segment's end, :math:`t_b > t_a`; the bases are those at :math:`t_b`.
    :param lower: the support's start for the node density (RBF only); ``None`` (default): ``max(0, start)``.
    :return: :math:`D`, ``(M, M)`` float64.
    """
    ell, reach, spec = kernel_scales(kernel)
    if spec.kinked:
        segment = _At(ivars, t_b, t_a)
        return ivars.backends["banded"].cross(segment, segment, kernel).double()
    nodes, weighted = segment_rule(ivars, t_a, t_b, 4 * ell, lower)
    values = kernel_function(kernel)
    count, p = nodes.shape
    band = math.ceil(reach / ((t_b - t_a) / count))  # nodes of panels further apart are >= R apart: k = 0
    W = weighted.reshape(count * p, ivars.num_inducing)
    KW = torch.empty_like(W)  # k(nodes, nodes) W, one block row of the banded k at a time
    for i in range(count):
        first, last = max(0, i - band), min(count, i + band + 1)
        near = values(nodes[i, :, None] - nodes[first:last].reshape(-1)).double()
        KW[i * p : (i + 1) * p] = near @ W[first * p : last * p]
    D = W.mT @ KW
    return (D + D.mT) / 2


def segment_rule(ivars, t_a: float, t_b: float, width: float, lower: float | None = None) -> tuple[Tensor, Tensor]:
    r"""Composite Gauss-Legendre on ``[t_a, t_b]``: nodes ``(P, p)`` and :math:`w\, \phi(\mathrm{nodes}, t_b)` ``(P, p, M)``.

    Panels of at most ``width``; :math:`p = 24 + M \sqrt{w / (t_b - \mathrm{lower})}` nodes, the density that
    :class:`~.banded.Panels` gives a panel of the whole support (a degree ``M - 1`` polynomial has
    about that many zeros in an end panel), so the segment costs what its panels would within ``[0, t_b]``.

    :param ivars: the LegS inducing variables (their ``M``, ``start`` and memory).
    :param t_a: the segment's start.
    :param t_b: the segment's end, :math:`t_b > t_a`.
    :param width: the widest panel, in the inputs' unit.
    :param lower: the support's start that sets the node density; ``None`` (default): ``max(0, start)``.
    """
    count = max(1, math.ceil((t_b - t_a) / width))
    half = (t_b - t_a) / (2 * count)
    lower = max(0.0, ivars.start) if lower is None else lower
    p = FORCING_NODES + math.ceil(ivars.num_inducing * math.sqrt(2 * half / (t_b - lower)))
    z, w = gauss_legendre(p, device=ivars.breakpoints.device)
    left = t_a + 2 * half * torch.arange(count, dtype=torch.float64, device=z.device)
    nodes = left[:, None] + half * (z + 1)
    weighted = ivars.memory.basis_at_nodes(nodes.reshape(-1), t_b, (half * w / t_b).repeat(count))
    return nodes, weighted.reshape(count, p, -1)


def _reexpansion_rule(memory, t_a: float, t_b: float) -> tuple[Tensor, float, Tensor]:
    z, half_w, _ = _segment_nodes(memory.M, memory.A.device)
    return t_a + (t_b - t_a) * (z + 1) / 2, t_b, half_w


def segment_reexpansion(memory, t_a: float, t_b: float, weighted_basis: Tensor | None = None) -> Tensor:
    r""":math:`T` with :math:`g(x, t_b) = T g(x - t_a, L)` on ``[t_a, t_b]``, :math:`L = t_b - t_a`: the bases at
    :math:`t_b` in the segment's own LegS bases (both degree ``M - 1``;
    :math:`T = (1/L) \int g(x, t_b)\, g(x - t_a, L)^\top \mathrm{d}x` by an exact ``M + 1``-node Gauss-Legendre rule).
    By stationarity the segment's coefficients have the covariance ``Kuu`` of a LegS set at :math:`t = L` started at 0,
    so :math:`D = (L / t_b)^2\, T K_{uu}(L) T^\top`.

    :param memory: the LegS :class:`~gpytorch_hippo.hippo.HiPPO` memory (its ``M`` and device).
    :param t_a: the segment's start.
    :param t_b: the segment's end, :math:`t_b > t_a`.
    :param weighted_basis: the rule's weighted bases at :math:`t_b`, ``(M + 1, M)``; ``None`` (default): formed here.
    :return: :math:`T`, ``(M, M)`` float64.
    """
    if weighted_basis is None:
        (weighted_basis,) = _weighted_bases(memory, [_reexpansion_rule(memory, t_a, t_b)])
    return weighted_basis.mT @ _segment_nodes(memory.M, memory.A.device)[2]


@functools.lru_cache(maxsize=8)
def _segment_nodes(M: int, device) -> tuple[Tensor, Tensor, Tensor]:
    """``(z, w/2, g(z))`` of the ``M + 1``-node Gauss-Legendre rule: the segment's own bases at its nodes do not depend on ``L``."""
    z, w = gauss_legendre(M + 1, device=device)
    return z, w / 2, normalized_legendre(z, M)


def exact_backend(at, kernel, backends: Mapping[str, CovarianceBackend]) -> CovarianceBackend:
    """The exact backend among ``backends`` that starts (or restarts) the carried state: spectral
    (RBF), banded (Matérn), else quadrature.

    :param at: the LegS set (or a view of it at time ``t``).
    :param kernel: the GP's kernel :math:`k`.
    :param backends: the backends by name; ``"spectral"``, ``"banded"`` and ``"quadrature"`` are used.
    """
    for name in ("spectral", "banded"):
        if backends[name].supports(at, kernel):
            return backends[name]
    return backends["quadrature"]


class LyapunovBackend:
    r"""Exact LegS ``Kuu``/``Kuf``/cross covariances with the state :math:`(t, K(t))` carried forward (module docstring).

    The state is kept for one kernel signature (type and hyperparameter values); a changed kernel,
    a :math:`t` behind the state, or no state restarts it with one exact evaluation at :math:`t`
    (:func:`exact_backend`, cost linear in :math:`t/\ell`).  When gradients with respect to the kernel's
    hyperparameters are required, ``Kuu`` and the cross covariance come from that exact backend
    (autograd through it; correct, at its cost); ``Kuf`` is always the local, differentiable rule.
    """

    name = "lyapunov"

    def __init__(self) -> None:
        self._state: tuple[tuple, float, Tensor] | None = None  # (key, t, K(t)) float64, detached
        # (key, t_a, t_b, C(t_a, t_b)) of the last single-piece step
        self._step: tuple[tuple, float, float, Tensor] | None = None
        # (key, L, Kuu(L) of a LegS set started at 0, or None) of the last step
        self._segment_length: tuple[tuple, float, Tensor | None] | None = None
        self._panels: tuple[tuple, Panels] | None = None  # ((t, start, M, ℓ, device), Panels) of the last local Kuf rule

    def __deepcopy__(self, memo) -> LyapunovBackend:
        """A copy sharing the cached tensors: they are never changed in place (each step stores new
        ones), so a snapshot of the inducing variables (one per online task) need not copy them."""
        copied = LyapunovBackend()
        copied.__dict__.update(self.__dict__)
        return copied

    @staticmethod
    def check(ivars, kernel) -> None:
        """Raise a clear error for anything but LegS, 1-D inputs and a supported stationary kernel: registered
        (:mod:`.covariances`) with a reach and either Matérn (banded local rules) or a Gaussian
        spectral density (RBF: analytic, composite Gauss-Legendre local rules).

        :param ivars: the HiPPO inducing variables.
        :param kernel: the GP's kernel :math:`k`.
        """
        if ivars.measure != "legs":
            raise ValueError(f"method='lyapunov' needs measure='legs' (its ODE is LegS's), got measure={ivars.measure!r}")
        if ivars.input_dim != 1:
            raise ValueError(f"method='lyapunov' needs input_dim=1 (time inputs), got input_dim={ivars.input_dim}")
        spec, base, scale = resolve_kernel(kernel)  # without running the constraints' transforms on every call
        if spec is None:
            raise unsupported_kernel("method='lyapunov'", kernel, supported_kernels())
        if spec.reach is None or not (spec.kinked or spec.analytic):
            raise unsupported_kernel(
                "method='lyapunov'",
                kernel,
                f"a Matérn kernel or one with a Gaussian spectral density (RBF), with a reach, or either times a periodic kernel "
                f"({type(base).__name__} is registered as {spec.name!r})",
            )
        if spec.envelope is None and base.raw_lengthscale.numel() != 1:  # a product's factors: checked by its registration
            raise ValueError(f"method='lyapunov': kernel must have one length scale (1-D), got {base.raw_lengthscale.numel()}")
        raw_outputscale = getattr(kernel, "raw_outputscale", None) if scale is not None else None
        if raw_outputscale is not None and raw_outputscale.numel() != 1:
            raise ValueError("batched kernels are not supported by HiPPOInducingVariables (outputscale has batch dims)")

    def supports(self, ivars, kernel) -> bool:
        """Whether :meth:`check` passes.

        :param ivars: the HiPPO inducing variables.
        :param kernel: the GP's kernel :math:`k`.
        """
        try:
            self.check(ivars, kernel)
        except (TypeError, ValueError):
            return False
        return True

    @staticmethod
    def _differentiable(kernel) -> bool:
        return torch.is_grad_enabled() and any(p.requires_grad for p in kernel.parameters())

    @staticmethod
    def _key(ivars, kernel) -> tuple:
        return kernel_signature(kernel) + (ivars.num_inducing, ivars.start, str(ivars.breakpoints.device))

    def _step_once(self, ivars, kernel, key: tuple, t_a: float, K_a: Tensor, t_b: float) -> tuple[Tensor, Tensor]:
        """``(K(t_b), C(t_a, t_b))`` from ``K(t_a)`` (module docstring): with ``C = K(t_a) Φᵀ + X``,
        ``K(t_b) = sym(Φ (C + X)) + D`` (``sym(Y) = (Y + Yᵀ)/2``; ``Φ K(t_a) Φᵀ`` is symmetric, so this is
        ``Φ K Φᵀ + Φ X + Xᵀ Φᵀ + D`` with two products by ``Φ`` instead of three); the bases of the
        propagator, the forcing and the segment's re-expansion in one recurrence."""
        memory, segment_kuu = ivars.memory, self._segment_kuu(ivars, kernel, key, t_a, t_b)
        rules = _propagator_rules(memory, t_a, t_b) + [_forcing_rule(ivars, kernel, t_a, t_b)]
        if segment_kuu is not None:
            rules.append(_reexpansion_rule(memory, t_a, t_b))
        bases = _weighted_bases(memory, rules)
        Phi = bases[1].mT @ bases[0]
        X = forcing(ivars, kernel, t_a, t_b, rules[2], bases[2])
        if segment_kuu is None:
            D = segment_covariance(ivars, kernel, t_a, t_b)
        else:
            T = segment_reexpansion(memory, t_a, t_b, bases[3])
            D = ((t_b - t_a) / t_b) ** 2 * (T @ segment_kuu @ T.mT)
        C = K_a @ Phi.mT + X
        K_b = Phi @ (C + X) + D
        return (K_b + K_b.mT) / 2, C

    def _segment_kuu(self, ivars, kernel, key: tuple, t_a: float, t_b: float) -> Tensor | None:
        """``Kuu(L)`` of a LegS set started at 0 for the step's length ``L``, or ``None``: the step's
        ``D`` is then integrated directly.  A stream of tasks of one length (to a few ulps of ``t_b``,
        the precision of the times themselves) keeps it from the second such step on and forms
        ``D = (L/t_b)² T Kuu(L) Tᵀ`` (:func:`segment_reexpansion`, ``O(M³)``) instead of the segment's quadrature."""
        length = t_b - t_a
        seen = self._segment_length
        if seen is None or seen[0] != key or abs(seen[1] - length) > 8 * torch.finfo(torch.float64).eps * t_b:
            self._segment_length = (key, length, None)
            return None
        if seen[2] is None:
            self._segment_length = seen = (key, seen[1], segment_covariance(ivars, kernel, 0.0, seen[1], lower=0.0))
        return seen[2]

    def state(self, ivars, kernel, t: float) -> Tensor:
        """``K(t)`` (float64, no gradient), integrated forward from the carried state.

        :param ivars: the LegS inducing variables.
        :param kernel: the GP's kernel (the state is kept for one kernel signature).
        :param t: the time of ``K(t)``; a ``t`` behind the state restarts it.
        :return: ``K(t)``, ``(M, M)``, without jitter.
        """
        key = self._key(ivars, kernel)
        if self._state is not None and self._state[0] == key and self._state[1] == t:
            return self._state[2]
        with torch.no_grad():
            ell, reach, _ = kernel_scales(kernel)
            if self._state is not None and self._state[0] == key and self._state[1] <= t:
                pieces = math.ceil((t - self._state[1]) / (MAX_STEP * ell))
                # each piece forms its forcing and segment rules (~ (R/ℓ + 32) panels of 24 + M nodes, x M):
                # a jump too long to carry in bounded time restarts from the exact backend (itself guarded)
                if pieces * (reach / ell + MAX_STEP / 4) * (FORCING_NODES + ivars.num_inducing) * ivars.num_inducing > MAX_ENTRIES:
                    self._state = None
            if self._state is None or self._state[0] != key or self._state[1] > t:
                if t - ivars.start <= MAX_STEP * ell:
                    # a support of at most MAX_STEP length scales (a stream's first task): the segment
                    # rule on [start, t], exact and cheaper than the spectral or banded backend; by
                    # stationarity it is also the Kuu(L) that equal-length steps after it keep
                    K = segment_covariance(ivars, kernel, ivars.start, t, lower=ivars.start)
                    self._segment_length = (key, t - ivars.start, K)
                else:
                    at = _At(ivars, t, ivars.start)
                    # fresh backends: their caches (spectral transforms, linear in t) would only be
                    # copied along with every snapshot of the inducing variables
                    fresh: dict[str, CovarianceBackend] = {
                        "spectral": SpectralBackend(),
                        "banded": BandedBackend(),
                        "quadrature": QuadratureBackend(),
                    }
                    K = exact_backend(at, kernel, fresh).cross(at, at, kernel).double()
            else:
                t_now, K = self._state[1], self._state[2]
                pieces = max(1, math.ceil((t - t_now) / (MAX_STEP * ell)))
                for k in range(1, pieces + 1):
                    t_next = t if k == pieces else t_now + (t - t_now) * k / pieces
                    K_next, C = self._step_once(ivars, kernel, key, t_now, K, t_next)
                    self._step = (key, t_now, t_next, C) if pieces == 1 else None
                    t_now, K = t_next, K_next
        self._state = (key, t, K)
        return K

    def _earlier(self, lo, kernel) -> Tensor:
        """``K(t_lo)`` of the earlier set: its own carried state (a snapshot keeps its backend's cache)."""
        backend = lo.backends.get("lyapunov") if hasattr(lo, "backends") else None
        return (backend if isinstance(backend, LyapunovBackend) else LyapunovBackend()).state(lo, kernel, lo.t)

    def cross(self, a, b, kernel) -> Tensor:
        r""":math:`\operatorname{cov}(u_a, u_b)` without jitter (``M x M``), in the kernel's dtype; ``Kuu`` when ``b`` is ``a`` or
        at the same ``t``.

        :param a: the first LegS set.
        :param b: the second LegS set, with the same ``num_inducing`` and ``start``, or ``a`` itself.
        :param kernel: the GP's kernel :math:`k`.
        """
        for ivars in (a, b):
            self.check(ivars, kernel)
        if a.num_inducing != b.num_inducing or a.start != b.start:
            raise ValueError("method='lyapunov': cross-covariance needs two sets with the same num_inducing and start")
        dtype = floating_dtype(kernel)
        if self._differentiable(kernel):
            return exact_backend(_At(a, a.t, a.start), kernel, a.backends).cross(a, b, kernel).to(dtype)
        if b is a or a.t == b.t:
            return self.state(a, kernel, a.t).to(dtype)
        lo, hi = (a, b) if a.t < b.t else (b, a)
        key = self._key(lo, kernel)
        if self._step is not None and self._step[:3] == (key, lo.t, hi.t):
            C = self._step[3]
        else:
            with torch.no_grad():
                X, Phi = forcing(lo, kernel, lo.t, hi.t), propagator(lo.memory, lo.t, hi.t)
                C = self._earlier(lo, kernel) @ Phi.mT + X  # cov(u_lo, u_hi)
        return (C if lo is a else C.mT).to(dtype)

    def Kuf(self, ivars, kernel, x: Tensor) -> Tensor:
        r""":math:`\operatorname{cov}(u, f(x))` by the local rule (:func:`local_kuf`): ``(*batch, M, N)`` in ``x``'s dtype.

        :param ivars: the LegS inducing variables.
        :param kernel: the GP's kernel :math:`k`.
        :param x: inputs ``(*batch, N, 1)``.
        """
        self.check(ivars, kernel)
        times = x[..., 0].double()
        flat = local_kuf(_At(ivars, ivars.t, ivars.start), kernel, times.reshape(-1), x.dtype)
        return flat.reshape(*times.shape, ivars.num_inducing).mT
