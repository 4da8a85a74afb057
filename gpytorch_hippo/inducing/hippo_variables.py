r"""HiPPO bases as interdomain inducing variables (thesis §4.3.1).

:math:`u_m^{(t)} = \int f(x)\, \phi_m^{(t)}(x)\, \mathrm{d}x` with :math:`\phi_m^{(t)} = g_m^{(t)} \omega^{(t)}` the HiPPO
basis times its measure (:mod:`gpytorch_hippo.hippo`).  As for HiPPO memories, the integrals run
over the measure's support from ``start`` (default 0, the start of the stream) to ``t``.

The covariances come from one of four small backends (:mod:`.hippo_backends`), chosen by one
argument, ``method``:

* ``"spectral"`` (beyond the thesis): exact, cost linear in ``t / lengthscale``, stationary
  kernels (``ScaleKernel`` allowed): RBF by integrals over frequency of closed-form HiPPO
  transforms (:class:`~.hippo_backends.SpectralBackend`); Matérn :math:`\nu \in \{1/2, 3/2, 5/2\}`, whose
  rational spectral densities make that frequency rule converge only algebraically, by the
  equivalent banded product quadrature in time (:class:`~.banded.BandedBackend`).
* ``"quadrature"``: exact composite Gauss-Legendre in time, any kernel, cost quadratic in
  ``t / lengthscale``.
* ``"recurrence"`` (the thesis): ``Kuu`` from Fourier features projected by the HiPPO recurrence
  (thesis §4.3.2), carried across :meth:`HiPPOInducingVariables.advance`.
* ``"lyapunov"`` (beyond the thesis; LegS, RBF or Matérn): exact, ``Kuu`` carried across
  :meth:`HiPPOInducingVariables.advance` by the Lyapunov ODE of the LegS coefficients integrated
  exactly over each step (:mod:`.lyapunov`), ``Kuf`` by a local rule: the cost per task does not
  grow with ``t`` while the kernel's hyperparameters stay fixed.  A changed kernel restarts the
  carried state with one exact evaluation at ``t``; where gradients with respect to the kernel are
  required, ``Kuu`` and the cross covariance come from that exact backend (correct, at its cost).
* ``"auto"`` (default): ``"spectral"`` where it applies (RBF with a support not clipped by the
  stream start, or Matérn), otherwise ``"quadrature"``.

A periodic kernel (a spectral measure of point masses) goes to the spectral backend's sum over its lines, exact at a
cost that does not depend on ``t``, under ``"auto"``, ``"spectral"`` and ``"lyapunov"``.  A sum of kernels is taken
part by part (:class:`~.hippo_backends.AdditiveBackend`), each part by the backend ``method`` selects for it: with
``"lyapunov"``, a Matérn or RBF trend plus a periodic season streams at a flat cost per task, and so does a Matérn or
RBF kernel times a periodic one (quasi-periodic) once the stream is longer than the Matérn or RBF factor's reach.

Multidimensional inputs (thesis §4.4): the ordered inputs of each task are placed at times
``i dt`` continuing across tasks (:meth:`HiPPOInducingVariables.append_path`), and :math:`u` projects
:math:`f` along that path.  To stay truly online, the path is kept only as its random-feature memory
:math:`Z = \int \psi(x(s))\, \phi(s)\, \mathrm{d}s` evolved by the recurrence: :math:`K_{uf}(x) = Z^\top \psi(x)` and
:math:`K_{uu} = Z^\top Z` need no stored past inputs.  This replaces the kernel by its RFF approximation in
``Kuf`` as well (the thesis evaluates :math:`k(x_n, x(s))` exactly along the stored path), with a
Monte-Carlo error :math:`O(1/\sqrt{R})`.  The current task's inputs are kept until the next
``append_path`` so that hyperparameters can be trained within a task; memory committed by earlier
tasks was built with their length scale, and a changed length scale then raises an error.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import cast

import gpytorch
import torch
from linear_operator import to_dense
from linear_operator.operators import LinearOperator
from torch import Tensor

from probseq._validation import check_real, check_tensor

from .._validation import floating_dtype
from ..hippo import HiPPO
from ..timeaxis import is_datetime_like
from .banded import BandedBackend, support_span
from .base import InducingVariables
from .batched import BatchedInducingVariables, share_equal_buffers, stream_clocks
from .cost import MAX_TIME, kernel_reach, lengthscale_of
from .covariances import CovarianceBackend
from .hippo_backends import AdditiveBackend, PathBackend, QuadratureBackend, RecurrenceBackend, SpectralBackend
from .lyapunov import LyapunovBackend
from .lyapunov_batched import LyapunovStreams
from .spectral import SUPPORTED_KERNELS, spectral_parts  # noqa: F401  (re-exported)

METHODS = ("auto", "spectral", "quadrature", "recurrence", "lyapunov")
FEATURES = ("random", "quadrature")


class HiPPOInducingVariables(InducingVariables):
    r"""``M`` HiPPO inducing variables :math:`u_m^{(t)} = \int f(x)\, \phi_m^{(t)}(x)\, \mathrm{d}x` (Chen et al. (2025), thesis §4.3).

    :param num_inducing: ``M``, the number of basis functions.
    :param measure: ``"legs"`` (keeps the whole past, the thesis's choice), ``"legt"``, ``"lagt"``
        or ``"fout"`` (``M`` odd).
    :param t: current end time of the bases (1-D inputs); moved forward by :meth:`advance`.
    :param theta: window length of LegT/FouT, time scale of LagT.
    :param method: ``"auto"`` (default), ``"spectral"``, ``"quadrature"``, ``"recurrence"`` or
        ``"lyapunov"`` (module docstring; ``"lyapunov"`` needs ``measure="legs"`` and
        ``input_dim=1``).  Multidimensional inputs always use the path memory of the recurrence.
        With an RBF kernel ``"spectral"`` falls back to ``"quadrature"`` while the support is clipped
        by ``start`` (LegT/FouT before ``t = start + theta``); a kernel it cannot handle raises
        ``TypeError`` (batched kernels: ``ValueError``).
    :param num_rff: ``R``, Fourier features of the recurrence and of the multidimensional path.
    :param features: Fourier features of the recurrence and of the path memory: ``"random"`` (the
        thesis: ``R`` spectral samples) or ``"quadrature"`` (deterministic Gauss-Legendre nodes over
        frequency; a tensor-product rule of about ``R`` nodes for multidimensional RBF kernels, so for small ``D``).
    :param dt: recurrence step: grid step in time (1-D; default ``(t - start)/500``) or the time
        between consecutive ordered inputs (multidimensional; default 1).
    :param input_dim: ``D``; ``1`` means time inputs, ``> 1`` the path construction of §4.4.
    :param discretization: HiPPO discretisation of the recurrence (default bilinear).
    :param num_nodes: quadrature nodes per panel (at least; default 12); by default one panel per
        length scale with at least ``ceil(M / panels) + 24`` nodes each, unless ``num_panels`` is given.
    :param num_panels: number of equal panels of the quadrature backend's composite Gauss-Legendre rule, each with
        exactly ``num_nodes`` nodes; ``None`` (default): one panel per length scale, as described for ``num_nodes``.
    :param start: start of the stream; the integrals run over ``[start, t]``.
    :param jitter: ``None`` (default): ``Kuu`` gets :math:`\varepsilon \operatorname{mean}(\operatorname{diag} K_{uu})` with GPyTorch's
        :math:`\varepsilon` = ``variational_cholesky_jitter`` of float64 (1e-6, in every dtype), relative because LegS
        :math:`\operatorname{Var}(u_0) \approx \sigma^2 \sqrt{2\pi}\, \ell / t` shrinks as the stream grows.  A float: that absolute value.
    :param seed: seed of the spectral samples (fixed at construction, so that ``Kuu`` of the
        same variables is deterministic and two snapshots share their features).
    :param kuf: recurrence only.  ``"rff"`` (default): :math:`K_{fu} = Z^\top \psi(x)` from the same features as
        :math:`K_{uu} = Z^\top Z`; the Nyström residual :math:`k(x, x) - K_{fu} K_{uu}^{-1} K_{uf}` is then that of a projection
        and cannot go negative.  ``"ode"`` (the thesis): ``Kfu`` rows solve the ODE driven by the
        exact kernel; with few features the Monte-Carlo error of ``Kuu`` alone can make the
        residual negative (a ``RuntimeWarning`` says so where it is used).
    :param batch_shape: ``torch.Size([S])`` for ``S`` independent streams, each with its own bases and clock
        (``t`` a number or a tensor ``(S,)``; ``advance`` takes either): returns a
        :class:`~gpytorch_hippo.inducing.batched.BatchedInducingVariables` of ``S`` such sets, whose covariances
        are ``(S, M, M)`` and ``(S, M, N)`` stacks under a kernel with ``batch_shape=(S,)`` (per-stream
        hyperparameters) or without one (shared). 1-D inputs, every backend.

    **Conditioning.** The eigenvalues of ``Kuu`` decay like the kernel's spectral density at
    frequencies :math:`\sim m / t`, so its condition number is set by the jitter: at most :math:`M / \varepsilon`
    with the relative default.  Quadrature and spectral matrices are symmetric PSD before the
    jitter; feature estimates :math:`Z^\top Z` are PSD by construction.
    """

    #: the covariance backends by method name; :meth:`backend_for` chooses among them
    backends: dict[str, CovarianceBackend]
    # the bases' breakpoints, the last one the clock t; path variables' pending inputs, memory and their kernel's state
    breakpoints: Tensor
    path_pending: Tensor
    path_last: Tensor
    path_memory: Tensor
    path_lengthscale: Tensor
    path_step: Tensor
    rff_normal: Tensor
    rff_chi2: Tensor
    #: the kernel of the last evaluation of the path memory (multidimensional inputs): :meth:`append_path`'s
    #: default for folding the task into the memory.  A plain reference, not a submodule (not in the
    #: ``state_dict``), dropped by pickling and copies (:meth:`__getstate__`); set by :meth:`remember_kernel`.
    _last_kernel: gpytorch.kernels.Kernel | None = None

    def __new__(cls, *args, batch_shape: torch.Size | None = None, **kwargs):
        if batch_shape is None or tuple(batch_shape) == ():
            return super().__new__(cls)
        return _batched(cls, batch_shape, *args, **kwargs)

    def __init__(
        self,
        num_inducing: int,
        measure: str = "legs",
        t: float = 1.0,
        theta: float = 1.0,
        method: str = "auto",
        num_rff: int = 1000,
        dt: float | None = None,
        input_dim: int = 1,
        discretization: str = "bilinear",
        num_nodes: int = 12,
        num_panels: int | None = None,
        start: float = 0.0,
        jitter: float | None = None,
        seed: int = 0,
        kuf: str | None = None,
        features: str | None = None,
        batch_shape: torch.Size | None = None,
    ):
        super().__init__(jitter=jitter)
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        if method == "lyapunov" and (measure != "legs" or input_dim != 1):
            raise ValueError(f"method='lyapunov' needs measure='legs' and input_dim=1, got measure={measure!r}, input_dim={input_dim!r}")
        for name, value in (("kuf", kuf), ("features", features)):
            if value is not None and method != "recurrence" and not (name == "features" and input_dim > 1):
                raise ValueError(f"{name}={value!r} needs method='recurrence' (the Fourier features live there)")
        kuf = "rff" if kuf is None else kuf
        features = "random" if features is None else features
        if kuf not in ("ode", "rff"):
            raise ValueError(f"kuf must be 'ode' or 'rff', got {kuf!r}")
        if features not in FEATURES:
            raise ValueError(f"features must be one of {FEATURES}, got {features!r}")
        self.kuf = kuf
        self.features = features
        for name, count in (("num_rff", num_rff), ("input_dim", input_dim), ("num_nodes", num_nodes)):
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ValueError(f"{name} must be a positive integer, got {count!r}")
        if num_panels is not None and (not isinstance(num_panels, int) or num_panels < 1):
            raise ValueError(f"num_panels must be a positive integer or None, got {num_panels!r}")
        t, start = _check_time(t, "t"), _check_time(start, "start")
        if input_dim == 1 and not t > start:
            raise ValueError(f"t must be greater than start = {start}, got {t}")
        if dt is not None:
            dt = check_real(dt, "dt", low=0, low_open=True)
        self.memory = HiPPO(measure, num_inducing, theta, discretization)  # validates M, measure, theta
        self.method = method if input_dim == 1 else "recurrence"
        self.input_dim = input_dim
        self.num_rff = num_rff
        self.num_nodes = num_nodes
        self.num_panels = num_panels
        self.start = float(start)
        if input_dim == 1:
            self.dt = float(dt) if dt is not None else (float(t) - self.start) / 500
            # times the bases were advanced to; the recurrence grid is uniform between them
            self.register_buffer("breakpoints", torch.tensor([self.start, float(t)], dtype=torch.float64))
        else:
            self.dt = float(dt) if dt is not None else 1.0
            self.register_buffer("breakpoints", torch.tensor([self.start], dtype=torch.float64))
            self.register_buffer("path_pending", torch.zeros(0, input_dim, dtype=torch.float64))
            self.register_buffer("path_last", torch.zeros(0, input_dim, dtype=torch.float64))
            self.register_buffer("path_memory", torch.zeros(0, num_inducing, dtype=torch.float64))
            self.register_buffer("path_lengthscale", torch.zeros(0, dtype=torch.float64))
            self.register_buffer("path_step", torch.tensor(1.0, dtype=torch.float64))
        generator = torch.Generator().manual_seed(seed)
        # standard normal directions and chi-square(2 nu) draws: frequencies W = z sqrt(2nu/chi2)/ell
        self.register_buffer("rff_normal", torch.randn(num_rff, input_dim, generator=generator, dtype=torch.float64))
        self.register_buffer("rff_chi2", _chi2_draws(num_rff, generator))
        self._make_backends()

    def _make_backends(self) -> None:
        """Fresh backend objects (they hold only caches)."""
        if self.input_dim > 1:
            self.backends = {"path": PathBackend(self.features)}
        else:
            self.backends = {
                "spectral": SpectralBackend(),
                "banded": BandedBackend(),
                "quadrature": QuadratureBackend(),
                "recurrence": RecurrenceBackend(self.features, self.kuf),
                "lyapunov": LyapunovBackend(),
                "additive": AdditiveBackend(),
            }

    @property
    def _path_backend(self) -> PathBackend:
        """The backend of path variables (``input_dim > 1``)."""
        return cast(PathBackend, self.backends["path"])

    def backend_for(self, kernel: gpytorch.kernels.Kernel) -> CovarianceBackend:
        """The covariance backend that ``method`` selects for ``kernel`` (module docstring); raises for a kernel
        no backend supports or with non-finite length scales.

        :param kernel: the GP's kernel.
        """
        lengthscale_of(kernel)  # a clear error for NaN/Inf length scales (diverged hyperparameters)
        if self.input_dim > 1:
            return self._path_backend
        if self.backends["additive"].supports(self, kernel):
            return self.backends["additive"]
        if self.method in ("auto", "spectral"):
            for name in ("spectral", "banded"):
                if self.backends[name].supports(self, kernel):
                    return self.backends[name]
            if self.method == "spectral":
                spectral_parts(kernel)  # raises TypeError/ValueError for kernels it cannot handle
            return self.backends["quadrature"]
        if self.method == "lyapunov":
            spectral = cast(SpectralBackend, self.backends["spectral"])
            if spectral.takes_lines(self, kernel):  # a periodic kernel: exact by its lines, no cost that grows with t
                return spectral
            cast(LyapunovBackend, self.backends["lyapunov"]).check(self, kernel)  # a clear error for kernels it cannot handle
        return self.backends[self.method]

    # ------------------------------------------------------------------ basic properties
    @property
    def num_inducing(self) -> int:
        return self.memory.M

    @property
    def measure(self) -> str:
        return self.memory.measure

    @property
    def t(self) -> float:
        """Current end time of the bases."""
        return float(self.breakpoints[-1])

    def extra_repr(self) -> str:
        return f"M={self.num_inducing}, measure={self.measure!r}, t={self.t:g}, method={self.method!r}, input_dim={self.input_dim}"

    _relative_jitter = True

    def input_support(self) -> tuple[float, float] | None:
        """``[lower, t]`` of the bases (1-D inputs; LagT's weights are below ``5e-18`` before :math:`t - 80 \theta`),
        clipped at ``start``; ``None`` for the multidimensional path memory."""
        return support_span(self) if self.input_dim == 1 else None

    def coverage_advice(self, cause: str) -> str:
        """What to change for inputs ``"before"`` or ``"beyond"`` the bases' support, or for ``"too few"`` variables
        (:meth:`~gpytorch_hippo.inducing.base.InducingVariables.coverage_advice`), for this measure.

        :param cause: ``"before"``, ``"beyond"`` or ``"too few"``.
        """
        if cause == "beyond":
            return "call inducing_variables.advance(t_new) with t_new at or beyond the task's last input before update"
        if cause == "before":
            if self.measure in ("legt", "fout"):
                return f"the window theta = {self.memory.theta:g} is shorter than the task: use a larger theta"
            if self.measure == "legs" and self.start <= 0:
                return "LegS bases cover [0, t]: shift the times so that the stream starts at 0 or later (x - x[0])"
            return f"pass start= at or before the stream's first input (now {self.start:g})"
        if self.input_dim > 1:
            return "use more inducing variables (the path memory spreads M bases over every ordered input so far)"
        if self.measure == "legs":
            return "use more inducing variables (HiPPO-LegS: M of about t / lengthscale keeps ~98%)"
        return f"use more inducing variables or a shorter window theta (now {self.memory.theta:g}) for measure {self.measure!r}"

    def _jitter_scale(self, covariance) -> float:
        """Relative jitter (class docstring): the mean of ``diag(Kuu)`` unless ``jitter`` was given."""
        if self.jitter is not None:
            return 1.0
        diagonal = torch.diagonal(to_dense(covariance).detach(), dim1=-2, dim2=-1)
        return max(float(diagonal.mean()), torch.finfo(diagonal.dtype).tiny)

    def advance(self, t_new: float) -> None:
        """Move the bases forward to ``t_new`` (1-D inputs); the recurrence state is carried.

        :param t_new: the new end time, greater than the current :attr:`t` (a number in the inputs' time unit, not a
            calendar time).
        """
        t_new = self.check_advance(t_new)
        self.breakpoints = torch.cat([self.breakpoints, self.breakpoints.new_tensor([t_new])])

    @staticmethod
    def advance_streams(streams: Sequence[HiPPOInducingVariables], targets: Tensor) -> None:
        """``streams[i].advance(targets[i])`` for every stream whose target is not its clock, all checked before any
        moves (a batch of streams, :class:`~.batched.BatchedInducingVariables`); the error names the stream ``i``.

        :param streams: the ``S`` single-stream HiPPO sets (1-D inputs).
        :param targets: the new end times ``(S,)``, float64 on the CPU; a stream whose target equals its clock stays.
        """
        current = stream_clocks(streams)
        moving = targets != current
        bad = ~torch.isfinite(targets) | (targets.abs() > MAX_TIME) | ~(targets > current)
        bad |= torch.tensor([s.input_dim != 1 or s.variational_owner is not None for s in streams])
        for i in (moving & bad).nonzero().squeeze(-1).tolist()[:1]:
            try:
                streams[i].check_advance(float(targets[i]))  # raises the error that advance would
            except (TypeError, ValueError, RuntimeError) as error:
                raise type(error)(f"stream {i}: {error}") from None
        for i in moving.nonzero().squeeze(-1).tolist():
            stream = streams[i]
            stream.breakpoints = torch.cat([stream.breakpoints, stream.breakpoints.new_tensor([float(targets[i])])])

    def check_advance(self, t_new) -> float:
        """``t_new`` as a float, or the error that :meth:`advance` raises for it.

        :param t_new: the proposed new end time (it must exceed the current :attr:`t`).
        """
        if self.input_dim != 1:
            raise RuntimeError("multidimensional HiPPO inducing variables advance with append_path(x_ordered)")
        self._check_movable("advance(t_new)")
        if is_datetime_like(t_new):
            raise TypeError(
                "t_new is a calendar time: convert it with the model's time axis, advance(model.time_axis(t_new)), "
                "or with a gpytorch_hippo.TimeAxis of the unit and origin the inputs use"
            )
        t_new = _check_time(t_new, "t_new")
        if not t_new > self.t:
            raise ValueError(
                f"t_new must be greater than the current t = {self.t}, got {t_new}: a stream moves forward in time, so "
                "give its tasks in time order (sort the rows by time; a TMY3 file mixes years: "
                "gpytorch_hippo.data.solar.load_tmy3 puts them on one)"
            )
        return float(t_new)

    def batched_engine(self):
        """What forms ``S`` such sets' covariances at once in a batch of streams (``batch_shape``): LegS with
        ``method="lyapunov"`` (:class:`~.lyapunov_batched.LyapunovStreams`), else ``None`` (stream by stream)."""
        if self.method == "lyapunov" and self.measure == "legs" and self.input_dim == 1:
            return LyapunovStreams(self.num_inducing)
        return None

    def basis(self, x: Tensor) -> Tensor:
        """:math:`g_m^{(t)}(x)` at the current ``t`` for time inputs ``x`` of shape ``(N,)`` or ``(N, 1)`` -> ``(N, M)``.

        :param x: time inputs ``(N,)`` or ``(N, 1)``, finite; the result has their dtype (integers: the default dtype).
        """
        if self.input_dim != 1:
            raise RuntimeError("basis(x) is defined for 1-D time inputs only")
        x = self._check_inputs(x)[..., 0]
        if x.dim() != 1:
            raise ValueError(f"x must have shape (N,) or (N, 1), got {tuple(x.shape)}")
        return self.memory.basis(x.double(), self.t).to(x.dtype)

    # ------------------------------------------------------------------ the interface
    def Kuf(self, kernel: gpytorch.kernels.Kernel, x: Tensor) -> Tensor:
        r""":math:`[K_{uf}]_{mn} = \int k(x_n, s)\, \phi_m^{(t)}(s)\, \mathrm{d}s` (thesis eq. (4.10)); ``(*batch, M, N)``.

        Exactly zero, whatever the backend, for inputs further than the kernel's reach :math:`R`
        (:func:`.cost.kernel_reach`) from the bases' support ``[lower, t]``: :math:`k(x - s) < 2 \cdot 10^{-18} \sigma^2`
        there.  Only the other inputs reach the backend, so forecasts far past ``t`` cost nothing.

        :param kernel: the GP's kernel :math:`k` (its dtype is that of integer inputs).
        :param x: inputs ``(*batch, N, D)`` (``(N,)`` allowed for 1-D inputs), finite.
        """
        x = self._check_inputs(x, dtype=floating_dtype(kernel))
        backend = self.backend_for(kernel)
        reach = kernel_reach(kernel) if self.input_dim == 1 else None
        if reach is None:
            return backend.Kuf(self, kernel, x)
        lower, upper = support_span(self)
        times = x[..., 0]
        near = (times >= lower - reach) & (times <= upper + reach)
        if bool(near.all()):
            return backend.Kuf(self, kernel, x)
        out = torch.zeros(*times.shape, self.num_inducing, dtype=x.dtype, device=x.device)
        if bool(near.any()):
            values = backend.Kuf(self, kernel, x[near]).mT  # (n_near, M): Kuf is pointwise in x
            out = out.index_put((near,), values.to(out.dtype))
        return out.mT

    def Kuu(self, kernel: gpytorch.kernels.Kernel) -> LinearOperator:
        r""":math:`[K_{uu}]_{mn} = \iint \phi_m^{(t)}(s)\, k(s, s')\, \phi_n^{(t)}(s')\, \mathrm{d}s\, \mathrm{d}s'` (thesis eq. (4.11))
        plus the jitter of the class docstring.

        :param kernel: the GP's kernel :math:`k`.
        """
        return self.add_jitter(self.backend_for(kernel).cross(self, self, kernel))

    def _cross_covariance(self, other: InducingVariables, kernel: gpytorch.kernels.Kernel):
        """``cov(u^{(t)}, u'^{(t')})`` between two HiPPO sets (e.g. the old and new ones of an online update)."""
        if not isinstance(other, HiPPOInducingVariables):
            return super()._cross_covariance(other, kernel)
        if (self.input_dim, self.measure) != (other.input_dim, other.measure):
            raise ValueError("cross-covariance needs two HiPPO sets with the same input_dim and measure")
        cross = self.covariance_without_jitter(other, kernel)
        if self._same_variables(other):
            jitter = self.jitter_value(cross.dtype) * self._jitter_scale(cross)  # cross is Kuu here
            cross = cross + jitter * torch.eye(cross.shape[-1], dtype=cross.dtype, device=cross.device)
        return cross

    def covariance_without_jitter(self, other: HiPPOInducingVariables, kernel: gpytorch.kernels.Kernel) -> Tensor:
        """``cov(u^{(t)}, u'^{(t')})`` without jitter, ``(M, M')``, by the backend both sets select for ``kernel`` (exact
        quadrature where they select different ones).

        :param other: HiPPO inducing variables with the same ``input_dim`` and measure (or ``self``).
        :param kernel: the GP's kernel :math:`k`.
        """
        backend, other_backend = self.backend_for(kernel), other.backend_for(kernel)
        if backend.name != other_backend.name:
            if "recurrence" in (backend.name, other_backend.name):
                raise ValueError(f"cross-covariance between backends {backend.name!r} and {other_backend.name!r} is not defined")
            backend = self.backends["quadrature"]  # e.g. one of two RBF supports is clipped: exact quadrature for both
        return backend.cross(self, other, kernel)

    def _shares_jitter_with(self, other: InducingVariables) -> Tensor:
        """All of the jitter is shared with the same variables (``Kuu_cross`` adds it), none otherwise."""
        return torch.tensor(isinstance(other, HiPPOInducingVariables) and self._same_variables(other))

    def _same_variables(self, other: HiPPOInducingVariables) -> bool:
        return (
            other.memory.extra_repr() == self.memory.extra_repr()
            and torch.equal(other.breakpoints[-1:], self.breakpoints[-1:])
            and (self.input_dim == 1 or torch.equal(other.path_pending, self.path_pending))
        )

    # ------------------------------------------------------------------ multidimensional path (§4.4)
    def append_path(self, x_ordered: Tensor, step: int = 1, kernel: gpytorch.kernels.Kernel | None = None) -> None:
        r"""Extend the path with a task's ordered inputs at times :math:`t + k\, \mathit{dt}, t + 2k\, \mathit{dt}, \dots`
        (:math:`k` = ``step``).

        Uses every ``step``-th input (thesis §4.4: a multiple of ``dt`` as the step).  The previous
        task's inputs are folded into the path memory and dropped; only the new task's inputs
        are kept, until the next call.  Folding uses ``kernel`` (default: the kernel these
        variables were last evaluated with).

        :param x_ordered: the task's inputs ``(N, D)`` in path order, ``N >= 1``.
        :param step: use every ``step``-th input, a positive int; default 1.
        :param kernel: the kernel that folds the previous task into the memory; ``None`` (default): the last one used.
        """
        if self.input_dim == 1:
            raise RuntimeError("append_path is for multidimensional inputs; use advance(t_new) for time inputs")
        self._check_movable("append_path(x_ordered)")
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise ValueError(f"step must be a positive integer, got {step!r}")
        x_ordered = self._check_inputs(x_ordered, "x_ordered", dtype=torch.float64)
        if x_ordered.dim() != 2 or x_ordered.shape[0] < 1:
            raise ValueError(f"x_ordered must have shape (N, {self.input_dim}) with N >= 1, got {tuple(x_ordered.shape)}")
        if self.path_pending.shape[0] > 0:
            kernel = kernel if kernel is not None else self._last_kernel
            if kernel is None:
                raise ValueError("kernel is required to fold the previous task into the path memory")
            self._commit_pending(kernel)
        self.path_pending = x_ordered[::step].detach().to(torch.float64).clone()
        self.path_step = torch.tensor(float(step), dtype=torch.float64, device=self.breakpoints.device)
        self.breakpoints = torch.cat(
            [self.breakpoints, self.breakpoints.new_tensor([self.t + self.path_pending.shape[0] * step * self.dt])]
        )

    def remember_kernel(self, kernel: gpytorch.kernels.Kernel) -> None:
        """Keep ``kernel`` as :meth:`append_path`'s default (the path backend calls this on every evaluation).

        :param kernel: the GP's kernel (held as a plain reference, not a submodule).
        """
        object.__setattr__(self, "_last_kernel", kernel)  # nn.Module.__setattr__ would register it as a submodule

    def _commit_pending(self, kernel) -> None:
        with torch.no_grad():
            self.path_memory = self._path_backend.memory(self, kernel).detach().clone()
        _, lengthscale, _ = spectral_parts(kernel)
        self.path_lengthscale = lengthscale.detach().to(torch.float64).clone()
        self.path_last = self.path_pending[-1:].clone()

    # ------------------------------------------------------------------ validation and state
    def _check_inputs(self, x: Tensor, name: str = "x", dtype: torch.dtype | None = None) -> Tensor:
        """``x`` as ``(*batch, N, D)``, finite, in ``torch.promote_types(x.dtype, dtype)`` (integers: ``dtype``)."""
        x = check_tensor(x, name, dtype=dtype)
        if x.dim() == 1 and self.input_dim == 1:
            x = x[:, None]
        if x.dim() < 2 or x.shape[-1] != self.input_dim:
            raise ValueError(f"{name} must have shape (*batch, N, {self.input_dim}), got {tuple(x.shape)}")
        return x

    def _apply(self, fn, *args, **kwargs):
        """``.to()``/``.cuda()``/``.double()``: caches built on the old device or dtype are dropped."""
        result = super()._apply(fn, *args, **kwargs)
        self._make_backends()
        return result

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """Accept the grown stream state of a saved model (breakpoints and path buffers change size)."""
        for name in ("breakpoints", "path_pending", "path_last", "path_memory", "path_lengthscale"):
            key = prefix + name
            if key in state_dict and hasattr(self, name):
                setattr(self, name, torch.empty_like(state_dict[key]))
        self._make_backends()
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _settings(self) -> dict:
        """Constructor choices whose mismatch would silently change the covariances of a loaded state."""
        memory = self.memory
        settings = {
            "method": self.method,
            "measure": memory.measure,
            "num_inducing": memory.M,
            "theta": memory.theta,
            "discretization": memory.discretization,
            "input_dim": self.input_dim,
            "start": self.start,
            "jitter": self.jitter,
            "num_nodes": self.num_nodes,
            "num_panels": self.num_panels,
        }
        if self.method == "recurrence" or self.input_dim > 1:
            settings.update(num_rff=self.num_rff, features=self.features, kuf=self.kuf)
        return settings

    def get_extra_state(self) -> dict:
        """The recurrence step (its default depends on the ``t`` the set was built with) and the
        constructor choices of :meth:`_settings`, checked when the state is loaded."""
        return {"dt": self.dt, "settings": self._settings()}

    def set_extra_state(self, state: dict) -> None:
        saved = state.get("settings")
        if saved is not None:  # states saved before the settings were recorded load unchecked
            current = self._settings()
            differ = [f"{k}={saved[k]!r} (this object: {current.get(k)!r})" for k in saved if saved[k] != current.get(k)]
            if differ:
                raise ValueError(
                    "the saved HiPPOInducingVariables were built with "
                    + ", ".join(differ)
                    + "; construct the object with the same arguments before load_state_dict"
                )
        self.dt = float(state["dt"])

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("_last_kernel", None)
        return state


def _chi2_draws(num: int, generator: torch.Generator) -> Tensor:
    """Chi-square draws with 1, 3 and 5 degrees of freedom (Matern 1/2, 3/2, 5/2), as sums of squared normals."""
    normals = torch.randn(5, num, generator=generator, dtype=torch.float64) ** 2
    return torch.stack([normals[:1].sum(0), normals[:3].sum(0), normals[:5].sum(0)])


def _refuse_calendar_time(value, name: str) -> None:
    """A ``TypeError`` naming :class:`~gpytorch_hippo.timeaxis.TimeAxis` if ``value`` is a calendar time."""
    if is_datetime_like(value):
        raise TypeError(
            f"{name} is a calendar time: give it as a number of the model's time axis, e.g. {name}=axis(time) with "
            "axis = gpytorch_hippo.TimeAxis('h', origin=first_time), and pass the same axis to OnlineSGPR(time_axis=axis)"
        )


def _check_time(value, name: str) -> float:
    """A finite time of magnitude at most :data:`.cost.MAX_TIME` (beyond it ``t²`` overflows float64)."""
    _refuse_calendar_time(value, name)
    value = check_real(value, name)
    if abs(value) > MAX_TIME:
        raise ValueError(f"{name} must have magnitude at most {MAX_TIME:g} (squared distances overflow beyond), got {value!r}")
    return value


def _batched(cls, batch_shape, *args, **kwargs) -> BatchedInducingVariables:
    """``S`` independent streams' HiPPO bases, each with its own clock ``t[s]`` (``t``: a number or ``(S,)``)."""
    if len(tuple(batch_shape)) != 1 or int(tuple(batch_shape)[0]) < 1:
        raise ValueError(f"batch_shape must be torch.Size([S]) with S >= 1 streams, got {batch_shape!r}")
    size = int(tuple(batch_shape)[0])
    kwargs = dict(inspect.signature(cls.__init__).bind(None, *args, **kwargs).arguments)
    kwargs.pop("self")
    t = kwargs.pop("t", 1.0)
    _refuse_calendar_time(t, "t")
    if kwargs.get("input_dim", 1) != 1:
        raise ValueError("batched streams need 1-D time inputs (input_dim=1): the path memory of multidimensional inputs is per model")
    clocks = torch.as_tensor(t, dtype=torch.float64).detach().cpu()
    if clocks.dim() == 0:
        clocks = clocks.expand(size)
    if clocks.shape != (size,):
        raise ValueError(f"t must be a number or have shape ({size},), got {tuple(clocks.shape)}")
    streams = [cls(t=float(clock), **kwargs) for clock in clocks.tolist()]
    share_equal_buffers(streams)  # the Fourier draws of one seed, the same for every stream
    return BatchedInducingVariables(streams)
