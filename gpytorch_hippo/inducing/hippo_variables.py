"""HiPPO bases as interdomain inducing variables (thesis §4.3, ``sec:hippo_inter``).

``u_m^{(t)} = int f(x) phi_m^{(t)}(x) dx`` with ``phi_m^{(t)} = g_m^{(t)} omega^{(t)}`` the HiPPO
basis times its measure (:mod:`gpytorch_hippo.hippo`).  As for HiPPO memories, the integrals run
over the measure's support from ``start`` (default 0, the start of the stream) to ``t``.

Two backends compute the covariances for 1-D (time) inputs:

* ``"quadrature"`` (beyond the thesis): composite Gauss-Legendre quadrature of
  ``Kuf[m, n] = int k(x_n, s) phi_m(s) ds`` and of the double integral ``Kuu`` (eq.
  ``double_integral_kuu``).  Deterministic, PSD by construction, and exact to round-off for
  smooth kernels (RBF); kernels with a kink (Matern) converge algebraically in the number of
  panels.  Cost ``O(Q^2)`` kernel evaluations with ``Q`` nodes proportional to ``t / lengthscale``:
  it grows with the stream length.
* ``"recurrence"`` (exactly the thesis): ``Kfu`` rows solve the HiPPO ODE driven by ``k(x_n, t)``
  (eq. ``kfu_ode``) on a grid of step ``dt``; ``Kuu = sigma^2/R Z Z^T`` from ``R`` random Fourier
  features of the kernel's spectral density, each projected by the same recurrence (eq. after
  ``kuu_ode_rff``).  With fixed kernel hyperparameters the feature memory ``Z`` is carried from
  one ``advance`` to the next, so ``Kuu`` costs ``O((t_new - t_old)/dt)`` per task whatever the
  stream length; when the length scale changes it is recomputed from ``start`` (the grid is
  deterministic, no data is needed).  LegT/FouT recurrences solve their approximate ODE, so
  they differ from quadrature by the ODE's window gap (see ``docs/results.md``).

Multidimensional inputs (thesis §4.4): the ordered inputs of each task are placed at times
``i dt`` continuing across tasks (:meth:`HiPPOInducingVariables.append_path`), and ``u`` projects
``f`` along that path.  To stay truly online, the path is kept only as its RFF memory
``Z = int [cos(W x(s)), sin(W x(s))] phi(s) ds`` (``W`` the spectral frequencies) evolved by the
recurrence: ``Kuf(x) = sigma^2/R Z [cos(W x), sin(W x)]`` and ``Kuu = sigma^2/R Z Z^T`` need no
stored past inputs.  This replaces the kernel by its RFF approximation in ``Kuf`` as well (the
thesis evaluates ``k(x_n, x(s))`` exactly along the stored path), with a Monte-Carlo error
``O(1/sqrt(R))``.  The current task's inputs are kept until the next ``append_path`` so that
hyperparameters can be trained within a task; memory committed by earlier tasks was built with
their length scale, and a changed length scale then raises an error instead of mixing the two.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import gpytorch
import torch
from gpytorch.kernels import MaternKernel, RBFKernel, ScaleKernel
from linear_operator.operators import LinearOperator
from torch import Tensor

from ..hippo import HiPPO, quadrature_rule
from .base import InducingVariables

SUPPORTED_KERNELS = "RBFKernel or MaternKernel (nu = 0.5, 1.5, 2.5), optionally wrapped in ScaleKernel"
METHODS = ("quadrature", "recurrence")


def spectral_parts(kernel: gpytorch.kernels.Kernel) -> Tuple[Tensor, Tensor, Optional[float]]:
    """``(outputscale, lengthscale (D,), nu)`` of a supported stationary kernel (``nu=None``: RBF)."""
    outputscale = None
    base = kernel
    if isinstance(kernel, ScaleKernel):
        outputscale, base = kernel.outputscale, kernel.base_kernel
    if isinstance(base, RBFKernel):
        nu = None
    elif isinstance(base, MaternKernel) and base.nu in (0.5, 1.5, 2.5):
        nu = float(base.nu)
    else:
        raise TypeError(
            f"HiPPO inducing variables with random Fourier features need a spectral density: "
            f"kernel must be {SUPPORTED_KERNELS}, got {type(base).__name__}"
        )
    lengthscale = base.lengthscale
    if lengthscale.shape[:-2].numel() != 1:
        raise ValueError("batched kernels are not supported by HiPPOInducingVariables (lengthscale has batch dims)")
    lengthscale = lengthscale.reshape(-1)
    if outputscale is None:
        outputscale = torch.ones((), dtype=lengthscale.dtype, device=lengthscale.device)
    elif outputscale.numel() != 1:
        raise ValueError("batched kernels are not supported by HiPPOInducingVariables (outputscale has batch dims)")
    return outputscale.reshape(()), lengthscale, nu


class HiPPOInducingVariables(InducingVariables):
    """``M`` HiPPO inducing variables ``u_m^{(t)} = int f(x) phi_m^{(t)}(x) dx`` (thesis §4.3).

    :param num_inducing: ``M``, the number of basis functions.
    :param measure: ``"legs"`` (keeps the whole past, the thesis's choice), ``"legt"``, ``"lagt"``
        or ``"fout"`` (``M`` odd).
    :param t: current end time of the bases (1-D inputs); moved forward by :meth:`advance`.
    :param theta: window length of LegT/FouT, time scale of LagT.
    :param method: ``"quadrature"`` or ``"recurrence"`` (module docstring).  Multidimensional
        inputs always use the RFF path memory of the recurrence.
    :param num_rff: ``R``, random Fourier features for ``Kuu`` (recurrence, multidimensional).
    :param dt: recurrence step: grid step in time (1-D; default ``(t - start)/500``) or the time
        between consecutive ordered inputs (multidimensional; default 1).
    :param input_dim: ``D``; ``1`` means time inputs, ``> 1`` the path construction of §4.4.
    :param discretization: HiPPO discretisation of the recurrence (default bilinear).
    :param num_nodes: quadrature nodes per panel (default 12); the number of panels follows the
        kernel's length scale (two per length scale) unless ``num_panels`` is given.
    :param start: start of the stream; the integrals run over ``[start, t]``.
    :param seed: seed of the spectral samples (fixed at construction, so that ``Kuu`` of the
        same variables is deterministic and two snapshots share their features).
    :param kuf: recurrence only.  ``"ode"`` (the thesis): ``Kfu`` rows solve the ODE driven by the
        exact kernel.  ``"rff"``: ``Kfu`` from the same random features as ``Kuu``,
        ``sigma^2/R Z^T [cos(W x), sin(W x)]``.  Because ``k_rff(x, x) = sigma^2`` exactly and
        ``Kfu Kuu^{-1} Kuf`` is then a projection of the RFF kernel, predictive variances cannot go
        negative, whereas with ``"ode"`` and few features the Monte-Carlo error of ``Kuu`` alone can
        make ``Kfu Kuu^{-1} Kuf > k(x, x)`` (measured in ``docs/results.md``).

    **Conditioning.** The eigenvalues of ``Kuu`` decay like the kernel's spectral density at
    frequencies ``~ m / t`` (fast for smooth kernels and long streams), so ``Kuu`` is returned with
    the jitter policy of :class:`InducingVariables` (``1e-6`` in float64, ``1e-4`` in float32,
    relative to an outputscale of order one): its condition number is at most
    ``||Kuu|| / jitter``.  Quadrature gives an exactly symmetric PSD matrix before the jitter; the
    RFF estimate ``Z^T Z`` is PSD by construction.
    """

    def __init__(
        self,
        num_inducing: int,
        measure: str = "legs",
        t: float = 1.0,
        theta: float = 1.0,
        method: str = "quadrature",
        num_rff: int = 1000,
        dt: Optional[float] = None,
        input_dim: int = 1,
        discretization: str = "bilinear",
        num_nodes: int = 12,
        num_panels: Optional[int] = None,
        start: float = 0.0,
        jitter: Optional[float] = None,
        seed: int = 0,
        kuf: str = "ode",
    ):
        super().__init__(jitter=jitter)
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        if kuf not in ("ode", "rff"):
            raise ValueError(f"kuf must be 'ode' or 'rff', got {kuf!r}")
        if kuf == "rff" and method != "recurrence":
            raise ValueError("kuf='rff' needs method='recurrence' (the random features live there)")
        self.kuf = kuf
        for name, value in (("num_rff", num_rff), ("input_dim", input_dim), ("num_nodes", num_nodes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if num_panels is not None and (not isinstance(num_panels, int) or num_panels < 1):
            raise ValueError(f"num_panels must be a positive integer or None, got {num_panels!r}")
        if input_dim == 1 and not float(t) > float(start):
            raise ValueError(f"t must be greater than start = {start}, got {t}")
        if dt is not None and not float(dt) > 0:
            raise ValueError(f"dt must be positive, got {dt!r}")
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
        self._rff_cache = None  # (breakpoints, lengthscale, Z) carried between advances (1-D)

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

    def advance(self, t_new: float) -> None:
        """Move the bases forward to ``t_new`` (1-D inputs); the recurrence state is carried."""
        if self.input_dim != 1:
            raise RuntimeError("multidimensional HiPPO inducing variables advance with append_path(x_ordered)")
        self._check_movable("advance(t_new)")
        if not float(t_new) > self.t:
            raise ValueError(f"t_new must be greater than the current t = {self.t}, got {t_new}")
        self.breakpoints = torch.cat([self.breakpoints, self.breakpoints.new_tensor([float(t_new)])])

    def basis(self, x: Tensor) -> Tensor:
        """``g_m^{(t)}(x)`` at the current ``t`` for time inputs ``x`` of shape ``(N,)`` or ``(N, 1)`` -> ``(N, M)``."""
        if self.input_dim != 1:
            raise RuntimeError("basis(x) is defined for 1-D time inputs only")
        x = self._check_inputs(x)[..., 0]
        if x.dim() != 1:
            raise ValueError(f"x must have shape (N,) or (N, 1), got {tuple(x.shape)}")
        return self.memory.basis(x.double(), self.t).to(x.dtype)

    # ------------------------------------------------------------------ the interface
    def Kuf(self, kernel: gpytorch.kernels.Kernel, x: Tensor) -> Tensor:
        """``[Kuf]_{mn} = int k(x_n, s) phi_m^{(t)}(s) ds`` (thesis eq. ``kfu_ode``); ``(*batch, M, N)``."""
        x = self._check_inputs(x)
        if self.input_dim > 1 or self.kuf == "rff":
            outputscale, _, _ = spectral_parts(kernel)
            features = self._rff_features(kernel, x)  # (*batch, N, 2R)
            Z = self._feature_memory(kernel).to(x.dtype)  # (2R, M)
            return (outputscale.to(x.dtype) / self.num_rff) * (features @ Z).mT
        if self.method == "quadrature":
            nodes, weighted_basis = self._quadrature(kernel)
            K = kernel(x, nodes[:, None].to(x.dtype)).to_dense()  # (*batch, N, Q)
            return (K @ weighted_basis.to(x.dtype)).mT
        grid = self._grid()
        K = kernel(x, grid[:, None].to(x.dtype)).to_dense()  # (*batch, N, T): the ODE's input k(x_n, s)
        return self.memory.final_state(K, grid).mT

    def Kuu(self, kernel: gpytorch.kernels.Kernel) -> LinearOperator:
        """``Kuu`` (eq. ``double_integral_kuu``) plus the jitter of :class:`InducingVariables`."""
        return self.add_jitter(self._Kuu_exact(kernel, self))

    def _cross_covariance(self, other: InducingVariables, kernel: gpytorch.kernels.Kernel):
        """``cov(u^{(t)}, u'^{(t')})`` between two HiPPO sets (e.g. the old and new ones of an online update)."""
        if not isinstance(other, HiPPOInducingVariables):
            return super()._cross_covariance(other, kernel)
        cross = self._Kuu_exact(kernel, other)
        if self._same_variables(other):
            cross = cross + self.jitter_value(cross.dtype) * torch.eye(cross.shape[-1], dtype=cross.dtype, device=cross.device)
        return cross

    # ------------------------------------------------------------------ covariance backends
    def _Kuu_exact(self, kernel, other: "HiPPOInducingVariables") -> Tensor:
        if (self.input_dim, self.method) != (other.input_dim, other.method):
            raise ValueError("cross-covariance needs two HiPPO sets with the same input_dim and method")
        if self.method == "quadrature":
            nodes, weighted = self._quadrature(kernel)
            other_nodes, other_weighted = other._quadrature(kernel) if other is not self else (nodes, weighted)
            dtype = _kernel_dtype(kernel)
            K = kernel(nodes[:, None].to(dtype), other_nodes[:, None].to(dtype)).to_dense()
            cov = weighted.to(dtype).mT @ K @ other_weighted.to(dtype)
            return (cov + cov.mT) / 2 if other is self else cov
        if not torch.equal(self.rff_normal, other.rff_normal):
            raise ValueError("cross-covariance by random features needs both sets to share their spectral samples (same seed)")
        outputscale, _, _ = spectral_parts(kernel)
        Z = self._feature_memory(kernel)
        Z_other = Z if other is self else other._feature_memory(kernel)
        return (outputscale / self.num_rff) * (Z.mT @ Z_other).to(outputscale.dtype)

    def _same_variables(self, other: "HiPPOInducingVariables") -> bool:
        return (
            other.memory.extra_repr() == self.memory.extra_repr()
            and torch.equal(other.breakpoints[-1:], self.breakpoints[-1:])
            and (self.input_dim == 1 or torch.equal(other.path_pending, self.path_pending))
        )

    def _quadrature(self, kernel) -> Tuple[Tensor, Tensor]:
        """Composite Gauss-Legendre nodes on ``[start, t]`` and ``weights * g_m^{(t)}(nodes)`` (Q x M)."""
        panels = self.num_panels
        if panels is None:
            lengthscale = _shortest_lengthscale(kernel)
            span = self.t - max(self.start, self.t - self.memory.theta if self.measure in ("legt", "fout") else self.start)
            panels = max(1, math.ceil(2 * span / lengthscale), math.ceil(2 * self.num_inducing / self.num_nodes))
        nodes, weights = quadrature_rule(self.measure, self.t, self.memory.theta, self.num_nodes, self.start, num_panels=panels)
        nodes, weights = nodes.to(self.breakpoints.device), weights.to(self.breakpoints.device)
        return nodes, weights[:, None] * self.memory.basis(nodes, self.t)

    def _grid(self) -> Tensor:
        """The recurrence grid: uniform steps of at most ``dt`` between consecutive breakpoints."""
        pieces = [self.breakpoints[:1]]
        for left, right in zip(self.breakpoints[:-1].tolist(), self.breakpoints[1:].tolist()):
            steps = max(1, math.ceil((right - left) / self.dt - 1e-9))
            pieces.append(torch.linspace(left, right, steps + 1, dtype=torch.float64, device=self.breakpoints.device)[1:])
        return torch.cat(pieces)

    def _frequencies(self, kernel) -> Tensor:
        """Spectral samples ``W`` (R x D) of the kernel: ``z/ell`` (RBF), ``z sqrt(2nu/chi2_{2nu})/ell`` (Matern)."""
        _, lengthscale, nu = spectral_parts(kernel)
        if lengthscale.numel() not in (1, self.input_dim):
            raise ValueError(f"kernel has {lengthscale.numel()} length scales but input_dim = {self.input_dim}")
        directions = self.rff_normal.to(lengthscale.dtype)
        if nu is not None:
            chi2 = self.rff_chi2[(0.5, 1.5, 2.5).index(nu)].to(lengthscale.dtype)
            directions = directions * torch.sqrt(2 * nu / chi2)[:, None]
        return directions / lengthscale

    def _rff_features(self, kernel, x: Tensor) -> Tensor:
        """``[cos(W x), sin(W x)]``: ``(*batch, N, 2R)`` (RFF, thesis §4.3 ``kuu_ode_rff``)."""
        projection = x @ self._frequencies(kernel).to(x.dtype).mT
        return torch.cat([torch.cos(projection), torch.sin(projection)], dim=-1)

    def _feature_memory(self, kernel) -> Tensor:
        """``Z`` (2R x M): HiPPO projections of the random features along the (time or input) path."""
        if self.input_dim > 1:
            return self._path_memory(kernel)
        _, lengthscale, _ = spectral_parts(kernel)
        differentiable = torch.is_grad_enabled() and lengthscale.requires_grad
        cache = self._rff_cache
        if cache is not None and not differentiable and torch.equal(cache[1], lengthscale.detach()):
            done, Z = cache[0], cache[2]
            if torch.equal(done, self.breakpoints):
                return Z
            if done.shape[0] <= self.breakpoints.shape[0] and torch.equal(done, self.breakpoints[: done.shape[0]]):
                grid = self._grid()
                resume = int(torch.nonzero(grid == done[-1])[0])  # carried state: only the new segment
                segment = grid[resume:]
                features = self._rff_features(kernel, segment[:, None].to(Z.dtype)).mT
                Z = self._segment_memory().final_state(features, segment, initial_state=Z)
                self._rff_cache = (self.breakpoints.clone(), cache[1], Z)
                return Z
        grid = self._grid()
        features = self._rff_features(kernel, grid[:, None].to(lengthscale.dtype)).mT  # (2R, T)
        Z = self.memory.final_state(features, grid)
        self._rff_cache = (self.breakpoints.clone(), lengthscale.detach().clone(), Z.detach())
        return Z

    # ------------------------------------------------------------------ multidimensional path (§4.4)
    def append_path(self, x_ordered: Tensor, step: int = 1, kernel: Optional[gpytorch.kernels.Kernel] = None) -> None:
        """Extend the path with a task's ordered inputs at times ``t + k dt, t + 2k dt, ...`` (``k = step``).

        Uses every ``step``-th input (thesis §4.4: a multiple of ``dt`` as the step).  The previous
        task's inputs are folded into the RFF path memory and dropped; only the new task's inputs
        are kept, until the next call.  Folding uses ``kernel`` (default: the kernel these
        variables were last evaluated with).
        """
        if self.input_dim == 1:
            raise RuntimeError("append_path is for multidimensional inputs; use advance(t_new) for time inputs")
        self._check_movable("append_path(x_ordered)")
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise ValueError(f"step must be a positive integer, got {step!r}")
        x_ordered = self._check_inputs(x_ordered)
        if x_ordered.dim() != 2 or x_ordered.shape[0] < 1:
            raise ValueError(f"x_ordered must have shape (N, {self.input_dim}) with N >= 1, got {tuple(x_ordered.shape)}")
        if self.path_pending.shape[0] > 0:
            kernel = kernel if kernel is not None else self.__dict__.get("_last_kernel")
            if kernel is None:
                raise ValueError("kernel is required to fold the previous task into the path memory")
            self._commit_pending(kernel)
        self.path_pending = x_ordered[::step].detach().to(torch.float64).clone()
        self.path_step = torch.tensor(float(step), dtype=torch.float64)
        self.breakpoints = torch.cat(
            [self.breakpoints, self.breakpoints.new_tensor([self.t + self.path_pending.shape[0] * step * self.dt])]
        )

    def _commit_pending(self, kernel) -> None:
        with torch.no_grad():
            self.path_memory = self._path_memory(kernel).detach().clone()
        _, lengthscale, _ = spectral_parts(kernel)
        self.path_lengthscale = lengthscale.detach().to(torch.float64).clone()
        self.path_last = self.path_pending[-1:].clone()

    def _path_memory(self, kernel) -> Tensor:
        if self.path_pending.shape[0] == 0:
            raise RuntimeError("the path is empty: call append_path(x_ordered) before using the inducing variables")
        self.__dict__["_last_kernel"] = kernel  # a plain reference, not a submodule
        _, lengthscale, _ = spectral_parts(kernel)
        committed = self.path_memory.shape[0] > 0
        if committed and not torch.allclose(lengthscale.detach().double(), self.path_lengthscale, rtol=1e-12, atol=0):
            raise RuntimeError(
                "the kernel length scale changed after earlier tasks were folded into the path memory "
                f"({self.path_lengthscale.tolist()} -> {lengthscale.detach().tolist()}); keep it fixed after the first task"
            )
        differentiable = torch.is_grad_enabled() and lengthscale.requires_grad
        cache = self.__dict__.get("_path_cache")
        if (
            not differentiable
            and cache is not None
            and torch.equal(cache[0], self.breakpoints)
            and torch.equal(cache[1], lengthscale.detach())
        ):
            return cache[2]
        Z = self._path_memory_uncached(kernel, lengthscale, committed)
        if not differentiable:
            self.__dict__["_path_cache"] = (self.breakpoints.clone(), lengthscale.detach().clone(), Z)
        return Z

    def _path_memory_uncached(self, kernel, lengthscale: Tensor, committed: bool) -> Tensor:
        dtype = lengthscale.dtype
        spacing = float(self.path_step) * self.dt
        n = self.path_pending.shape[0]
        t_begin = float(self.breakpoints[-2])
        if committed:
            inputs = torch.cat([self.path_last, self.path_pending]).to(dtype)
            times = t_begin + spacing * torch.arange(n + 1, dtype=torch.float64, device=self.breakpoints.device)
            features = self._rff_features(kernel, inputs).mT
            return self._segment_memory().final_state(features, times, initial_state=self.path_memory.to(dtype))
        times = t_begin + spacing * torch.arange(1, n + 1, dtype=torch.float64, device=self.breakpoints.device)
        features = self._rff_features(kernel, self.path_pending.to(dtype)).mT
        return self._segment_memory().final_state(features, times)

    def _segment_memory(self) -> HiPPO:
        """A fresh memory for one-off segment grids, so that :attr:`memory` keeps the cache of the full grid."""
        memory = self.memory
        return HiPPO(memory.measure, memory.M, memory.theta, memory.discretization).to(self.breakpoints.device)

    # ------------------------------------------------------------------ validation
    def _check_inputs(self, x: Tensor) -> Tensor:
        if not isinstance(x, Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() == 1 and self.input_dim == 1:
            x = x[:, None]
        if x.dim() < 2 or x.shape[-1] != self.input_dim:
            raise ValueError(f"x must have shape (*batch, N, {self.input_dim}), got {tuple(x.shape)}")
        if not torch.isfinite(x).all():
            raise ValueError("x contains NaN or infinite values")
        return x

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """Accept the grown stream state of a saved model (breakpoints and path buffers change size)."""
        for name in ("breakpoints", "path_pending", "path_last", "path_memory", "path_lengthscale"):
            key = prefix + name
            if key in state_dict and hasattr(self, name):
                setattr(self, name, torch.empty_like(state_dict[key]))
        self._rff_cache = None
        self.__dict__.pop("_path_cache", None)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("_last_kernel", None)
        return state


def _chi2_draws(num: int, generator: torch.Generator) -> Tensor:
    """Chi-square draws with 1, 3 and 5 degrees of freedom (Matern 1/2, 3/2, 5/2), as sums of squared normals."""
    normals = torch.randn(5, num, generator=generator, dtype=torch.float64) ** 2
    return torch.stack([normals[:1].sum(0), normals[:3].sum(0), normals[:5].sum(0)])


def _shortest_lengthscale(kernel) -> float:
    base = kernel.base_kernel if isinstance(kernel, ScaleKernel) else kernel
    lengthscale = getattr(base, "lengthscale", None)
    if lengthscale is None:
        return float("inf")
    return float(lengthscale.detach().min())


def _kernel_dtype(kernel) -> torch.dtype:
    for parameter in kernel.parameters():
        return parameter.dtype
    return torch.get_default_dtype()
