r"""The Lyapunov backend for ``S`` streams at once: every stream's LegS covariances carried forward by one batched step.

Stream :math:`s` (clock :math:`t_s`, RBF kernel :math:`\sigma_s^2 \exp(-r^2/(2\ell_s^2))`) takes :mod:`.lyapunov`'s exact step
:math:`t_a \to t_b`:

.. math::

    C(t_a, t_b) = K(t_a) \Phi^\top + X, \qquad K(t_b) = \operatorname{sym}(\Phi (C + X)) + D,

with :math:`\Phi` the re-expansion of the bases, :math:`X = \int_{t_a}^{t_b} K_{uf}(t_a, x)\, \phi(x, t_b)^\top \mathrm{d}x`
(only :math:`x` within the kernel's reach :math:`R = 9.5 \ell` of :math:`t_a` contributes) and :math:`D` the covariance of the
new segment's coefficients. Every integral is a composite Gauss-Legendre rule on a per-stream interval with the same number of
panels and nodes for all streams (the most any stream needs: panels of at most :math:`6\ell`, :math:`16 + M \sqrt{w/t}` nodes
per panel of width :math:`w`), so a step for ``S`` streams is a handful of batched products whatever each stream's clock,
length scale and output scale. A stream whose clock does not move steps by the identity (:math:`\Phi = I`, :math:`X = D = 0`).

A segment longer than :data:`PIECE` length scales is carried in pieces (:math:`D` of :math:`[t_a, t_b]` is the state of a set
started at :math:`t_a`), which also restarts a stream from nothing (:math:`K = 0` at ``start``). RBF kernels without gradients
with respect to their hyperparameters: the integrands are analytic, so one rule per window serves every input in it.
Other kernels, and fits that need those gradients, use the per-stream backends.
"""

from __future__ import annotations

import math

import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from .._validation import floating_dtype
from ..hippo import normalized_legendre
from .batched import stream_clocks
from .covariances import RBF_CUTOFF, resolve_kernel
from .spectral import gauss_legendre

#: longest segment (in length scales) whose ``D`` is one double integral; longer ones go in pieces
PIECE = 16.0
#: widest panel, in length scales, of the rules over a kernel's window
PANEL = 6.0
#: Gauss-Legendre nodes per panel for the kernel's variation, beyond those the basis needs (RBF on panels of 6ℓ: round-off
#: with 12 or more, against the exact spectral covariances for M = 32 and 64, ℓ from 0.3 to 3 and t from 1 to 32)
KERNEL_NODES = 16
#: most values (streams x rows x nodes) formed at once: larger batches go in chunks of streams
CHUNK_ENTRIES = 2**22
#: a window of inputs wider than this many reaches is left to the per-stream rule, which splits it
MAX_WINDOW_REACHES = 8.0


def rbf_hyperparameters(kernel: Kernel, size: int) -> tuple[Tensor, Tensor] | None:
    r""":math:`(\ell, \sigma^2)`, each ``(S,)`` float64, of a kernel registered with a Gaussian spectral density (RBF; optionally in a
    scale wrapper) that is shared or has ``batch_shape=(S,)`` and one length scale; ``None`` for any other kernel (the
    per-stream backends take it).

    :param kernel: the GP's kernel (detached values are read).
    :param size: the number of streams ``S``.
    """
    spec, base, outputscale = resolve_kernel(kernel)
    if spec is None or not spec.gaussian or spec.reach != RBF_CUTOFF:
        return None
    if not {tuple(base.batch_shape), tuple(getattr(kernel, "batch_shape", ()))} <= {(), (size,)}:
        return None
    ell = base.lengthscale.detach().double()
    if ell.shape[-1] != 1:
        return None
    scale = ell.new_ones(1) if outputscale is None else outputscale(kernel).detach().double()
    return ell.reshape(-1).expand(size), scale.reshape(-1).expand(size)


def _legendre(z: Tensor, M: int, scale: Tensor) -> Tensor:
    """``scale ⊙ q_m(z)``, ``(*z.shape, M)`` (normalised Legendre polynomials)."""
    return normalized_legendre(z.contiguous(), M, scale.contiguous())


def composite_rule(lower: Tensor, upper: Tensor, panels: int, nodes: int) -> tuple[Tensor, Tensor]:
    """``panels`` equal panels of ``nodes`` Gauss-Legendre nodes on each ``[lower_s, upper_s]`` -> nodes, weights ``(S, Q)``
    (an empty interval gets zero weights).

    :param lower: the intervals' starts, ``(S,)``.
    :param upper: the intervals' ends, ``(S,)`` (``upper < lower``: an empty interval).
    :param panels: the number of equal panels per interval, a positive int.
    :param nodes: Gauss-Legendre nodes per panel, an int ``>= 2``; ``Q = panels * nodes``.
    """
    z, w = gauss_legendre(nodes, device=lower.device)
    fraction = ((torch.arange(panels, dtype=z.dtype, device=z.device)[:, None] + (z + 1) / 2) / panels).reshape(-1)
    width = (upper - lower).clamp_min(0)
    return lower[:, None] + width[:, None] * fraction, (width / (2 * panels))[:, None] * w.repeat(panels)


def _counts(length: Tensor, ell: Tensor, t: Tensor, M: int, panel: float) -> tuple[int, int]:
    """Panels of at most ``panel`` length scales over ``length``, and nodes per panel for the kernel plus the zeros that
    a degree ``M - 1`` polynomial on ``[0, t]`` can have in a panel (``<= M sqrt(w / t)``), the most over the streams."""
    panels = max(1, math.ceil(float((length / (panel * ell)).max())))
    zeros = float((M * ((length / panels) / t.clamp_min(1e-300)).clamp(max=1.0).sqrt()).max())
    return panels, KERNEL_NODES + max(1, math.ceil(zeros))


def _chunks(size: int, entries: int):
    """Slices of at most ``CHUNK_ENTRIES // entries`` streams."""
    step = max(1, CHUNK_ENTRIES // max(1, entries))
    return [slice(i, min(size, i + step)) for i in range(0, size, step)]


class BatchedLegS:
    """:math:`K(t)`, :math:`K_{uf}` and :math:`C(t_a, t_b)` of ``S`` LegS streams under per-stream RBF hyperparameters (module docstring).

    The carried state, :math:`(t, K(t))` for every stream, is kept with the hyperparameters and starts it was computed for
    (the last few states); each stream steps from the latest of them at or before its clock (e.g. a stored task's clock, kept
    by a stream without points), and restarts from nothing where none is (other hyperparameters or start, an earlier clock).

    :param num_inducing: ``M``, the number of LegS basis functions of every stream.
    """

    def __init__(self, num_inducing: int):
        self.M = num_inducing
        self._states: list[dict] = []  # the last few states (newest last)
        self._steps: list[dict] = []  # C(t_a, t_b) of the last steps

    # ------------------------------------------------------------------ the integrals
    @staticmethod
    def kernel(a: Tensor, b: Tensor, ell: Tensor) -> Tensor:
        r""":math:`\exp(-(a_i - b_j)^2/(2\ell^2))` ``(S, I, J)`` for ``a`` ``(S, I)``, ``b`` ``(S, J)``, :math:`\ell` ``(S,)``
        (formed in place; the output scale :math:`\sigma^2` is applied by the caller to a smaller factor).

        :param a: the first points, ``(S, I)``.
        :param b: the second points, ``(S, J)``.
        :param ell: the length scales :math:`\ell_s`, ``(S,)``.
        """
        scale = (0.5**0.5 / ell)[:, None]
        values = (a * scale)[:, :, None] - (b * scale)[:, None, :]
        return values.square_().neg_().exp_()

    def kuf(self, x: Tensor, t: Tensor, lower: Tensor, upper: Tensor, ell: Tensor, scale: Tensor) -> Tensor:
        r""":math:`\int_{\mathrm{lower}}^{\mathrm{upper}} k(x - u)\, \phi(u, t)\, \mathrm{d}u` for inputs ``x`` ``(S, N)`` -> ``(S, N, M)``
        (:math:`\phi(u, t) = q(2u/t - 1)/t`), over the window of ``u`` within :math:`R` of the stream's inputs; exactly zero
        for inputs further than :math:`R` from ``[lower, upper]``
        (as :meth:`~.hippo_variables.HiPPOInducingVariables.Kuf`).

        :param x: the inputs, ``(S, N)`` float64.
        :param t: the bases' time :math:`t_s`, ``(S,)`` (a set at ``t = 0`` has an empty support).
        :param lower: the start of each stream's integration range, ``(S,)``.
        :param upper: the end of each stream's integration range, ``(S,)`` (``t`` for the whole support).
        :param ell: the length scales :math:`\ell_s`, ``(S,)``.
        :param scale: the output scales :math:`\sigma_s^2`, ``(S,)``.
        """
        reach = RBF_CUTOFF * ell
        t = torch.where(t > 0, t, 1.0)  # a set at t = 0 has an empty support: zero weights, whatever t's value
        low = torch.maximum(lower, x.min(-1).values - reach)
        high = torch.maximum(low, torch.minimum(upper, x.max(-1).values + reach))
        panels, nodes = _counts(high - low, ell, t, self.M, PANEL)
        out = x.new_empty(*x.shape, self.M)
        for part in _chunks(x.shape[0], x.shape[1] * panels * nodes + panels * nodes * self.M):
            u, w = composite_rule(low[part], high[part], panels, nodes)
            basis = _legendre(2 * u / t[part, None] - 1, self.M, w * (scale[part] / t[part])[:, None])
            out[part] = self.kernel(x[part], u, ell[part]) @ basis
        far = (x < (lower - reach)[:, None]) | (x > (upper + reach)[:, None])
        return out.masked_fill_(far[..., None], 0.0)

    def propagator(self, t_a: Tensor, t_b: Tensor) -> Tensor:
        r""":math:`\Phi = e^{A \log(t_b/t_a)}` ``(S, M, M)``: :math:`\phi(x, t_b) = \Phi \phi(x, t_a)` for :math:`x \le t_a`, by the exact
        ``M + 2``-node rule of :func:`.lyapunov.propagator` (:math:`\Phi = I` where :math:`t_a = t_b`, ``0`` where :math:`t_a = 0`).

        :param t_a: the earlier times, ``(S,)``.
        :param t_b: the later times, ``(S,)``, positive and ``>= t_a``.
        """
        z, w = gauss_legendre(self.M + 2, device=t_a.device)
        ratio = (t_a / t_b)[:, None]
        moved = _legendre(ratio * (z + 1) - 1, self.M, ratio * w / 2)
        return moved.mT @ _legendre(z, self.M, torch.ones_like(z))

    def forcing(self, t_a, t_b, lower, ell, scale) -> Tensor:
        r""":math:`X = \int_{t_a}^{t_b} K_{uf}(t_a, x)\, \phi(x, t_b)^\top \mathrm{d}x` ``(S, M, M)`` over :math:`x \le t_a + R`.

        :param t_a: the steps' starts, ``(S,)``.
        :param t_b: the steps' ends, ``(S,)``, ``>= t_a``.
        :param lower: the start of each stream's support, ``(S,)``.
        :param ell: the length scales :math:`\ell_s`, ``(S,)``.
        :param scale: the output scales :math:`\sigma_s^2`, ``(S,)``.
        """
        high = torch.minimum(t_b, t_a + RBF_CUTOFF * ell)
        panels, nodes = _counts(high - t_a, ell, t_b, self.M, PANEL)
        x, w = composite_rule(t_a, high, panels, nodes)
        kuf = self.kuf(x, t_a, lower, t_a, ell, scale)
        return kuf.mT @ _legendre(2 * x / t_b[:, None] - 1, self.M, w / t_b[:, None])

    def segment(self, t_a, t_b, ell, scale) -> Tensor:
        r""":math:`D = \operatorname{cov}(\int_{t_a}^{t_b} f\, \phi(\cdot, t_b))` ``(S, M, M)``: one double integral over segments of at
        most :data:`PIECE` length scales, the carried recursion of a set started at ``t_a`` over longer ones.

        :param t_a: the segments' starts, ``(S,)``.
        :param t_b: the segments' ends, ``(S,)``, ``>= t_a``.
        :param ell: the length scales :math:`\ell_s`, ``(S,)``.
        :param scale: the output scales :math:`\sigma_s^2`, ``(S,)``.
        """
        pieces = max(1, math.ceil(float(((t_b - t_a) / (PIECE * ell)).max())))
        if pieces == 1:
            panels, nodes = _counts(t_b - t_a, ell, t_b, self.M, PANEL)
            out = t_a.new_empty(t_a.shape[0], self.M, self.M)
            for part in _chunks(t_a.shape[0], (panels * nodes) ** 2 + panels * nodes * self.M):
                u, w = composite_rule(t_a[part], t_b[part], panels, nodes)
                basis = _legendre(2 * u / t_b[part, None] - 1, self.M, w / t_b[part, None])
                D = scale[part, None, None] * (basis.mT @ (self.kernel(u, u, ell[part]) @ basis))
                out[part] = (D + D.mT) / 2
            return out
        K = t_a.new_zeros(t_a.shape[0], self.M, self.M)
        now = t_a
        for k in range(1, pieces + 1):
            later = t_b if k == pieces else t_a + (t_b - t_a) * (k / pieces)
            K, _ = self.step(now, K, later, t_a, ell, scale)
            now = later
        return K

    def step(self, t_a, K_a, t_b, lower, ell, scale) -> tuple[Tensor, Tensor]:
        r"""``(K(t_b), C(t_a, t_b))`` from ``K(t_a)`` for sets whose support starts at ``lower`` (module docstring).
        Streams that step by the same ratio :math:`t_b/t_a` (e.g. a fleet on one clock) share :math:`\Phi`: one product for all.

        :param t_a: the steps' starts, ``(S,)``.
        :param K_a: the carried states :math:`K(t_a)`, ``(S, M, M)``.
        :param t_b: the steps' ends, ``(S,)``, ``>= t_a``.
        :param lower: the start of each stream's support, ``(S,)``.
        :param ell: the length scales :math:`\ell_s`, ``(S,)``.
        :param scale: the output scales :math:`\sigma_s^2`, ``(S,)``.
        """
        X = self.forcing(t_a, t_b, lower, ell, scale)
        ratio = t_a / t_b
        if bool((ratio == ratio[0]).all()):
            Phi_T = self.propagator(t_a[:1], t_b[:1])[0].mT
            C = (K_a.reshape(-1, self.M) @ Phi_T).view_as(K_a) + X
            K_b = ((C + X).mT.reshape(-1, self.M) @ Phi_T).view_as(K_a)  # (Φ (C + X))ᵀ, symmetrised below
        else:
            Phi = self.propagator(t_a, t_b)
            C = K_a @ Phi.mT + X
            K_b = Phi @ (C + X)
        return (K_b + K_b.mT) / 2 + self.segment(t_a, t_b, ell, scale), C

    # ------------------------------------------------------------------ the carried state
    def state(self, t: Tensor, lower: Tensor, ell: Tensor, scale: Tensor) -> Tensor:
        r"""``K(t)`` ``(S, M, M)``, carried forward stream by stream from the latest remembered state not ahead of it (module docstring).

        :param t: the streams' clocks, ``(S,)``.
        :param lower: the start of each stream's support, ``(S,)``.
        :param ell: the length scales :math:`\ell_s`, ``(S,)``.
        :param scale: the output scales :math:`\sigma_s^2`, ``(S,)``.
        """
        for state in reversed(self._states):
            if _same(state, t=t, lower=lower, ell=ell, scale=scale):
                return state["K"]
        t_a, K_a = lower.clone(), t.new_zeros(t.shape[0], self.M, self.M)
        for base in self._states:  # each stream from the latest remembered state of its own that is not ahead of t
            if base["t"].shape == t.shape:
                valid = (base["lower"] == lower) & (base["ell"] == ell) & (base["scale"] == scale) & (t_a <= base["t"]) & (base["t"] <= t)
                t_a = torch.where(valid, base["t"], t_a)
                K_a = torch.where(valid[:, None, None], base["K"], K_a)
        K, C = self.step(t_a, K_a, t, lower, ell, scale)
        self._remember(self._states, {"t": t, "lower": lower, "ell": ell, "scale": scale, "K": K})
        self._remember(self._steps, {"t_a": t_a, "t_b": t, "lower": lower, "ell": ell, "scale": scale, "K_a": K_a, "C": C})
        return K

    def cross(self, t_a: Tensor, t_b: Tensor, lower, ell, scale) -> Tensor:
        r""":math:`C(t_a, t_b) = \operatorname{cov}(c(t_a), c(t_b))` for :math:`t_a \le t_b` stream by stream
        (:math:`K(t_a)` where they are equal).

        :param t_a: the earlier clocks, ``(S,)``.
        :param t_b: the later clocks, ``(S,)``, ``>= t_a`` (else ``ValueError``).
        :param lower: the start of each stream's support, ``(S,)``.
        :param ell: the length scales :math:`\ell_s`, ``(S,)``.
        :param scale: the output scales :math:`\sigma_s^2`, ``(S,)``.
        """
        if bool((t_a > t_b).any()):
            raise ValueError("C(t_a, t_b) needs t_a <= t_b for every stream")
        for step in reversed(self._steps):
            if _same(step, t_a=t_a, t_b=t_b, lower=lower, ell=ell, scale=scale):
                return step["C"]
        K_a = self.state(t_a, lower, ell, scale)
        return K_a @ self.propagator(t_a, t_b).mT + self.forcing(t_a, t_b, lower, ell, scale)

    @staticmethod
    def _remember(history: list, entry: dict, keep: int = 3) -> None:
        history.append(entry)
        del history[:-keep]


def _same(entry: dict, **values: Tensor) -> bool:
    return all(entry[k].shape == v.shape and torch.equal(entry[k], v) for k, v in values.items())


class LyapunovStreams:
    r"""What :class:`~.batched.BatchedInducingVariables` asks of a batched engine, for ``S`` HiPPO-LegS sets with
    ``method="lyapunov"``: ``Kuu``, ``Kuf`` and ``Kuu_cross`` of all streams from one :class:`BatchedLegS`, with the sets'
    jitter (:math:`\varepsilon \operatorname{mean}(\operatorname{diag} K_{uu})` per stream), or ``None`` where it does not apply (the
    streams' own backends then answer).

    :param num_inducing: ``M``, the number of LegS basis functions of every stream.
    """

    def __init__(self, num_inducing: int):
        self.legs = BatchedLegS(num_inducing)

    def _inputs(self, streams, kernel: Kernel) -> tuple[Tensor, Tensor, Tensor, Tensor] | None:
        """``(t, lower, ℓ, σ²)`` ``(S,)`` each, or ``None``: a kernel other than RBF, or gradients needed."""
        if torch.is_grad_enabled() and any(p.requires_grad for p in kernel.parameters()):
            return None
        if any(s.method != "lyapunov" for s in streams):  # LegS with 1-D inputs: checked by the sets themselves
            return None
        hyperparameters = rbf_hyperparameters(kernel, len(streams))
        if hyperparameters is None or not all(bool(torch.isfinite(v).all() and (v > 0).all()) for v in hyperparameters):
            return None  # the streams' own backends name the problem
        device = hyperparameters[0].device  # the step runs where the kernel is
        starts = torch.tensor([max(0.0, s.start) for s in streams], dtype=torch.float64, device=device)
        return stream_clocks(streams).to(device), starts, *hyperparameters

    def jitter_scale(self, streams, covariance: Tensor) -> Tensor:
        """``(S,)``: the scale of each stream's jitter (``mean(diag)`` of its covariance, or ``1`` for a given jitter).

        :param streams: the ``S`` single-stream HiPPO sets (their ``jitter`` is read).
        :param covariance: the streams' covariances, ``(S, M, M)``.
        """
        if streams[0].jitter is not None:
            return covariance.new_ones(covariance.shape[0])
        diagonal = torch.diagonal(covariance.detach(), dim1=-2, dim2=-1).mean(-1)
        return diagonal.clamp_min(torch.finfo(covariance.dtype).tiny)

    def jitter_variance(self, streams, kuu: Tensor) -> Tensor:
        """``(S, M)``: the variance of the jitter that ``Kuu`` adds to each stream.

        :param streams: the ``S`` single-stream HiPPO sets.
        :param kuu: their ``Kuu``, ``(S, M, M)`` (jitter included).
        """
        variance = streams[0].jitter_value(kuu.dtype) * self.jitter_scale(streams, kuu)
        return variance[:, None].expand(kuu.shape[:-1])

    def Kuu(self, streams, kernel: Kernel) -> Tensor | None:
        """``(S, M, M)``: every stream's ``K(t)`` plus its jitter, or ``None`` where the batched rule does not apply.

        :param streams: the ``S`` single-stream HiPPO sets.
        :param kernel: the GP's kernel, shared or with ``batch_shape=(S,)``.
        """
        inputs = self._inputs(streams, kernel)
        if inputs is None:
            return None
        K = self.legs.state(*inputs).to(floating_dtype(kernel))
        jitter = streams[0].jitter_value(K.dtype) * self.jitter_scale(streams, K)
        return K + jitter[:, None, None] * torch.eye(K.shape[-1], dtype=K.dtype, device=K.device)

    def Kuf(self, streams, kernel: Kernel, x: Tensor) -> Tensor | None:
        """``(S, M, N)`` at inputs ``x`` ``(S, N, 1)``; ``None`` for inputs spread over more than
        :data:`MAX_WINDOW_REACHES` reaches (the per-stream rule splits those into windows of their own).

        :param streams: the ``S`` single-stream HiPPO sets.
        :param kernel: the GP's kernel, shared or with ``batch_shape=(S,)``.
        :param x: inputs ``(S, N, 1)``, stream ``s``'s at ``x[s]``.
        """
        inputs = self._inputs(streams, kernel)
        if inputs is None or x.shape[-1] != 1 or x.shape[-2] == 0:
            return None
        t, lower, ell, scale = inputs
        times = x[..., 0].detach().to(device=t.device, dtype=torch.float64)
        if bool(((times.max(-1).values - times.min(-1).values) > MAX_WINDOW_REACHES * RBF_CUTOFF * ell).any()):
            return None
        return self.legs.kuf(times, t, lower, t, ell, scale).mT.to(device=x.device, dtype=floating_dtype(kernel))

    def Kuu_cross(self, streams, others, kernel: Kernel) -> Tensor | None:
        r""":math:`\operatorname{cov}(u_s, u'_s)` ``(S, M, M)`` with another batch of such sets (e.g. the stored task's), jitter on the
        streams whose two sets are the same (the same clock).

        :param streams: the ``S`` single-stream HiPPO sets.
        :param others: the other batch's ``S`` sets (other starts or ``M``: ``None``).
        :param kernel: the GP's kernel, shared or with ``batch_shape=(S,)``.
        """
        inputs = self._inputs(streams, kernel)
        if inputs is None or len(others) != len(streams):
            return None
        other_inputs = self._inputs(others, kernel)
        if other_inputs is None:
            return None
        t, lower, ell, scale = inputs
        t_other, lower_other, _, _ = other_inputs
        if not torch.equal(lower, lower_other) or any(a.num_inducing != b.num_inducing for a, b in zip(streams, others)):
            return None
        C = self.legs.cross(torch.minimum(t, t_other), torch.maximum(t, t_other), lower, ell, scale).to(floating_dtype(kernel))
        later = t > t_other
        cross = C.mT if bool(later.all()) else torch.where(later[:, None, None], C.mT, C) if bool(later.any()) else C
        same = t == t_other  # the same variables (a stored copy of the same sets) where the clocks agree
        if not bool(same.any()):
            return cross
        jitter = streams[0].jitter_value(cross.dtype) * self.jitter_scale(streams, cross) * same.to(cross.dtype)
        return cross + jitter[:, None, None] * torch.eye(cross.shape[-1], dtype=cross.dtype, device=cross.device)

    def unshared_jitter(self, streams, others, kuu: Tensor) -> Tensor | None:
        """``(S, M)``: the jitter variances of ``streams`` that ``others`` do not share (all of a stream's, unless its two
        sets have the same clock).

        :param streams: the ``S`` single-stream HiPPO sets.
        :param others: the other batch's ``S`` sets.
        :param kuu: the ``Kuu`` of ``streams``, ``(S, M, M)``.
        """
        t_other = self._inputs_without_kernel(others)
        if t_other is None:
            return None
        moved = (stream_clocks(streams) != t_other).to(device=kuu.device, dtype=kuu.dtype)
        return self.jitter_variance(streams, kuu) * moved[:, None]

    @staticmethod
    def _inputs_without_kernel(streams) -> Tensor | None:
        if any(getattr(s, "method", None) != "lyapunov" for s in streams):
            return None
        return stream_clocks(streams)
