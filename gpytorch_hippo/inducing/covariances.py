r"""What the HiPPO covariance backends need from a kernel, registered per kernel class, and their interface.

GPflow chooses ``Kuu``/``Kuf`` by multiple dispatch on the pair (inducing variables, kernel).  Here
the inducing variables' ``method`` chooses a backend (:class:`CovarianceBackend`), and every backend
asks one registry what it needs to know about a stationary kernel :math:`k(r) = \sigma^2 \kappa(r / \ell)`: its values
as a function of distance, its reach, its spectral density and how fast that decays, and the Matérn
smoothness :math:`\nu` where the backend exploits a Matérn kernel's structure.  Supporting a new stationary
kernel is one call to :func:`register_stationary_kernel`; which backends then apply follows from the
fields of its :class:`StationaryKernelSpec`:

* ``values``: the Lyapunov backend's local rules (RBF-like kernels) and the banded backend (Matérn);
* ``reach``: inputs beyond it get :math:`K_{uf} = 0` (:func:`.cost.kernel_reach`); the Lyapunov backend's
  local rules;
* ``spectral_density`` and ``spectral_cutoff``: the spectral backend (integrals over frequency up to
  :math:`\mathtt{spectral\_cutoff} / \ell`);
* ``spectral_lines``: the spectral backend for a spectral measure of point masses (periodic kernels), a sum over
  the lines at a cost that does not depend on :math:`t` (:func:`periodic_lines`);
* ``envelope`` and ``rule_lengthscale``: a Matérn or RBF kernel times a periodic one (``ProductKernel``, the
  quasi-periodic kernel :math:`k_e(r) \sum_k q_k \cos(\omega_k r)`, :func:`quasi_periodic_spec`): its ``values`` go to the
  banded and Lyapunov backends' rules in time, on panels that resolve the highest harmonic;
* ``nu``: ``0.5``, ``1.5``, ``2.5``: the banded backend, variational Fourier features and Student-t
  Fourier features (Matérn); ``math.inf``: Gaussian Fourier features (RBF, any input dimension).

The quadrature backend evaluates the kernel itself and needs no registration.  A kernel class is
looked up along its method resolution order, so subclasses of a registered class are supported as
their base is; :class:`~gpytorch.kernels.ScaleKernel` (a registered scale wrapper) around a
registered kernel multiplies it by its ``outputscale``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

import gpytorch
import torch
from gpytorch.kernels import MaternKernel, PeriodicKernel, ProductKernel, RBFKernel, ScaleKernel
from torch import Tensor

__all__ = [
    "DECAY_RANGE",
    "HARMONIC_RADIANS",
    "MAX_LINES",
    "CovarianceCostError",
    "LINE_TOLERANCE",
    "RBF_CUTOFF",
    "CovarianceBackend",
    "KernelParts",
    "Resolved",
    "StationaryKernelSpec",
    "UnsupportedKernelError",
    "describe_kernel",
    "kernel_parts",
    "periodic_lines",
    "quasi_periodic_spec",
    "register_scale_wrapper",
    "register_stationary_kernel",
    "registered_spec",
    "resolve_kernel",
    "supported_kernels",
    "unregister_stationary_kernel",
    "unregistered_factors",
    "unsupported_kernel",
]

#: ``exp(-(Ω ℓ)²/2)`` at ``Ω ℓ = 9.5`` is 2e-20: the RBF spectral density is zero in float64 beyond it
#: (and the RBF kernel below ``2e-20 σ²`` beyond ``9.5 ℓ``)
RBF_CUTOFF = 9.5
#: ``q(x) e^{-x} < 2e-18`` for ``x = λ r >= 48`` and every Matérn ``ν`` in {1/2, 3/2, 5/2}
DECAY_RANGE = 48.0
#: harmonics of a periodic kernel are kept while their weight is at least this times ``σ²`` (:func:`periodic_lines`)
LINE_TOLERANCE = 1e-17
#: most harmonics :func:`periodic_lines` forms (about ``9 / sqrt(ℓ) + 1/ℓ`` are needed: ``ℓ`` below about 3e-4)
MAX_LINES = 4096
#: radians of a quasi-periodic kernel's highest harmonic per rule length scale (:func:`quasi_periodic_spec`): a banded
#: panel of 8 rule length scales holds 24 of them, which its 24 + Gauss-Legendre nodes integrate to round-off
HARMONIC_RADIANS = 3.0


class CovarianceCostError(ValueError):
    """A covariance evaluation would exceed :data:`.cost.MAX_ENTRIES` (or :data:`.cost.MAX_SPECTRAL_NODES`, or
    :data:`MAX_LINES`)."""


@runtime_checkable
class CovarianceBackend(Protocol):
    """What every covariance backend of :class:`~.hippo_variables.HiPPOInducingVariables` provides.

    A backend holds only caches; the inducing variables hold the state (measure, breakpoints,
    spectral samples).  ``a``, ``b`` and ``ivars`` are HiPPO inducing variables (or a view of one
    at another time with the same attributes), typed ``Any`` here: the registry sits below them in the
    import graph.
    """

    #: the ``method`` name the backend is registered under (``"spectral"``, ``"quadrature"``, ...)
    name: str

    def supports(self, ivars: Any, kernel: gpytorch.kernels.Kernel) -> bool:
        """Whether the backend computes these variables' covariances under ``kernel`` (no exception).

        :param ivars: the HiPPO inducing variables.
        :param kernel: the GP's kernel :math:`k`.
        """
        ...

    def cross(self, a: Any, b: Any, kernel: gpytorch.kernels.Kernel) -> Tensor:
        r""":math:`\operatorname{cov}(u_a, u_b)` without jitter, ``(M, M')``; ``Kuu`` when ``b`` is ``a``.

        :param a: the first set of HiPPO inducing variables (``M``).
        :param b: the second set (``M'``), or ``a`` itself.
        :param kernel: the GP's kernel :math:`k`.
        """
        ...

    def Kuf(self, ivars: Any, kernel: gpytorch.kernels.Kernel, x: Tensor) -> Tensor:
        r""":math:`\operatorname{cov}(u, f(x))`, ``(*batch, M, N)`` for inputs ``x`` of shape ``(*batch, N, D)``.

        :param ivars: the HiPPO inducing variables.
        :param kernel: the GP's kernel :math:`k`.
        :param x: inputs ``(*batch, N, D)``, already checked by the inducing variables.
        """
        ...


@dataclass(frozen=True)
class StationaryKernelSpec:
    r"""What the backends know about a stationary kernel :math:`k(r) = \sigma^2 \kappa(|r| / \ell)` (module docstring).

    :param name: a short name, e.g. ``"rbf"`` or ``"matern-1.5"``.
    :param values: ``(r, outputscale, lengthscale) -> k(r)`` for differences ``r`` (any shape),
        differentiable in both hyperparameters (``lengthscale`` a one-element tensor).
    :param reach: :math:`R / \ell` with :math:`k(r) < 2 \cdot 10^{-18} \sigma^2` for :math:`|r| \ge R` (``None``: no such distance
        is known, e.g. for algebraic decay; the local rules then do not apply).
    :param spectral_density: ``(ω, outputscale, lengthscale) -> S(ω)`` in float64 with
        :math:`k(r) = \int S(\omega)\, e^{i \omega r}\, \mathrm{d}\omega` (1-D inputs), or ``None``.
    :param spectral_cutoff: :math:`\Omega \ell` beyond which :math:`S` is zero in float64; given, the spectral
        backend integrates over :math:`[0, \Omega]` (it needs an exponentially decaying density: a rational
        one converges only algebraically); ``None``: not for the frequency rule.
    :param nu: Matérn smoothness ``0.5``, ``1.5`` or ``2.5`` (kernel :math:`\sigma^2 q(\lambda |r|)\, e^{-\lambda |r|}`,
        :math:`\lambda = \sqrt{2\nu}/\ell`), ``math.inf`` for a Gaussian spectral density (RBF), else ``None``.
    :param spectral_lines: ``(outputscale, lengthscale) -> (ω, q)``, each ``(K,)`` float64 and differentiable, with
        :math:`k(r) = \sum_k q_k \cos(\omega_k r)` up to a stated truncation (a spectral measure of point masses,
        e.g. :func:`periodic_lines`), or ``None``.
    :param envelope: for a product of a decaying kernel and a periodic one (:func:`quasi_periodic_spec`), the decaying
        factor's registration (Matérn or RBF), else ``None``.
    :param rule_lengthscale: ``() -> ℓ`` for a kernel without a ``lengthscale`` of its own (a product): the length scale
        the rules in time resolve, which :func:`kernel_parts` returns and ``reach`` is measured in; ``None``: the kernel's.
    """

    name: str
    values: Callable[[Tensor, Tensor, Tensor], Tensor]
    reach: float | None = None
    spectral_density: Callable[[Tensor, Tensor, Tensor], Tensor] | None = None
    spectral_cutoff: float | None = None
    nu: float | None = None
    spectral_lines: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]] | None = None
    envelope: StationaryKernelSpec | None = None
    rule_lengthscale: Callable[[], Tensor] | None = None

    @property
    def matern(self) -> bool:
        r"""Whether the kernel is Matérn with a half-integer :math:`\nu` (the banded backend's kernels)."""
        return self.nu in MATERN_POLYNOMIALS

    @property
    def gaussian(self) -> bool:
        r"""Whether the spectral density is Gaussian (:math:`\nu = \infty`: RBF; product Fourier features in any dimension)."""
        return self.nu == math.inf

    @property
    def kinked(self) -> bool:
        r"""Whether the kernel is analytic in :math:`r` but for a kink at 0: Matérn, or Matérn times periodic (the banded
        rules, split at the input)."""
        return self.matern or (self.envelope is not None and self.envelope.matern)

    @property
    def analytic(self) -> bool:
        r"""Whether the kernel is analytic with a Gaussian envelope: RBF, or RBF times periodic (plain panel rules)."""
        return self.gaussian or (self.envelope is not None and self.envelope.gaussian)

    def matern_nu(self) -> float:
        r""":math:`\nu` of a Matérn kernel; ``TypeError`` for another kernel."""
        if self.nu is None or not self.matern:
            raise TypeError(f"the kernel registration {self.name!r} is not a Matérn kernel with nu = 0.5, 1.5 or 2.5")
        return self.nu

    def known_reach(self) -> float:
        r""":attr:`reach`; ``TypeError`` for a kernel without one (algebraic decay)."""
        if self.reach is None:
            raise TypeError(f"the kernel registration {self.name!r} has no reach (its covariance decays algebraically)")
        return self.reach

    def known_spectrum(self) -> tuple[Callable[[Tensor, Tensor, Tensor], Tensor], float]:
        r"""``(spectral_density, spectral_cutoff)``; ``TypeError`` for a kernel without both."""
        if self.spectral_density is None or self.spectral_cutoff is None:
            raise TypeError(f"the kernel registration {self.name!r} has no spectral density with a cutoff")
        return self.spectral_density, self.spectral_cutoff


class KernelParts(NamedTuple):
    r"""A supported kernel taken apart: its registration, :math:`\sigma^2` (shape ``()``), :math:`\ell` (``(D,)``) and the unwrapped kernel.

    :param spec: the registration of the (unwrapped) kernel.
    :param outputscale: :math:`\sigma^2`, shape ``()`` (``1`` without a scale wrapper), differentiable.
    :param lengthscale: :math:`\ell`, shape ``(D,)`` (``(1,)`` for a kernel without ARD), differentiable.
    :param base: the kernel inside the scale wrapper, or the kernel itself.
    """

    spec: StationaryKernelSpec
    outputscale: Tensor
    lengthscale: Tensor
    base: gpytorch.kernels.Kernel


class Resolved(NamedTuple):
    """A kernel looked up without evaluating its hyperparameters (:func:`resolve_kernel`).

    :param spec: the registration of the (unwrapped) kernel, ``None`` if it has none.
    :param base: the kernel inside the scale wrapper, or the kernel itself.
    :param outputscale: ``kernel -> outputscale`` of the scale wrapper, ``None`` without one.
    """

    #: the registration of the (unwrapped) kernel, ``None`` if it has none
    spec: StationaryKernelSpec | None
    #: the kernel inside the scale wrapper, or the kernel itself
    base: gpytorch.kernels.Kernel
    #: ``kernel -> outputscale`` of the scale wrapper, ``None`` without one
    outputscale: Callable[[gpytorch.kernels.Kernel], Tensor] | None


#: kernel class -> ``kernel -> StationaryKernelSpec | None`` (``None``: this instance is not supported)
_REGISTRY: dict[type, Callable[[gpytorch.kernels.Kernel], StationaryKernelSpec | None]] = {}
#: kernel class -> what it is called in error messages
_DESCRIPTIONS: dict[type, str] = {}
_Unwrap = Callable[[gpytorch.kernels.Kernel], gpytorch.kernels.Kernel]
#: wrapper class -> ``(kernel -> wrapped kernel, kernel -> outputscale)``
_SCALE_WRAPPERS: dict[type, tuple[_Unwrap, Callable[[gpytorch.kernels.Kernel], Tensor]]] = {}


def register_stationary_kernel(
    kernel_class: type,
    spec: StationaryKernelSpec | Callable[[gpytorch.kernels.Kernel], StationaryKernelSpec | None],
    description: str | None = None,
) -> None:
    r"""Register what the backends need for instances of ``kernel_class`` (and its subclasses).

    :param kernel_class: a :class:`gpytorch.kernels.Kernel` subclass with a ``lengthscale``.
    :param spec: the :class:`StationaryKernelSpec` of every instance, or a function of the instance
        returning its spec, or ``None`` for instances that are not supported (e.g. a Matérn :math:`\nu`
        without a closed form).
    :param description: how error messages name the supported instances (default: the class name).

    Registering a class again replaces its entry; :func:`unregister_stationary_kernel` removes it.
    """
    if not (isinstance(kernel_class, type) and issubclass(kernel_class, gpytorch.kernels.Kernel)):
        raise TypeError(f"kernel_class must be a gpytorch Kernel subclass, got {kernel_class!r}")
    if isinstance(spec, StationaryKernelSpec):
        fixed = spec
        spec = lambda kernel: fixed  # noqa: E731
    elif not callable(spec):
        raise TypeError(f"spec must be a StationaryKernelSpec or a function of the kernel, got {type(spec).__name__}")
    _REGISTRY[kernel_class] = spec
    _DESCRIPTIONS[kernel_class] = kernel_class.__name__ if description is None else description


def unregister_stationary_kernel(kernel_class: type) -> None:
    """Remove the entry of ``kernel_class`` (``KeyError`` if it has none).

    :param kernel_class: a class registered with :func:`register_stationary_kernel` (its subclasses' own entries stay).
    """
    del _REGISTRY[kernel_class]
    del _DESCRIPTIONS[kernel_class]


def register_scale_wrapper(
    wrapper_class: type,
    base: Callable[[gpytorch.kernels.Kernel], gpytorch.kernels.Kernel],
    outputscale: Callable[[gpytorch.kernels.Kernel], Tensor],
) -> None:
    r"""Register a kernel class that multiplies a wrapped kernel by a scale: ``base(kernel)`` is the
    wrapped kernel, ``outputscale(kernel)`` the factor :math:`\sigma^2`.

    :param wrapper_class: a :class:`gpytorch.kernels.Kernel` subclass (and its subclasses), e.g. ``ScaleKernel``.
    :param base: ``kernel -> wrapped kernel`` for an instance of ``wrapper_class``.
    :param outputscale: ``kernel -> σ²`` for an instance, a tensor with one element (differentiable).
    """
    if not (isinstance(wrapper_class, type) and issubclass(wrapper_class, gpytorch.kernels.Kernel)):
        raise TypeError(f"wrapper_class must be a gpytorch Kernel subclass, got {wrapper_class!r}")
    _SCALE_WRAPPERS[wrapper_class] = (base, outputscale)


def _lookup(table: dict, kernel):
    for cls in type(kernel).__mro__:
        if cls in table:
            return table[cls]
    return None


def supported_kernels() -> str:
    """The registered kernels in words, as error messages name them."""
    names = list(_DESCRIPTIONS.values())
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
    wrappers = " or ".join(cls.__name__ for cls in _SCALE_WRAPPERS)
    return listed + (f", optionally wrapped in {wrappers}" if wrappers else "")


class UnsupportedKernelError(TypeError):
    """A HiPPO covariance backend chosen by ``method`` does not take the kernel; the message names the kernel's
    unregistered factors and the backend that takes it (``method="quadrature"``: any kernel, 1-D inputs)."""


def describe_kernel(kernel: gpytorch.kernels.Kernel) -> str:
    """The kernel's structure in words, e.g. ``ScaleKernel(ProductKernel(MaternKernel, PeriodicKernel))``.

    :param kernel: a GPyTorch kernel.
    """
    parts = [describe_kernel(sub) for sub in _direct_sub_kernels(kernel)]
    return type(kernel).__name__ + (f"({', '.join(parts)})" if parts else "")


def unregistered_factors(kernel: gpytorch.kernels.Kernel) -> list[str]:
    """The class names of the kernels within ``kernel`` that no registration covers (scale wrappers looked through, the
    parts of sums and products listed), e.g. ``["PeriodicKernel"]`` for Matérn x periodic; ``[]`` for a registered kernel.

    :param kernel: a GPyTorch kernel.
    """
    spec, base, _ = resolve_kernel(kernel)
    if spec is not None:
        return []
    parts = _direct_sub_kernels(base)
    if not parts:
        return [type(base).__name__]
    return list(dict.fromkeys(name for part in parts for name in unregistered_factors(part)))


def _direct_sub_kernels(kernel: gpytorch.kernels.Kernel) -> list[gpytorch.kernels.Kernel]:
    subs = list(kernel.sub_kernels())
    return [sub for sub in subs if not any(sub is not other and sub in other.modules() for other in subs)]


def unsupported_kernel(what: str, kernel: gpytorch.kernels.Kernel, takes: str) -> UnsupportedKernelError:
    """The error of a backend that does not take ``kernel``: the kernel's unregistered factors, the kernels the backend
    takes, and the backend that takes any kernel.

    :param what: the backend, as the message names it (e.g. ``"method='lyapunov'"``).
    :param kernel: the GP's kernel.
    :param takes: the kernels the backend takes, in words.
    """
    factors = unregistered_factors(kernel)
    unregistered = f" ({', '.join(factors)}: no registration)" if factors else ""
    return UnsupportedKernelError(
        f"{what} does not take {describe_kernel(kernel)}{unregistered}: it takes {takes}. "
        "method='quadrature' (or 'auto', which chooses it) takes any kernel with 1-D inputs, exactly, at a cost that grows "
        "with the bases' span in length scales; a sum of kernels is taken part by part (a trend plus a season, "
        "ScaleKernel(MaternKernel()) + ScaleKernel(PeriodicKernel()), by method='lyapunov' at a cost per task that does not "
        "grow with t), and so is a product of one Matérn or RBF kernel and one PeriodicKernel, each with one length scale "
        "and no batch shape (quasi-periodic, ScaleKernel(PeriodicKernel() * MaternKernel())); a stationary kernel class "
        "can be registered with register_stationary_kernel."
    )


def resolve_kernel(kernel: gpytorch.kernels.Kernel) -> Resolved:
    """``(spec or None, base kernel, outputscale function or None)``: a scale wrapper looked through,
    no hyperparameter evaluated (cheap enough for a check on every call).

    :param kernel: a GPyTorch kernel.
    """
    wrapper = _lookup(_SCALE_WRAPPERS, kernel)
    base, outputscale = (kernel, None) if wrapper is None else (wrapper[0](kernel), wrapper[1])
    resolve = _lookup(_REGISTRY, base)
    return Resolved(None if resolve is None else resolve(base), base, outputscale)


def registered_spec(kernel: gpytorch.kernels.Kernel) -> StationaryKernelSpec | None:
    """The spec of ``kernel`` (a scale wrapper looked through), or ``None`` if it is not registered.

    :param kernel: a GPyTorch kernel.
    """
    return resolve_kernel(kernel).spec


def kernel_parts(kernel: gpytorch.kernels.Kernel) -> KernelParts:
    """``(spec, outputscale (), lengthscale (D,), base)`` of a registered kernel.

    ``TypeError`` for a kernel without a registration, ``ValueError`` for a batched kernel
    (length scale or output scale with batch dimensions).

    :param kernel: a registered GPyTorch kernel (optionally in a scale wrapper) without a batch shape.
    """
    spec, base, scale = resolve_kernel(kernel)
    if spec is None:
        raise unsupported_kernel(
            "HiPPO inducing variables with Fourier features (method='spectral' or 'recurrence')",
            kernel,
            f"a registered kernel with a spectral density, {supported_kernels()}",
        )
    outputscale = None if scale is None else scale(kernel)
    lengthscale = base.lengthscale if spec.rule_lengthscale is None else spec.rule_lengthscale()
    if lengthscale.shape[:-2].numel() != 1:
        raise ValueError("batched kernels are not supported by HiPPOInducingVariables (lengthscale has batch dims)")
    lengthscale = lengthscale.reshape(-1)
    if outputscale is None:
        outputscale = torch.ones((), dtype=lengthscale.dtype, device=lengthscale.device)
    elif outputscale.numel() != 1:
        raise ValueError("batched kernels are not supported by HiPPOInducingVariables (outputscale has batch dims)")
    return KernelParts(spec, outputscale.reshape(()), lengthscale, base)


# ---------------------------------------------------------------------- the built-in kernels
def rbf_values(r: Tensor, outputscale: Tensor, lengthscale: Tensor) -> Tensor:
    r""":math:`\sigma^2 \exp(-r^2 / (2\ell^2))`, the RBF kernel's ``values``.

    :param r: differences :math:`x - x'`, any shape.
    :param outputscale: :math:`\sigma^2`, a tensor broadcasting to ``r``.
    :param lengthscale: :math:`\ell`, a one-element tensor; its dtype is the result's.
    """
    return outputscale * torch.exp(-0.5 * (r.to(lengthscale.dtype) / lengthscale) ** 2)


def rbf_spectral_density_of(omega: Tensor, outputscale: Tensor, lengthscale: Tensor) -> Tensor:
    r""":math:`S(\omega) = \sigma^2 \ell / \sqrt{2\pi}\, \exp(-\omega^2 \ell^2 / 2)` (float64), the RBF spectral density.

    :param omega: angular frequencies :math:`\omega`, any shape, float64.
    :param outputscale: :math:`\sigma^2`, a tensor broadcasting to ``omega``.
    :param lengthscale: :math:`\ell`, a one-element tensor.
    """
    ell = lengthscale.reshape(()).double()
    return outputscale.double() * ell / math.sqrt(2 * math.pi) * torch.exp(-0.5 * (omega * ell) ** 2)


#: ``q(y) = Σ_k c_k y^k`` of the Matérn kernel ``σ² q(λr) e^{-λr}``
MATERN_POLYNOMIALS = {0.5: (1.0,), 1.5: (1.0, 1.0), 2.5: (1.0, 1.0, 1.0 / 3.0)}


def _matern_values(nu: float) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    def values(r: Tensor, outputscale: Tensor, lengthscale: Tensor) -> Tensor:
        """``σ² q(λ|r|) e^{-λ|r|}`` on the differences themselves (GPyTorch's pairwise distances lose digits)."""
        x = math.sqrt(2 * nu) * r.abs().to(lengthscale.dtype) / lengthscale
        polynomials: dict[float, Tensor | float] = {0.5: 1.0, 1.5: 1 + x, 2.5: 1 + x + x**2 / 3}
        polynomial = polynomials[nu]
        return outputscale * polynomial * torch.exp(-x)

    return values


def _matern_spectral_density(nu: float) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    def density(omega: Tensor, outputscale: Tensor, lengthscale: Tensor) -> Tensor:
        """``S(ω) = σ² Γ(ν+½)/(Γ(ν)√π) λ^{2ν} / (λ² + ω²)^{ν+½}``, ``λ = √(2ν)/ℓ`` (float64)."""
        rate = math.sqrt(2 * nu) / lengthscale.reshape(()).double()
        constant = math.gamma(nu + 0.5) / (math.gamma(nu) * math.sqrt(math.pi))
        return outputscale.double() * constant * rate ** (2 * nu) / (rate**2 + omega**2) ** (nu + 0.5)

    return density


RBF_SPEC = StationaryKernelSpec(
    "rbf", rbf_values, reach=RBF_CUTOFF, spectral_density=rbf_spectral_density_of, spectral_cutoff=RBF_CUTOFF, nu=math.inf
)
MATERN_SPECS = {
    nu: StationaryKernelSpec(
        f"matern-{nu}", _matern_values(nu), reach=DECAY_RANGE / math.sqrt(2 * nu), spectral_density=_matern_spectral_density(nu), nu=nu
    )
    for nu in MATERN_POLYNOMIALS
}


def periodic_lines(outputscale: Tensor, lengthscale: Tensor, period: Tensor) -> tuple[Tensor, Tensor]:
    r"""The point masses of GPyTorch's periodic kernel :math:`k(r) = \sigma^2 \exp(-2 \sin^2(\pi r / p) / \ell)`.

    With :math:`a = 1/\ell` and :math:`e^{a \cos\theta} = I_0(a) + 2 \sum_{k \ge 1} I_k(a) \cos k\theta` (modified Bessel
    functions), :math:`k(r) = \sigma^2 e^{-a} [I_0(a) + 2 \sum_{k \ge 1} I_k(a) \cos(\omega_k r)]`, :math:`\omega_k = 2\pi k / p`:
    lines ``ω = (0, ω_1, …, ω_K)`` with weights ``q = σ² e^{-a} (I_0, 2 I_1, …, 2 I_K)``, all positive, decreasing in ``k``
    and summing to :math:`\sigma^2`.  The ratios :math:`I_k / I_{k-1} = 1 / (2k/a + I_{k+1}/I_k)` are run downward
    (Miller's algorithm; differentiable in :math:`\ell` and :math:`p`).  Harmonics are kept while
    :math:`q_k \ge` :data:`LINE_TOLERANCE` :math:`\sigma^2`; the weights decrease with decreasing ratios, so the
    dropped tail, which bounds :math:`|k(r) - k_K(r)|` at every :math:`r`, is at most
    :math:`q_{K+1} / (1 - q_{K+2}/q_{K+1}) < 2 \cdot 10^{-16} \sigma^2` (:math:`K` = 16 at :math:`\ell = 0.7`, 264 at
    :math:`\ell = 10^{-3}`).

    :param outputscale: :math:`\sigma^2`, shape ``()``.
    :param lengthscale: :math:`\ell`, one element.
    :param period: :math:`p`, one element.
    :return: ``(ω, q)``, each ``(K + 1,)`` float64.
    """
    a = 1 / lengthscale.reshape(()).double()
    a_value = float(a.detach())
    count = math.ceil(a_value + 9 * math.sqrt(a_value) + 30)
    if not count <= MAX_LINES:  # also NaN
        raise CovarianceCostError(
            f"the periodic kernel's length scale {1 / a_value:.3g} needs about {count:.3g} harmonics (limit MAX_LINES = "
            f"{MAX_LINES}): keep it from collapsing with a constraint, e.g. PeriodicKernel(lengthscale_constraint="
            "gpytorch.constraints.GreaterThan(1e-2)), or raise gpytorch_hippo.inducing.covariances.MAX_LINES"
        )
    ratio = torch.zeros((), dtype=torch.float64, device=a.device)
    ratios = []
    for k in range(count + 30, 0, -1):
        ratio = 1 / (2 * k / a + ratio)
        if k <= count:
            ratios.append(ratio)
    scaled = torch.cumprod(torch.stack([torch.special.i0e(a)] + ratios[::-1]), 0)  # e^{-a} I_k(a), k = 0..count
    kept = int((scaled.detach() >= LINE_TOLERANCE).sum())
    weights = outputscale.double() * torch.cat([scaled[:1], 2 * scaled[1:kept]])
    omega = 2 * math.pi * torch.arange(kept, dtype=torch.float64, device=a.device) / period.reshape(()).double()
    return omega, weights


def _periodic_spec(kernel: PeriodicKernel) -> StationaryKernelSpec | None:
    if kernel.raw_period_length.numel() != 1:
        return None  # one period per input dimension or per batch: not one series of lines

    def values(r: Tensor, outputscale: Tensor, lengthscale: Tensor) -> Tensor:
        period = kernel.period_length.reshape(()).to(lengthscale.dtype)
        return outputscale * torch.exp(-2 * torch.sin(math.pi * r.to(lengthscale.dtype) / period) ** 2 / lengthscale)

    return StationaryKernelSpec(
        "periodic", values, spectral_lines=lambda outputscale, lengthscale: periodic_lines(outputscale, lengthscale, kernel.period_length)
    )


@functools.lru_cache(maxsize=256)
def _harmonics(lengthscale: float) -> int:
    """The number of harmonics :func:`periodic_lines` keeps at a periodic length scale (it depends on nothing else)."""
    one = torch.ones((), dtype=torch.float64)
    return periodic_lines(one, torch.tensor([lengthscale], dtype=torch.float64), one)[0].numel() - 1


def quasi_periodic_spec(kernel: ProductKernel) -> StationaryKernelSpec | None:
    r"""The registration of a product of a Matérn or RBF kernel :math:`k_e` and a periodic kernel (either order, each
    optionally scaled, one length scale each, no batch shape), else ``None``.

    :math:`k(r) = k_e(r) \sum_k q_k \cos(\omega_k r)` (:func:`periodic_lines`; the quasi-periodic kernel of Solin and
    Särkkä, 2014): the spectral measure is :math:`\sum_k q_k/2\, [S_e(\omega - \omega_k) + S_e(\omega + \omega_k)]`, and in time
    the kernel keeps what the exact rules need from :math:`k_e`: its reach (:math:`|k| \le k_e`) and its smoothness (a
    Matérn kink at 0 only, or analytic).  The rules resolve both factors with the rule length scale
    :math:`1 / \ell_r = 1/\ell_e + \omega_K /` :data:`HARMONIC_RADIANS` (:math:`\omega_K` the highest harmonic kept), so
    the banded backend takes the product at a cost linear in :math:`t / \ell_r` and the Lyapunov backend at a cost per
    task that stops growing once :math:`t` exceeds the reach (about :math:`(\text{task} + \text{reach}) / \ell_r` nodes
    per input).

    :param kernel: a ``ProductKernel``.
    """
    factors = list(kernel.kernels)
    if len(factors) != 2:
        return None
    specs = [resolve_kernel(factor).spec for factor in factors]
    if specs[0] is not None and specs[0].spectral_lines is not None:
        factors, specs = factors[::-1], specs[::-1]
    (envelope, periodic), (envelope_spec, periodic_spec) = factors, specs
    if envelope_spec is None or periodic_spec is None or periodic_spec.spectral_lines is None:
        return None
    if envelope_spec.reach is None or not (envelope_spec.matern or envelope_spec.gaussian):
        return None
    if any(resolve_kernel(factor).base.raw_lengthscale.numel() != 1 or factor.batch_shape != torch.Size() for factor in factors):
        return None
    envelope_parts, periodic_parts = kernel_parts(envelope), kernel_parts(periodic)
    envelope_lengthscale = float(envelope_parts.lengthscale.detach())
    highest = 2 * math.pi * _harmonics(float(periodic_parts.lengthscale.detach())) / float(periodic_parts.base.period_length.detach())
    rule = torch.tensor([[1 / (1 / envelope_lengthscale + highest / HARMONIC_RADIANS)]], dtype=envelope_parts.lengthscale.dtype)

    def values(r: Tensor, outputscale: Tensor, lengthscale: Tensor) -> Tensor:
        (e_spec, e_scale, e_ell, _), (p_spec, p_scale, p_ell, _) = kernel_parts(envelope), kernel_parts(periodic)
        return outputscale * e_spec.values(r, e_scale, e_ell) * p_spec.values(r, p_scale, p_ell)

    return StationaryKernelSpec(
        f"{envelope_spec.name} x periodic",
        values,
        reach=envelope_spec.reach * envelope_lengthscale / float(rule),
        envelope=envelope_spec,
        rule_lengthscale=lambda: rule.to(envelope_parts.lengthscale.device),
    )


register_stationary_kernel(RBFKernel, RBF_SPEC)
register_stationary_kernel(MaternKernel, lambda kernel: MATERN_SPECS.get(kernel.nu), "MaternKernel (nu = 0.5, 1.5, 2.5)")
register_stationary_kernel(PeriodicKernel, _periodic_spec, "PeriodicKernel (one period)")
register_stationary_kernel(ProductKernel, quasi_periodic_spec, "a ProductKernel of one Matérn or RBF kernel and one PeriodicKernel")
register_scale_wrapper(ScaleKernel, lambda kernel: kernel.base_kernel, lambda kernel: kernel.outputscale)
