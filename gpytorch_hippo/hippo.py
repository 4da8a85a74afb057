r"""HiPPO recurrent memory (thesis §2.1.2 and Appendix A).

A memory state :math:`c(t) \in \mathbb{R}^M` holds the coefficients of the optimal projection of a signal's
history onto time-varying bases :math:`g_m^{(t)}` orthonormal under a measure :math:`\omega^{(t)}`
(thesis eqs. (2.6), (2.7)).  It evolves by the linear ODE of thesis eq. (2.10),

.. math::

    c_m(t) = \int_{-\infty}^{t} f(x)\, g_m^{(t)}(x)\, \omega^{(t)}(x)\, \mathrm{d}x,
    \qquad
    \frac{\mathrm{d}}{\mathrm{d}t} c(t) = A(t)\, c(t) + B(t)\, f(t),

which is discretised here into the recurrence :math:`c_k = \bar A_k c_{k-1} + P_k f_{k-1} + Q_k f_k`.
For LegS (thesis eqs. (2.14), (2.15)),

.. math::

    A(t) = \frac{A}{t}, \quad
    [A]_{mk} = \begin{cases} -\sqrt{(2m+1)(2k+1)} & m > k \\ -(m+1) & m = k \\ 0 & m < k \end{cases},
    \qquad B(t) = \frac{B}{t}, \quad [B]_m = \sqrt{2m+1}.

Measures (``transition`` returns the matrices of the ODE exactly as written below):

* ``"legs"``  uniform on :math:`[0, t]`, scaled Legendre; :math:`A(t) = A/t`, :math:`B(t) = B/t`
  (thesis eqs. (2.14), (2.15)).  Keeps the whole history.
* ``"legt"``  uniform on the window :math:`[t - \theta, t]`, Legendre; :math:`A = -A_{\mathrm{legt}}/\theta`,
  :math:`B = \sqrt{2m+1}/\theta` (App. A).  The ODE replaces the value leaving the window,
  :math:`f(t - \theta)`, by its reconstruction from the memory, so it only approximates the exact
  window projection.
* ``"lagt"``  exponential decay :math:`e^{-(t-x)/\theta}/\theta` on :math:`(-\infty, t]`, Laguerre basis
  :math:`L_m((t-x)/\theta)`; :math:`A = -[m \ge k]/\theta`, :math:`B = 1/\theta` (App. A, which is the case
  :math:`\theta = 1`).  Exact: no approximation in the ODE.
* ``"fout"``  uniform on the window, Fourier basis.  The thesis writes it with complex
  :math:`e^{2\pi i m (t-x)/\theta}`.  We use the equivalent real orthonormal basis
  :math:`[1, \sqrt{2}\cos(2\pi s/\theta), \sqrt{2}\sin(2\pi s/\theta), \sqrt{2}\cos(4\pi s/\theta), \dots]` with
  :math:`s = t - x`.  The thesis's complex coefficient :math:`z_m` is :math:`(c_{2m-1} + i c_{2m}) / \sqrt{2}`
  (:math:`z_0 = c_0`, :math:`z_{-m} = \overline{z_m}` for a real signal), and the real ODE is exactly the
  thesis's :math:`A`, :math:`B` on the frequencies :math:`m = -K, \dots, K`; :math:`M = 2K + 1` must therefore be odd.
  (Truncating to :math:`m = 0, \dots, M-1` instead, as written in App. A, would reconstruct the value leaving
  the window by a complex number.)  Like LegT, the ODE approximates :math:`f(t - \theta)`.

The signal is taken to be zero before the stream starts, except for LegS, whose measure starts
at :math:`x = 0`: there the state at the first sample :math:`t_0` is :math:`f_0 e_0` (the :math:`t \to 0` limit of
the projection; for :math:`t_0 > 0` it means :math:`f` is held at :math:`f_0` on :math:`[0, t_0]`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor, nn

from probseq._validation import check_real, check_tensor

#: The HiPPO measures (``measure=``), in order scaled Legendre, translated Legendre, translated Laguerre and Fourier.
MEASURES = ("legs", "legt", "lagt", "fout")
#: The discretisations of the HiPPO ODE (``discretization=``); ``zoh`` is the exact zero-order hold.
DISCRETIZATIONS = ("forward_euler", "backward_euler", "bilinear", "zoh")

__all__ = ["MEASURES", "DISCRETIZATIONS", "transition", "HiPPO", "project", "quadrature_rule"]


def _check_measure(measure: str) -> str:
    if measure not in MEASURES:
        raise ValueError(f"measure must be one of {MEASURES}, got {measure!r}")
    return measure


def _check_order(M, measure: str) -> int:
    if isinstance(M, bool) or not isinstance(M, (int, np.integer)) or M < 1:
        raise ValueError(f"M must be a positive integer, got {M!r}")
    if measure == "fout" and M % 2 == 0:
        raise ValueError(f"M must be odd for measure 'fout' (a constant plus cosine/sine pairs), got {M}")
    return int(M)


def _check_theta(theta) -> float:
    if not (isinstance(theta, (int, float)) and math.isfinite(theta) and theta > 0):
        raise ValueError(f"theta must be a positive finite number, got {theta!r}")
    return float(theta)


def transition(measure: str, M: int, theta: float = 1.0, dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor]:
    r"""Continuous-time HiPPO matrices ``(A, B)`` of :math:`\frac{\mathrm{d}c}{\mathrm{d}t} = A(t)\, c + B(t)\, f` (thesis eq. (2.10)).

    For ``"legs"`` the returned ``A`` (M x M) and ``B`` (M,) are the time-invariant parts of
    :math:`A(t) = A/t` and :math:`B(t) = B/t` (thesis eqs. (2.14), (2.15)).  For the other
    measures they are :math:`A(t)` and :math:`B(t)` themselves (App. A; ``theta`` is the window length of
    LegT/FouT and the time scale of LagT).  FouT is in the real cos/sin form described in the
    module docstring.

    :param measure: one of :data:`MEASURES`: ``"legs"``, ``"legt"``, ``"lagt"``, ``"fout"``.
    :param M: the state size (number of basis functions), a positive int; odd for ``"fout"``.
    :param theta: window length (LegT/FouT) or time scale (LagT) :math:`\theta > 0`, in the signal's time unit;
        ignored by LegS. Default 1.
    :param dtype: dtype of the returned matrices (computed in float64); default ``torch.float64``.
    """
    measure = _check_measure(measure)
    M = _check_order(M, measure)
    theta = _check_theta(theta)
    m = torch.arange(M, dtype=torch.float64)
    root = torch.sqrt(2 * m + 1)
    row, col = m[:, None], m[None, :]
    if measure == "legs":
        A = torch.where(row > col, -root[:, None] * root[None, :], torch.zeros(M, M, dtype=torch.float64))
        A = A - torch.diag(m + 1)
        B = root
    elif measure == "legt":
        sign = torch.where(row >= col, 1.0, (-1.0) ** (row - col))
        A = -(sign * root[:, None] * root[None, :]) / theta
        B = root / theta
    elif measure == "lagt":
        A = -(row >= col).to(torch.float64) / theta
        B = torch.ones(M, dtype=torch.float64) / theta
    else:  # fout, real form
        e = _fout_edge_values(M)
        freq = 2 * math.pi * torch.arange(1, (M - 1) // 2 + 1, dtype=torch.float64)
        omega = torch.zeros(M, M, dtype=torch.float64)
        cos_idx = torch.arange(1, M, 2)
        omega[cos_idx, cos_idx + 1] = -freq
        omega[cos_idx + 1, cos_idx] = freq
        A = (omega - torch.outer(e, e)) / theta
        B = e / theta
    return A.to(dtype), B.to(dtype)


def _fout_edge_values(M: int) -> Tensor:
    """Real Fourier basis evaluated at both window edges (``s = 0`` and ``s = theta``)."""
    e = torch.zeros(M, dtype=torch.float64)
    e[0] = 1.0
    e[1::2] = math.sqrt(2.0)
    return e


@functools.lru_cache(maxsize=64)
def _normalized_legendre_coefficients(M: int) -> tuple[np.ndarray, np.ndarray]:
    """``(γ, c)`` of the recurrence of :func:`normalized_legendre`, one multiply-add per degree.

    ``q_n = sqrt(2n + 1) P_n`` obeys ``q_{n+1} = α_n z q_n - β_n q_{n-1}`` (Bonnet's recurrence
    rescaled: ``α_n = sqrt((2n + 1)(2n + 3))/(n + 1)``, ``β_n = n sqrt((2n + 3)/(2n - 1))/(n + 1)``).
    With ``q_n = c_n r_n``, ``c_0 = c_1 = 1`` and ``c_{n+1} = β_n c_{n-1}`` it becomes
    ``r_{n+1} = γ_n z r_n - r_{n-1}``, ``γ_n = α_n c_n / c_{n+1}``; ``c_n`` stays within ``[1, 2/sqrt(π)]``.
    """
    c = [1.0, 1.0]
    gamma = []
    for n in range(1, M - 1):
        c.append(n * math.sqrt((2 * n + 3) / (2 * n - 1)) / (n + 1) * c[n - 1])
        gamma.append(math.sqrt((2 * n + 1) * (2 * n + 3)) / (n + 1) * c[n] / c[n + 1])
    return np.array(gamma), np.array(c[:M])


def normalized_legendre(z: Tensor, M: int, scale: Tensor | None = None) -> Tensor:
    r"""The normalised Legendre polynomials :math:`\sqrt{2n + 1}\, P_n(z)`, :math:`n = 0, \dots, M - 1`, at ``z``.

    By the three-term recurrence; shape ``(*z.shape, M)``.

    :param z: points in ``[-1, 1]``, any shape.
    :param M: the number of degrees.
    :param scale: (broadcasting to ``z``) every degree multiplied by it, folded into the recurrence's start
        (it is linear), e.g. a quadrature rule's weights, without a second array of the result's size.

    Without autograd on the CPU the ``M`` steps run in NumPy (the same operations, in place, so the
    values are identical): a step costs about a microsecond there instead of tens as small torch
    operations (it keeps the Lyapunov backend's step cheap)."""
    if _plain_cpu_values(z) and (scale is None or _plain_cpu_values(scale)):
        scale_values = None if scale is None else scale.detach().to(z.dtype).numpy()
        return torch.from_numpy(_normalized_legendre_numpy(z.detach().numpy(), M, scale_values))
    gamma, c = _normalized_legendre_coefficients(M)
    first = torch.ones_like(z) if scale is None else scale.to(z.dtype).expand(z.shape)
    out = [first, z * math.sqrt(3.0) * first]
    for n, g in enumerate(gamma.tolist(), start=1):
        out.append(z * g * out[n] - out[n - 1])  # _normalized_legendre_numpy's operations, in its order
    return torch.stack(out[:M], dim=-1) * torch.as_tensor(c, dtype=z.dtype, device=z.device)


def _plain_cpu_values(z: Tensor) -> bool:
    """Whether ``z`` can leave torch for NumPy: a CPU float tensor outside autograd and compilation."""
    return (
        z.device.type == "cpu"
        and z.layout == torch.strided
        and z.dtype in (torch.float32, torch.float64)
        and not (z.requires_grad and torch.is_grad_enabled())
        and not torch.compiler.is_compiling()
    )


def _normalized_legendre_numpy(z: np.ndarray, M: int, scale: np.ndarray | None = None) -> np.ndarray:
    """:func:`normalized_legendre` on a NumPy array: three in-place operations per degree (the cost
    is per-call overhead for the few hundred nodes of a panel rule).  The degrees are computed as rows
    and returned as a transposed view ``(*z.shape, M)`` (no copy; matrix products take it as it is)."""
    gamma, c = _normalized_legendre_coefficients(M)
    out = np.empty((M,) + z.shape, dtype=z.dtype)
    out[0] = 1 if scale is None else scale
    if M > 1:
        np.multiply(z, math.sqrt(3.0), out=out[1])
        if scale is not None:
            out[1] *= out[0]
    for n, g in enumerate(gamma.tolist(), start=1):
        row = out[n + 1]
        np.multiply(z, g, out=row)
        row *= out[n]
        row -= out[n - 1]
    out *= c.astype(z.dtype).reshape((M,) + (1,) * z.ndim)
    return np.moveaxis(out, 0, -1)


def _laguerre(s: Tensor, M: int) -> Tensor:
    """``L_0..L_{M-1}`` at ``s`` by the three-term recurrence; shape ``(*s.shape, M)``."""
    out = [torch.ones_like(s), 1 - s]
    for n in range(1, M - 1):
        out.append(((2 * n + 1 - s) * out[n] - n * out[n - 1]) / (n + 1))
    return torch.stack(out[:M], dim=-1)


def _basis(measure: str, M: int, theta: float, x: Tensor, t: Tensor) -> Tensor:
    """``g_m^{(t)}(x)``; ``x``: (N,), ``t``: (...) -> (..., N, M)."""
    x = x.reshape(*([1] * t.dim()), -1)
    t = t[..., None]
    if measure == "legs":
        return normalized_legendre(2 * x / t - 1, M)
    if measure == "legt":
        return normalized_legendre(2 * (x - t) / theta + 1, M)
    if measure == "lagt":
        return _laguerre((t - x) / theta, M)
    phase = 2 * math.pi * (t - x) / theta
    k = torch.arange(1, (M - 1) // 2 + 1, dtype=x.dtype, device=x.device)
    cos = math.sqrt(2.0) * torch.cos(phase[..., None] * k)
    sin = math.sqrt(2.0) * torch.sin(phase[..., None] * k)
    pairs = torch.stack([cos, sin], dim=-1).flatten(-2)
    return torch.cat([torch.ones_like(phase)[..., None], pairs], dim=-1)


def _measure_density(measure: str, theta: float, x: Tensor, t: Tensor) -> Tensor:
    """``omega^{(t)}(x)``; ``x``: (N,), ``t``: (...) -> (..., N)."""
    x = x.reshape(*([1] * t.dim()), -1)
    t = t[..., None]
    if measure == "legs":
        inside = (x >= 0) & (x <= t)
        return torch.where(inside, 1.0 / t, torch.zeros_like(x * t))
    if measure in ("legt", "fout"):
        inside = (x >= t - theta) & (x <= t)
        return torch.where(inside, torch.full_like(x * t, 1.0 / theta), torch.zeros_like(x * t))
    return torch.where(x <= t, torch.exp(-(t - x) / theta) / theta, torch.zeros_like(x * t))


def quadrature_rule(
    measure: str,
    t: float,
    theta: float = 1.0,
    num_nodes: int = 200,
    start: float = 0.0,
    dtype: torch.dtype = torch.float64,
    num_panels: int = 1,
) -> tuple[Tensor, Tensor]:
    r"""Nodes :math:`x_q` and weights :math:`w_q` with
    :math:`\sum_q w_q h(x_q) \approx \int_{\mathrm{start}}^t h(x)\, \omega^{(t)}(x)\, \mathrm{d}x`.

    The signal is taken to be zero before ``start`` (``start=-inf`` integrates the whole measure).
    Gauss-Legendre on the support (clipped at ``start``), split into ``num_panels`` equal panels
    of ``num_nodes`` nodes each (composite rule, for integrands varying faster than the basis,
    such as kernels with short length scales); Gauss-Laguerre in :math:`s = (t - x)/\theta` for LagT
    with ``start=-inf``.  Exact for polynomials of degree :math:`< 2\,\mathrm{num\_nodes}` (times the
    exponential weight for LagT), so the HiPPO projections of polynomials are exact to round-off.

    :param measure: one of :data:`MEASURES`.
    :param t: the current time :math:`t` of the measure :math:`\omega^{(t)}`; positive for ``"legs"``.
    :param theta: window length (LegT/FouT) or time scale (LagT) :math:`\theta > 0`; ignored by LegS. Default 1.
    :param num_nodes: Gauss nodes per panel (per rule for Gauss-Laguerre), a positive int; default 200.
    :param start: lower integration limit (the signal is zero before it); default 0, ``-inf`` for the whole measure.
    :param dtype: dtype of the returned nodes and weights (computed in float64); default ``torch.float64``.
    :param num_panels: number of equal panels of the composite Gauss-Legendre rule, a positive int; default 1.
        Not used by Gauss-Laguerre.
    :return: ``(nodes, weights)``, each ``(num_panels * num_nodes,)`` (``(num_nodes,)`` for Gauss-Laguerre).
    """
    measure = _check_measure(measure)
    theta = _check_theta(theta)
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, (int, np.integer)) or num_nodes < 1:
        raise ValueError(f"num_nodes must be a positive integer, got {num_nodes!r}")
    t = float(t)
    if measure == "legs":
        if not t > 0:
            raise ValueError(f"t must be positive for measure 'legs', got {t}")
        lower = max(0.0, start)
    elif measure in ("legt", "fout"):
        lower = max(t - theta, start)
    else:
        lower = start
    if measure == "lagt" and math.isinf(lower):
        s, w = np.polynomial.laguerre.laggauss(num_nodes)
        nodes = t - theta * torch.as_tensor(s)
        weights = torch.as_tensor(w)  # omega dx = exp(-s) ds
        return nodes.to(dtype), weights.to(dtype)
    if not lower < t:
        raise ValueError(f"the integration range [{lower}, {t}] is empty: check t and start")
    if isinstance(num_panels, bool) or not isinstance(num_panels, (int, np.integer)) or num_panels < 1:
        raise ValueError(f"num_panels must be a positive integer, got {num_panels!r}")
    z, w = np.polynomial.legendre.leggauss(num_nodes)
    half = (t - lower) / (2 * num_panels)
    left = lower + 2 * half * np.arange(num_panels)
    nodes = torch.as_tensor((left[:, None] + half * (z + 1)).ravel())
    density = _measure_density(measure, theta, nodes, torch.tensor(t, dtype=torch.float64))
    weights = half * torch.as_tensor(np.tile(w, num_panels)) * density
    return nodes.to(dtype), weights.to(dtype)


def project(
    fn: Callable[[Tensor], Tensor],
    t: float,
    M: int,
    measure: str,
    theta: float = 1.0,
    num_nodes: int = 200,
    start: float = 0.0,
) -> Tensor:
    r"""Exact HiPPO coefficients :math:`c_m(t) = \int f(x)\, g_m^{(t)}(x)\, \omega^{(t)}(x)\, \mathrm{d}x` (thesis eq. (2.7)).

    Computed by Gauss quadrature (see :func:`quadrature_rule`); ``fn`` maps a float64 tensor of
    times ``(Q,)`` to values ``(..., Q)``.  Returns ``(..., M)`` in float64.  This is the reference
    every recurrence is tested against.

    :param fn: the signal :math:`f`, a callable from times ``(Q,)`` (float64) to values ``(..., Q)``.
    :param t: the time :math:`t` at which the history is projected; positive for ``"legs"``.
    :param M: the number of coefficients, a positive int; odd for ``"fout"``.
    :param measure: one of :data:`MEASURES`.
    :param theta: window length (LegT/FouT) or time scale (LagT) :math:`\theta > 0`; ignored by LegS. Default 1.
    :param num_nodes: Gauss nodes of the quadrature rule; default 200.
    :param start: the time before which the signal is zero; default 0, ``-inf`` for the whole measure.
    """
    measure = _check_measure(measure)
    M = _check_order(M, measure)
    nodes, weights = quadrature_rule(measure, t, theta, num_nodes, start)
    values = torch.as_tensor(fn(nodes), dtype=torch.float64)
    basis = _basis(measure, M, float(theta), nodes, torch.tensor(float(t), dtype=torch.float64))
    return (values * weights) @ basis


def _augmented_exponential(A: Tensor, B: Tensor, step: Tensor) -> tuple[Tensor, Tensor]:
    """``exp(step A)`` and ``int_0^step exp(s A) ds B`` from one exponential (Van Loan), batched over ``step``."""
    M = A.shape[-1]
    block = torch.zeros(M + 1, M + 1, dtype=A.dtype, device=A.device)
    block[:M, :M] = A
    block[:M, M] = B
    expo = torch.linalg.matrix_exp(step[:, None, None] * block)
    return expo[:, :M, :M], expo[:, :M, M]


class HiPPO(nn.Module):
    r"""HiPPO memory: discretised ODE :math:`\frac{\mathrm{d}c}{\mathrm{d}t} = A(t)\, c + B(t)\, f` (thesis eq. (2.10)).

    Each step from :math:`t_{k-1}` to :math:`t_k` (:math:`h = t_k - t_{k-1}`, non-uniform allowed) is
    :math:`c_k = \bar A_k c_{k-1} + P_k f_{k-1} + Q_k f_k`:

    * ``forward_euler``: :math:`\bar A = I + h A(t_{k-1})`, :math:`P = h B(t_{k-1})`, :math:`Q = 0` (first order);
    * ``backward_euler``: :math:`\bar A = (I - h A(t_k))^{-1}`, :math:`P = 0`, :math:`Q = \bar A h B(t_k)` (first order);
    * ``bilinear``: the trapezoidal rule on the ODE, both samples used (second order);
    * ``zoh``: the exact flow of the homogeneous ODE (for LegS :math:`(t_k/t_{k-1})^A`, exact because
      :math:`A(t) = A/t` is time-invariant in :math:`\log t`) with the input held at the mean of the two
      samples bounding the step (second order for samples of a smooth signal).

    LegS's :math:`A/t` is singular at :math:`t = 0`.  A step leaving :math:`t = 0` forgets the state, as the
    exact flow does (:math:`(t/0)^A = 0`), and sets the exact projection of the linear interpolant of
    :math:`f_0, f_1` on :math:`[0, t_1]`; no division by zero occurs.  Forward Euler on LegS is unstable for
    steps :math:`h > 2t/M` (the HiPPO paper's observation), so use it only with small ``M``.

    :param measure: one of :data:`MEASURES`: ``"legs"``, ``"legt"``, ``"lagt"``, ``"fout"`` (module docstring).
    :param M: the state size (number of basis functions), a positive int; odd for ``"fout"``.
    :param theta: window length (LegT/FouT) or time scale (LagT) :math:`\theta > 0`, in the signal's time unit;
        ignored by LegS. Default 1.
    :param discretization: one of :data:`DISCRETIZATIONS` (above); default ``"bilinear"``.
    """

    A: Tensor
    B: Tensor

    def __init__(self, measure: str, M: int, theta: float = 1.0, discretization: str = "bilinear"):
        super().__init__()
        self.measure = _check_measure(measure)
        self.M = _check_order(M, measure)
        self.theta = _check_theta(theta)
        if discretization not in DISCRETIZATIONS:
            raise ValueError(f"discretization must be one of {DISCRETIZATIONS}, got {discretization!r}")
        self.discretization = discretization
        A, B = transition(measure, self.M, self.theta)
        self.register_buffer("A", A, persistent=False)
        self.register_buffer("B", B, persistent=False)
        self._cache_times: Tensor | None = None
        self._cache_steps: dict[torch.dtype, tuple[Tensor, ...]] | None = None
        self._cache_kernel: tuple[Tensor, Tensor] | None = None
        self._cache_prefix: tuple[int, tuple[Tensor, Tensor]] | None = None

    def extra_repr(self) -> str:
        return f"measure={self.measure!r}, M={self.M}, theta={self.theta}, discretization={self.discretization!r}"

    # ----------------------------------------------------------------- discretisation
    def _initial_vector(self) -> Tensor:
        """``E`` with ``c_0 = E f_0``: ``e_0`` for LegS, zero for the others (module docstring)."""
        E = torch.zeros(self.M, dtype=torch.float64, device=self.A.device)
        if self.measure == "legs":
            E[0] = 1.0
        return E

    def step_matrices(self, t_prev: Tensor, t: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        r"""Batched :math:`(\bar A, P, Q)` in float64 for steps ``t_prev -> t`` (1-D tensors of equal length).

        :param t_prev: start times of the steps ``(K,)``; :math:`\ge 0` for LegS (a step from 0 is the exact start).
        :param t: end times of the steps ``(K,)``, each greater than its ``t_prev``.
        :return: :math:`\bar A` ``(K, M, M)``, :math:`P` ``(K, M)`` and :math:`Q` ``(K, M)``.
        """
        A, B = self.A.double(), self.B.double()
        t_prev, t = t_prev.double(), t.double()
        eye = torch.eye(self.M, dtype=torch.float64, device=A.device)
        if self.measure == "legs":
            return self._legs_step_matrices(A, B, eye, t_prev, t)
        # Time-invariant A: compute once per distinct step length (steps equal to 1e-10 relative
        # share one set of matrices, far below any discretisation error).
        h = t - t_prev
        key = torch.round(h / h.max() * 1e10)
        _, first, inverse = _unique_first(key)
        Abar, P, Q = self._invariant_step_matrices(A, B, eye, h[first])
        return Abar[inverse], P[inverse], Q[inverse]

    def _invariant_step_matrices(self, A, B, eye, h):
        hA = h[:, None, None] * A
        hB = h[:, None] * B
        scheme = self.discretization
        if scheme == "forward_euler":
            return eye + hA, hB, torch.zeros_like(hB)
        if scheme == "backward_euler":
            inv = torch.linalg.inv(eye - hA)
            return inv, torch.zeros_like(hB), (inv @ hB[..., None])[..., 0]
        if scheme == "bilinear":
            lhs = eye - hA / 2
            Abar = torch.linalg.solve(lhs, eye + hA / 2)
            half = torch.linalg.solve(lhs, hB[..., None] / 2)[..., 0]
            return Abar, half, half
        Abar, gamma = _augmented_exponential(A, B, h)
        return Abar, gamma / 2, gamma / 2

    def _legs_step_matrices(self, A, B, eye, t_prev, t):
        from_zero = t_prev == 0
        tp = torch.where(from_zero, t, t_prev)  # placeholder value where t_prev = 0; overwritten below
        h = t - tp
        scheme = self.discretization
        if scheme == "forward_euler":
            Abar = eye + (h / tp)[:, None, None] * A
            P = (h / tp)[:, None] * B
            Q = torch.zeros_like(P)
        elif scheme == "backward_euler":
            lhs = eye - (h / t)[:, None, None] * A
            Abar = torch.linalg.solve_triangular(lhs, eye.expand_as(lhs), upper=False)
            Q = (Abar @ ((h / t)[:, None] * B)[..., None])[..., 0]
            P = torch.zeros_like(Q)
        elif scheme == "bilinear":
            lhs = eye - (h / (2 * t))[:, None, None] * A
            rhs = eye + (h / (2 * tp))[:, None, None] * A
            Abar = torch.linalg.solve_triangular(lhs, rhs, upper=False)
            inputs = torch.stack([(h / (2 * tp))[:, None] * B, (h / (2 * t))[:, None] * B], dim=-1)
            P, Q = torch.linalg.solve_triangular(lhs, inputs, upper=False).unbind(-1)
        else:
            Abar, gamma = _augmented_exponential(A, B, torch.log(t / tp))
            P, Q = gamma / 2, gamma / 2
        # Leaving t = 0: exact projection of the linear interpolant on [0, t_1].
        first = torch.zeros(self.M, dtype=torch.float64, device=A.device)
        legendre_one = torch.zeros_like(first)
        first[0] = 0.5
        if self.M > 1:
            legendre_one[1] = 1 / (2 * math.sqrt(3.0))
        mask = from_zero[:, None]
        Abar = torch.where(from_zero[:, None, None], torch.zeros_like(Abar), Abar)
        P = torch.where(mask, first - legendre_one, P)
        Q = torch.where(mask, first + legendre_one, Q)
        return Abar, P, Q

    def _grid_steps(self, times: Tensor, dtype: torch.dtype = torch.float64) -> tuple[Tensor, ...]:
        """Per-step matrices ``(Ā, P, Q)`` for a time grid in ``dtype``, cached while the grid is unchanged (fast path)."""
        cached, cached_steps = self._cache_times, self._cache_steps
        if (
            cached is None
            or cached_steps is None
            or not (cached.shape == times.shape and cached.device == times.device and torch.equal(cached, times))
        ):
            n_old = 0 if cached is None else cached.shape[0]
            if (
                cached is not None
                and cached_steps is not None
                and 1 < n_old < times.shape[0]
                and cached.device == times.device
                and torch.equal(times[:n_old], cached)
            ):  # a stream that grew: only the new steps are discretised
                old = cached_steps[torch.float64]
                new = self.step_matrices(times[n_old - 1 : -1], times[n_old:])
                steps = tuple(torch.cat([a, b]) for a, b in zip(old, new))
                self._cache_prefix = (n_old, self._cache_kernel) if self._cache_kernel is not None else None
            else:
                steps = self.step_matrices(times[:-1], times[1:])
                self._cache_prefix = None
            self._cache_times = times.detach().clone()
            cached_steps = self._cache_steps = {torch.float64: steps}
            self._cache_kernel = None
        if dtype not in cached_steps:
            cached_steps[dtype] = tuple(m.to(dtype) for m in cached_steps[torch.float64])
        return cached_steps[dtype]

    # ----------------------------------------------------------------- validation
    def _check_times(self, times) -> Tensor:
        times = torch.as_tensor(times, device=self.A.device)
        if times.dim() != 1 or times.numel() < 1:
            raise ValueError(f"times must be a non-empty 1-D tensor, got shape {tuple(times.shape)}")
        times = times.double()
        if not torch.isfinite(times).all():
            raise ValueError("times must be finite")
        if times.numel() > 1 and not (times[1:] > times[:-1]).all():
            raise ValueError("times must be strictly increasing")
        if self.measure == "legs" and times[0] < 0:
            raise ValueError(f"times must be >= 0 for measure 'legs' (its measure starts at 0), got {times[0].item()}")
        return times

    def _check_signal(self, signal, times: Tensor) -> Tensor:
        signal = _floating(signal, "signal", self.A.device)
        if signal.dim() < 1 or signal.shape[-1] != times.shape[0]:
            raise ValueError(f"signal must have shape (..., T) with T = len(times) = {times.shape[0]}, got {tuple(signal.shape)}")
        return signal

    # ----------------------------------------------------------------- recurrence
    def initial_state(self, f0, t0: float = 0.0) -> Tensor:
        r"""State at the first sample ``t0`` of a stream: :math:`f_0 e_0` for LegS, zero otherwise.

        :param f0: the first sample :math:`f_0`, a scalar or tensor ``(...)``; the state is ``(..., M)``.
        :param t0: its time (default 0); :math:`\ge 0` for LegS. Only checked: the state does not depend on it.
        """
        f0 = _floating(f0, "f0", self.A.device)
        t0 = check_real(t0, "t0")
        if self.measure == "legs" and t0 < 0:
            raise ValueError(f"t0 must be >= 0 for measure 'legs', got {t0}")
        return f0[..., None] * self._initial_vector().to(f0.dtype)

    def step(self, c: Tensor, f, t_prev: float, t: float, f_prev=None) -> Tensor:
        r"""One online update :math:`c(t_{\mathrm{prev}}) \to c(t)` given the new sample :math:`f = f(t)`.

        ``f_prev`` (the sample at ``t_prev``) is required by the schemes that use it
        (forward Euler, bilinear, zoh, and LegS leaving :math:`t = 0`).  Streaming a signal with
        ``initial_state`` followed by ``step`` equals one :meth:`scan` to round-off.

        :param c: the state :math:`c(t_{\mathrm{prev}})`, ``(..., M)``.
        :param f: the new sample :math:`f(t)`, a scalar or tensor broadcasting to ``c.shape[:-1]``.
        :param t_prev: the time of ``c``; :math:`\ge 0` for LegS.
        :param t: the time of ``f``, greater than ``t_prev``.
        :param f_prev: the sample :math:`f(t_{\mathrm{prev}})`; ``None`` (default) only for schemes that do not use it.
        """
        c = _floating(c, "c", None)  # an integer state steps in float64, not in integers
        if c.shape[-1] != self.M:
            raise ValueError(f"c must have last dimension M = {self.M}, got {tuple(c.shape)}")
        t_prev, t = check_real(t_prev, "t_prev"), check_real(t, "t")
        if not t > t_prev:
            raise ValueError(f"t must be greater than t_prev, got t_prev={t_prev}, t={t}")
        if self.measure == "legs" and t_prev < 0:
            raise ValueError(f"t_prev must be >= 0 for measure 'legs', got {t_prev}")
        grid = torch.tensor([float(t_prev), float(t)], dtype=torch.float64, device=c.device)
        Abar, P, Q = (m[0].to(c.dtype) for m in self.step_matrices(grid[:1], grid[1:]))
        f = check_tensor(torch.as_tensor(f, dtype=c.dtype, device=c.device), "f")
        out = c @ Abar.T + f[..., None] * Q
        if bool((P != 0).any()):
            if f_prev is None:
                raise ValueError(
                    f"f_prev (the sample at t_prev) is required by the {self.discretization!r} discretization of measure {self.measure!r}"
                )
            f_prev = check_tensor(torch.as_tensor(f_prev, dtype=c.dtype, device=c.device), "f_prev")
            out = out + f_prev[..., None] * P
        return out

    def scan(self, signal, times) -> Tensor:
        r"""Memory states :math:`c(t_k)` for all samples: ``signal`` (..., T) at ``times`` (T,) -> (..., T, M).

        Fast path: the per-step matrices are computed once per time grid (batched, cached) and
        applied to all leading dimensions at once; only the ``T``-long loop of small matrix
        products remains in Python.

        :param signal: the samples :math:`f(t_k)`, ``(..., T)``.
        :param times: the sample times ``(T,)``, strictly increasing; :math:`\ge 0` for LegS.
        """
        times = self._check_times(times)
        signal = self._check_signal(signal, times)
        batch_shape, T = signal.shape[:-1], signal.shape[-1]
        flat = signal.reshape(-1, T).T  # (T, batch): time-major so each step writes a contiguous block
        out = torch.empty(T, flat.shape[1], self.M, dtype=flat.dtype, device=flat.device)
        out[0] = flat[0, :, None] * self._initial_vector().to(flat.dtype)
        if T > 1:
            Abar, P, Q = self._grid_steps(times, flat.dtype)
            # input terms of every step at once, accumulated in the output buffer (no temporaries)
            torch.mul(flat[:-1, :, None], P[:, None], out=out[1:])
            out[1:].addcmul_(flat[1:, :, None], Q[:, None])
            AbarT = Abar.transpose(-1, -2)
            for k in range(1, T):
                out[k].addmm_(out[k - 1], AbarT[k - 1])
        return out.permute(1, 0, 2).reshape(*batch_shape, T, self.M)

    def _unrolled(self, times: Tensor) -> tuple[Tensor, Tensor]:
        """Input kernel ``K`` (T x M) and flow ``W_0`` (M x M): ``c_T = W_0 c_0 + sum_k f_k K_k`` (cached).

        Unrolling the linear recurrence gives ``K_j = W_j Q_j + W_{j+1} P_{j+1}`` with
        ``W_k = Abar_{T-1} ... Abar_{k+1}``; one backward pass over the steps, ``O(T M^3)``.
        """
        steps = self._grid_steps(times)
        if self._cache_kernel is None:
            Abar, P, Q = steps
            T = times.shape[0]
            # a grown grid reuses the kernel of its prefix: K_old only needs the flow of the new steps
            n_old, old = self._cache_prefix if self._cache_prefix is not None else (1, None)
            K = torch.zeros(T, self.M, dtype=torch.float64, device=times.device)
            W = torch.eye(self.M, dtype=torch.float64, device=times.device)
            for k in range(T - 1, n_old - 1, -1):  # W = W_k
                K[k] += W @ Q[k - 1]
                K[k - 1] += W @ P[k - 1]
                W = W @ Abar[k - 1]
            if old is not None:
                K[:n_old] += old[0] @ W.T
                W = W @ old[1]
            self._cache_kernel = (K, W)
            self._cache_prefix = None
        return self._cache_kernel

    def kernel(self, times) -> Tensor:
        r"""The ``T x M`` "HiPPO kernel" :math:`K` with :math:`c(t_T) = \sum_k f_k K_k` (float64, cached).

        The convolution view of S4, here also for the time-varying LegS: the stream's initial
        state :math:`E f_0` (module docstring) is folded into :math:`K_0`.

        :param times: the sample times ``(T,)``, strictly increasing; :math:`\ge 0` for LegS.
        """
        times = self._check_times(times)
        K, W = self._unrolled(times)
        K = K.clone()
        K[0] += W @ self._initial_vector()
        return K

    def final_state(self, signal, times, initial_state: Tensor | None = None) -> Tensor:
        r"""Only the last state :math:`c(t_T)`: one product of the signal with :meth:`kernel`.

        :math:`O(\mathrm{batch}\, T M)` work instead of the scan's :math:`O(\mathrm{batch}\, T M^2)`; equals
        ``scan(signal, times)[..., -1, :]`` to round-off.  With ``initial_state`` (..., M) the
        stream continues from that state at ``times[0]`` instead of starting afresh, so a long
        stream can be absorbed piece by piece (each piece's grid starting at the previous end).

        :param signal: the samples :math:`f(t_k)`, ``(..., T)``.
        :param times: the sample times ``(T,)``, strictly increasing; :math:`\ge 0` for LegS.
        :param initial_state: the state ``(..., M)`` at ``times[0]`` to continue from; ``None`` (default) starts
            afresh (:meth:`initial_state` of ``signal[..., 0]``).
        """
        times = self._check_times(times)
        signal = self._check_signal(signal, times)
        K, W = self._unrolled(times)
        if initial_state is None:
            initial_state = signal[..., :1] * self._initial_vector().to(signal.dtype)
        elif _floating(initial_state, "initial_state", None).shape[-1] != self.M:
            raise ValueError(f"initial_state must have last dimension M = {self.M}, got {tuple(initial_state.shape)}")
        return signal @ K.to(signal.dtype) + initial_state @ W.T.to(signal.dtype)

    # ----------------------------------------------------------------- bases
    def basis(self, x, t) -> Tensor:
        r""":math:`g_m^{(t)}(x)` for ``x`` (N,) and ``t`` scalar or (...) -> (..., N, M).

        Polynomials (LegS/LegT/LagT) and Fourier functions are defined for all ``x``; only
        :meth:`measure_density` restricts to the support.

        :param x: evaluation times ``(N,)``.
        :param t: the current time(s) :math:`t` of the bases, a scalar or tensor ``(...)``; positive for LegS.
        """
        x, t = self._check_points(x, t)
        return _basis(self.measure, self.M, self.theta, x, t)

    def measure_density(self, x, t) -> Tensor:
        r""":math:`\omega^{(t)}(x)` for ``x`` (N,) and ``t`` scalar or (...) -> (..., N).

        :param x: evaluation times ``(N,)``.
        :param t: the current time(s) :math:`t` of the measure, a scalar or tensor ``(...)``; positive for LegS.
        """
        x, t = self._check_points(x, t)
        return _measure_density(self.measure, self.theta, x, t)

    def basis_at_nodes(self, x: Tensor, t: float, scale: Tensor | None = None) -> Tensor:
        """:meth:`basis` without its input checks, for quadrature rules that have validated their nodes.

        :param x: the nodes, a float tensor ``(N,)`` on the memory's device.
        :param t: the time of the bases, a float.
        :param scale: ``(N,)`` weights the rows are multiplied by (folded into the Legendre recurrence: no second
            array), or ``None`` (the default).
        """
        if self.measure == "legs":
            return normalized_legendre(2 * x / t - 1, self.M, scale)
        if self.measure == "legt":
            return normalized_legendre(2 * (x - t) / self.theta + 1, self.M, scale)
        basis = _basis(self.measure, self.M, self.theta, x, torch.tensor(t, dtype=x.dtype, device=x.device))
        return basis if scale is None else basis * scale[:, None]

    def density_at_nodes(self, x: Tensor, t: float) -> Tensor:
        """:meth:`measure_density` without its input checks (as :meth:`basis_at_nodes`).

        :param x: the nodes, a float tensor ``(N,)`` on the memory's device.
        :param t: the time of the measure, a float.
        """
        return _measure_density(self.measure, self.theta, x, torch.tensor(t, dtype=x.dtype, device=x.device))

    def reconstruct(self, c: Tensor, x, t) -> Tensor:
        r""":math:`\sum_m c_m g_m^{(t)}(x)`: ``c`` (..., M), ``x`` (N,) -> (..., N).

        :param c: the coefficients (memory state) ``(..., M)``.
        :param x: evaluation times ``(N,)``.
        :param t: the time :math:`t` of the state (of its bases), a scalar or a tensor broadcasting with ``c``'s batch.
        """
        c = _floating(c, "c", None)
        if c.shape[-1] != self.M:
            raise ValueError(f"c must have last dimension M = {self.M}, got {tuple(c.shape)}")
        basis = self.basis(x, t).to(c.dtype)
        return (basis @ c[..., None])[..., 0]

    def _check_points(self, x, t) -> tuple[Tensor, Tensor]:
        x = _floating(x, "x", self.A.device)
        if x.dim() != 1:
            raise ValueError(f"x must be a 1-D tensor of times, got shape {tuple(x.shape)}")
        t = check_tensor(torch.as_tensor(t, dtype=x.dtype, device=x.device), "t")
        if self.measure == "legs" and not (t > 0).all():
            raise ValueError("t must be positive for measure 'legs'")
        return x, t


def _floating(value, name: str, device) -> Tensor:
    """``value`` as a finite floating tensor; integers become float64 (the memory computes in float64)."""
    value = torch.as_tensor(value, device=device)
    return check_tensor(value if value.is_floating_point() or value.is_complex() else value.double(), name)


def _unique_first(key: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Unique values of ``key``, the index of one occurrence of each, and the inverse map."""
    unique, inverse = torch.unique(key, return_inverse=True)
    first = torch.zeros(unique.shape[0], dtype=torch.long, device=key.device)
    first.scatter_(0, inverse, torch.arange(key.shape[0], device=key.device))
    return unique, first, inverse
