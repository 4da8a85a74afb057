r"""Covariance backends of :class:`~gpytorch_hippo.inducing.HiPPOInducingVariables`.

Each backend is a small object with the interface :class:`~.covariances.CovarianceBackend`, the
(feature, kernel) covariances of GPflow's design: ``supports(ivars, kernel)``, ``cross(a, b, kernel)``
-> :math:`\operatorname{cov}(u_a, u_b)` without jitter (``M x M'``) and ``Kuf(a, kernel, x)`` -> ``(*batch, M, N)``.
The inducing-variable object holds the state (measure, breakpoints, spectral samples); a backend
holds only caches.  What a backend needs from the kernel (spectral density, values, reach, Matérn
:math:`\nu`) comes from the kernel's registration (:mod:`.covariances`), so a kernel registered there is
supported by every backend whose needs its registration meets.

* :class:`SpectralBackend` (beyond the thesis; exact, RBF kernels and any kernel registered with a
  ``spectral_cutoff``): ``Kuu`` and ``Kuf`` as
  integrals over frequency of the closed-form HiPPO transforms (:mod:`.spectral`).  A
  Gauss-Legendre rule on :math:`[0, 9.5/\ell]` with :math:`\Omega B / 4 + M + 40` nodes (:math:`B` the phase
  bandwidth: the supports' width plus their distance) integrates to round-off; the cost is
  :math:`O((t/\ell + M) M^2)` for ``Kuu``, linear in the stream length.  A kernel whose spectral measure is a
  series of point masses (``spectral_lines``: the periodic kernel, :func:`.covariances.periodic_lines`) needs no
  rule: the integrals are sums over its :math:`K` lines, :math:`O(K M^2)` whatever :math:`t` is.
* :class:`AdditiveBackend` (a sum of kernels, :math:`k = \sum_j k_j`): covariances are linear in the kernel, so
  ``Kuu``, ``Kuf`` and the cross covariance are the sums of each part's, each from the backend ``method`` selects
  for that part.
* :class:`QuadratureBackend` (exact, any kernel): composite Gauss-Legendre in time,
  :math:`O((t/\ell)^2)` kernel evaluations.
* :class:`RecurrenceBackend` (the thesis, 1-D): :math:`K_{uu} = Z^\top Z` with :math:`Z` the HiPPO memory of
  Fourier features (random, or deterministic quadrature nodes), carried across ``advance``;
  ``Kuf`` from the same features (default) or from the ODE driven by the exact kernel.
* :class:`PathBackend` (thesis §4.4, multidimensional inputs): the random-feature memory along the
  ordered input path.
* :class:`~.lyapunov.LyapunovBackend` (beyond the thesis; exact, LegS, RBF and Matérn, and either times a periodic
  kernel, :func:`.covariances.quasi_periodic_spec`): the LegS
  ODE :math:`\mathrm{d}c/\mathrm{d}t = (A c + B f(t)) / t` (thesis eqs. (2.10), (2.14), (2.15)) is
  time-invariant in :math:`\tau = \log t`, so :math:`K_{uu} = \operatorname{cov}(c)` obeys the Lyapunov ODE
  :math:`\mathrm{d}K/\mathrm{d}\tau = A K + K A^\top + B k^\top + k B^\top` with :math:`k(t) = K_{uf}(t, x = t)`, and
  :math:`\operatorname{cov}(c(t_a), c(t_b))` the ODE :math:`\mathrm{d}C/\mathrm{d}\tau_b = C A^\top + K_{uf}(t_a, x = t_b) B^\top`.
  Integrated exactly over a step by variation of constants (:math:`\Phi = e^{A \Delta\tau}` is the re-expansion of the
  bases, :math:`e^{As} B = e^{-s} g(e^{-s})`), the forcing terms become covariances of the new segment :math:`[t_a, t_b]`
  and of :math:`K_{uf}(t_a, \cdot)` within the kernel's reach of :math:`t_a`: :math:`K(t)` is carried across ``advance``
  at a cost per step that depends on :math:`t_b - t_a` but not on :math:`t`; ``Kuf`` by a local rule, :math:`O(M)` per
  input.
"""

from __future__ import annotations

import math

import gpytorch
import torch
from torch import Tensor

from .._validation import floating_dtype
from ..hippo import HiPPO, quadrature_rule
from .cost import MAX_SPECTRAL_NODES, check_work
from .covariances import RBF_CUTOFF, kernel_parts
from .spectral import gauss_legendre, hippo_support, hippo_transform, kernel_signature

#: largest block of ``k(x, nodes)`` that :meth:`QuadratureBackend.Kuf` forms at once
QUADRATURE_CHUNK_ENTRIES = 2**24


def _shortest_lengthscale(kernel) -> float:
    try:  # a registered kernel: the length scale its rules resolve (a quasi-periodic product's, set by its harmonics)
        return float(kernel_parts(kernel).lengthscale.detach().min())
    except (TypeError, ValueError):
        pass
    for module in kernel.modules():
        lengthscale = getattr(module, "lengthscale", None)
        if isinstance(lengthscale, Tensor):
            return float(lengthscale.detach().min())
    return float("inf")


def _span(ivars) -> tuple[float, float]:
    """``[lower, t]``: the support of the measure clipped at the stream start."""
    t, theta = ivars.t, ivars.memory.theta
    lower = ivars.start
    if ivars.measure == "legs":
        lower = max(0.0, ivars.start)
    elif ivars.measure in ("legt", "fout"):
        lower = max(t - theta, ivars.start)
    return lower, t


class QuadratureBackend:
    r"""Composite Gauss-Legendre quadrature in time of :math:`K_{uf}` and the double integral :math:`K_{uu}` (thesis eq. (4.11),
    :math:`[K_{uu}^{(t)}]_{lm} = \iint k(x, x') \phi_l^{(t)}(x) \phi_m^{(t)}(x') \mathrm{d}x \mathrm{d}x'`)."""

    name = "quadrature"

    def supports(self, ivars, kernel) -> bool:
        """Whether ``ivars`` have 1-D (time) inputs; any kernel.

        :param ivars: the HiPPO inducing variables.
        :param kernel: the GP's kernel :math:`k` (not restricted).
        """
        return ivars.input_dim == 1

    def rule(self, ivars, kernel) -> tuple[Tensor, Tensor]:
        r"""Nodes on ``[lower, t]`` and :math:`w_q\, g_m^{(t)}(x_q)` at the nodes (``Q x M``).

        Default: one panel per length scale with ``max(num_nodes, ceil(M / panels) + 24)`` nodes, so
        that the panels together integrate the degree :math:`M - 1` basis (whose oscillations crowd
        the ends of the support) times the kernel.  Uniform panels of 12 nodes -- this backend's
        earlier rule -- missed :math:`K_{uu}` by 27% at :math:`M = 150`, :math:`t/\ell = 8`.

        :param ivars: the HiPPO inducing variables (their ``num_nodes`` and ``num_panels`` set the rule).
        :param kernel: the GP's kernel; its shortest length scale sets the default panels.
        """
        panels, nodes_per_panel = self.layout(ivars, kernel)
        check_work(float(panels) * nodes_per_panel * ivars.num_inducing, "the quadrature rule (nodes x M)", ivars, kernel)
        nodes, weights = quadrature_rule(ivars.measure, ivars.t, ivars.memory.theta, nodes_per_panel, ivars.start, num_panels=panels)
        device = ivars.breakpoints.device
        nodes, weights = nodes.to(device), weights.to(device)
        return nodes, weights[:, None] * ivars.memory.basis(nodes, ivars.t)

    def layout(self, ivars, kernel) -> tuple[int, int]:
        """``(panels, nodes per panel)`` of :meth:`rule`.

        :param ivars: the HiPPO inducing variables (``num_panels`` given: that layout, ``num_nodes`` per panel).
        :param kernel: the GP's kernel; its shortest length scale sets the default number of panels.
        """
        panels, nodes_per_panel = ivars.num_panels, ivars.num_nodes
        if panels is None:
            lower, t = _span(ivars)
            panels = max(1, math.ceil((t - lower) / _shortest_lengthscale(kernel)))
            nodes_per_panel = max(nodes_per_panel, math.ceil(ivars.num_inducing / panels) + 24)
        return panels, nodes_per_panel

    def size(self, ivars, kernel) -> int:
        """Number of nodes of :meth:`rule`.

        :param ivars: the HiPPO inducing variables.
        :param kernel: the GP's kernel :math:`k`.
        """
        panels, nodes_per_panel = self.layout(ivars, kernel)
        return panels * nodes_per_panel

    def Kuf(self, ivars, kernel, x: Tensor) -> Tensor:
        r""":math:`\operatorname{cov}(u, f(x)) = \sum_q k(x, x_q)\, w_q\, g_m^{(t)}(x_q)`: ``(*batch, M, N)`` in ``x``'s dtype.

        :param ivars: the HiPPO inducing variables.
        :param kernel: the GP's kernel :math:`k`.
        :param x: inputs ``(*batch, N, 1)``.
        """
        nodes, weighted_basis = self.rule(ivars, kernel)
        nodes, weighted_basis = nodes[:, None].to(x.dtype), weighted_basis.to(x.dtype)
        chunk = max(1, QUADRATURE_CHUNK_ENTRIES // nodes.shape[0])  # k(x, nodes) in blocks: memory O(Q + N M)
        blocks = [
            kernel(x[..., start : start + chunk, :], nodes).to_dense() @ weighted_basis for start in range(0, max(x.shape[-2], 1), chunk)
        ]
        return torch.cat(blocks, dim=-2).mT

    def cross(self, a, b, kernel) -> Tensor:
        r""":math:`\operatorname{cov}(u_a, u_b)` without jitter by the double rule, ``(M, M')`` in the kernel's dtype;
        ``Kuu`` (symmetrised) when ``b`` is ``a``.

        :param a: the first set of HiPPO inducing variables.
        :param b: the second set, or ``a`` itself.
        :param kernel: the GP's kernel :math:`k`.
        """
        # k(nodes, nodes') has Q Q' entries: that many kernel evaluations, formed a block of rows at a time
        check_work(float(self.size(a, kernel)) * self.size(b, kernel), "the quadrature Kuu (node pairs)", a, kernel)
        nodes, weighted = self.rule(a, kernel)
        other_nodes, other_weighted = (nodes, weighted) if b is a else self.rule(b, kernel)
        dtype = floating_dtype(kernel)
        nodes, other_nodes = nodes[:, None].to(dtype), other_nodes[:, None].to(dtype)
        weighted, other_weighted = weighted.to(dtype), other_weighted.to(dtype)
        chunk = max(1, QUADRATURE_CHUNK_ENTRIES // other_nodes.shape[0])
        cov = sum(
            (weighted[start : start + chunk].mT @ kernel(nodes[start : start + chunk], other_nodes).to_dense()) @ other_weighted
            for start in range(0, nodes.shape[0], chunk)
        )
        return (cov + cov.mT) / 2 if b is a else cov


class SpectralBackend:
    r"""Exact :math:`K_{uu}`/:math:`K_{uf}` by quadrature over frequency (module :mod:`.spectral`), RBF kernels (any kernel
    registered with a spectral density and a ``spectral_cutoff``, :mod:`.covariances`).

    :math:`K_{uf}` at inputs inside the support uses the nodes of :math:`K_{uu}`, so that :math:`K_{uf} = F^\top \psi(x)` and
    :math:`K_{uu} = F^\top F` come from one feature map and the Nyström residual :math:`k(x, x) - K_{fu} K_{uu}^{-1} K_{uf}` is
    non-negative up to round-off; inputs further away get a rule with a (power-of-two) wider band.
    """

    name = "spectral"

    def __init__(self) -> None:
        self._transforms: dict = {}

    def supports(self, ivars, kernel) -> bool:
        """Whether ``ivars`` are 1-D with a support not clipped by ``start`` (:func:`.spectral.hippo_support`) and
        ``kernel`` is registered with a spectral density and a ``spectral_cutoff`` (RBF), with one length scale.

        :param ivars: the HiPPO inducing variables.
        :param kernel: the GP's kernel :math:`k`.
        """
        if ivars.input_dim != 1:
            return False
        try:
            spec, _, lengthscale, _ = kernel_parts(kernel)
        except (TypeError, ValueError):  # not registered, or a batched kernel
            return False
        fast_decay = spec.spectral_density is not None and spec.spectral_cutoff is not None
        return (fast_decay or spec.spectral_lines is not None) and lengthscale.numel() == 1 and self._support(ivars) is not None

    def takes_lines(self, ivars, kernel) -> bool:
        """Whether :meth:`supports` holds and the kernel's spectral measure is a series of point masses (a periodic
        kernel): then the cost does not depend on ``t``.

        :param ivars: the HiPPO inducing variables.
        :param kernel: the GP's kernel :math:`k`.
        """
        return self.supports(ivars, kernel) and kernel_parts(kernel).spec.spectral_lines is not None

    def _support(self, ivars):
        return hippo_support(ivars.measure, ivars.num_inducing, ivars.memory.theta, ivars.t, ivars.start)

    def _rule(self, kernel, bandwidth: float, num_inducing: int, device, ivars=None) -> tuple[Tensor, Tensor]:
        """Nodes ``ω_q`` on ``[0, Ω]`` and the differentiable scales ``sqrt(2 w_q S(ω_q))``; a kernel's spectral lines
        ``(ω_k, sqrt(q_k))`` where it has them (whatever the band: no rule, no cost that grows with ``t``)."""
        spec, outputscale, lengthscale, _ = kernel_parts(kernel)
        if spec.spectral_lines is not None:
            omega, weights = spec.spectral_lines(outputscale, lengthscale)
            return omega.to(device), weights.sqrt().to(device)
        spectral_density, spectral_cutoff = spec.known_spectrum()
        # Ω rounded up to a grid of 2^(1/8) steps: while a length scale is trained the nodes, and the
        # cached transforms at them, stay put (a wider Ω only adds negligible spectral tail)
        cutoff = 2 ** (math.ceil(8 * math.log2(spectral_cutoff / float(lengthscale.detach()))) / 8)
        estimate = cutoff * bandwidth / 4 + num_inducing + 40
        # the Gauss-Legendre rule costs O(nodes²) once; the transforms about 5 nodes x M values
        check_work(estimate, "the spectral rule (frequency nodes)", ivars, kernel, limit=MAX_SPECTRAL_NODES)
        check_work(5 * estimate * num_inducing, "the spectral features (5 x nodes x M)", ivars, kernel)
        num_nodes = math.ceil(estimate)
        step = 2 ** max(0, num_nodes.bit_length() - 4)  # round up (< 1/8 more): cached rules serve many tasks
        num_nodes = -(-num_nodes // step) * step
        z, w = gauss_legendre(num_nodes, device=device)
        omega = cutoff * (z + 1) / 2
        density = spectral_density(omega, outputscale, lengthscale)
        return omega, torch.sqrt(cutoff * w * density)  # 2 * (Ω/2) w * S

    def _features(self, ivars, omega: Tensor, scale: Tensor) -> Tensor:
        """``F = sqrt(2wS) [Re ĉ; Im ĉ]``: ``(2Q, M)`` float64 (the transform at the nodes is cached)."""
        if omega.requires_grad:  # lines that move with a trained period: differentiable, not cached
            return torch.cat([scale, scale])[:, None] * self._transform(ivars, omega)
        key = (ivars.measure, ivars.num_inducing, ivars.memory.theta, ivars.t, ivars.start, omega.shape[0], float(omega[-1]), omega.device)
        if key not in self._transforms:
            if len(self._transforms) >= 4:  # the current and the old variables of an online update, a wider band
                self._transforms.pop(next(iter(self._transforms)))
            self._transforms[key] = self._transform(ivars, omega)
        return torch.cat([scale, scale])[:, None] * self._transforms[key]

    def _transform(self, ivars, omega: Tensor) -> Tensor:
        """``[Re ĉ; Im ĉ]`` at the frequencies: ``(2Q, M)`` float64."""
        centre, _ = self._support(ivars)
        D = hippo_transform(ivars.measure, ivars.num_inducing, ivars.memory.theta, ivars.t, ivars.start, omega)
        chat = torch.polar(torch.ones_like(omega), omega * centre)[:, None] * D
        return torch.cat([chat.real, chat.imag])

    def _bucket(self, half_width: float, needed: float) -> float:
        """The band ``2h 2^k >= needed``: inputs inside the support share the nodes of ``Kuu``."""
        base = 2 * half_width
        return base * 2 ** max(0, math.ceil(math.log2(max(needed, base) / base) - 1e-12))

    def cross(self, a, b, kernel) -> Tensor:
        r""":math:`\operatorname{cov}(u_a, u_b) = F_a^\top F_b` without jitter, ``(M, M')`` in the kernel's dtype.

        :param a: the first set of HiPPO inducing variables.
        :param b: the second set, or ``a`` itself (then ``Kuu``).
        :param kernel: the GP's kernel :math:`k`.
        """
        (centre_a, half_a), (centre_b, half_b) = self._support(a), self._support(b)
        band = self._bucket(half_a, abs(centre_a - centre_b) + half_a + half_b)
        omega, scale = self._rule(kernel, band, max(a.num_inducing, b.num_inducing), a.breakpoints.device, a)
        F_a = self._features(a, omega, scale)
        F_b = F_a if b is a else self._features(b, omega, scale)
        return (F_a.mT @ F_b).to(floating_dtype(kernel))

    def Kuf(self, ivars, kernel, x: Tensor) -> Tensor:
        r""":math:`\operatorname{cov}(u, f(x)) = F^\top \psi(x)`: ``(*batch, M, N)`` in ``x``'s dtype.

        :param ivars: the HiPPO inducing variables.
        :param kernel: the GP's kernel :math:`k`.
        :param x: inputs ``(*batch, N, 1)``.
        """
        centre, half_width = self._support(ivars)
        times = x[..., 0].double()
        reach = float((times.detach() - centre).abs().max()) if times.numel() else 0.0
        band = self._bucket(half_width, half_width + reach)
        omega, scale = self._rule(kernel, band, ivars.num_inducing, ivars.breakpoints.device, ivars)
        F = self._features(ivars, omega, scale)
        root = torch.cat([scale, scale])[:, None]
        chunk = max(1, 2**24 // (2 * omega.shape[0]))  # ψ(x) in blocks of <= 2^24 entries: memory O(Q + N M)
        blocks = []
        for start in range(0, max(times.shape[-1], 1), chunk):
            phase = omega[:, None] * times[..., None, start : start + chunk]  # (*batch, Q, n)
            blocks.append(F.mT @ (root * torch.cat([torch.cos(phase), torch.sin(phase)], dim=-2)))
        return torch.cat(blocks, dim=-1).to(x.dtype)


class FourierFeatures:
    r"""Fourier features :math:`\psi(x) = \sqrt{a_q}\, [\cos(W x), \sin(W x)]` with :math:`k(x, x') \approx \psi(x)^\top \psi(x')`.

    ``"random"`` (the thesis): :math:`R` spectral samples :math:`W` of the kernel and :math:`a = \sigma^2/R`.
    ``"quadrature"``: Gauss-Legendre nodes over frequency and :math:`a = 2 w S(\omega)`, deterministic and exact in
    the limit: a tensor-product rule on :math:`[0, 9.5/\ell]` (RBF, any :math:`D`, about :math:`R` nodes) or, in 1-D,
    :math:`R` nodes on :math:`\omega = \lambda \tan(\varphi)`, :math:`\varphi \in [0, \pi/2)` (Matérn,
    :math:`\lambda = \sqrt{2\nu}/\ell`).

    :param kind: ``"random"`` or ``"quadrature"``.
    """

    def __init__(self, kind: str):
        self.kind = kind

    def frequencies_and_weights(self, ivars, kernel) -> tuple[Tensor, Tensor]:
        r"""The frequencies :math:`W` ``(R', D)`` and weights :math:`a` ``(R',)`` of :math:`\psi`, in the length scale's dtype.

        :param ivars: the HiPPO inducing variables (their spectral samples ``rff_normal``, ``rff_chi2`` and ``num_rff``).
        :param kernel: the GP's kernel, registered with a Gaussian (RBF) or Matérn spectral density.
        """
        spec, outputscale, lengthscale, _ = kernel_parts(kernel)
        if lengthscale.numel() not in (1, ivars.input_dim):
            raise ValueError(f"kernel has {lengthscale.numel()} length scales but input_dim = {ivars.input_dim}")
        if not (spec.gaussian or spec.matern):
            raise TypeError(
                f"Fourier features need a Gaussian (RBF) or Matérn (nu = 0.5, 1.5, 2.5) spectral density; the kernel's "
                f"registration {spec.name!r} has neither: use method='spectral' or 'quadrature'"
            )
        if self.kind == "random":
            directions = ivars.rff_normal.to(lengthscale.dtype)
            if spec.matern:
                nu = spec.matern_nu()
                chi2 = ivars.rff_chi2[(0.5, 1.5, 2.5).index(nu)].to(lengthscale.dtype)
                directions = directions * torch.sqrt(2 * nu / chi2)[:, None]
            weights = (outputscale / ivars.num_rff).expand(ivars.num_rff)
            return directions / lengthscale, weights
        if spec.gaussian:
            return self._rbf_product_rule(ivars, kernel, outputscale, lengthscale)
        if ivars.input_dim != 1:
            raise TypeError("quadrature features in more than one dimension need an RBF kernel (a product spectral density)")
        z, w = gauss_legendre(ivars.num_rff, device=ivars.breakpoints.device)
        nu = spec.matern_nu()
        rate = math.sqrt(2 * nu) / lengthscale.reshape(()).double()
        angle = math.pi / 4 * (z + 1)
        omega = rate * torch.tan(angle)
        constant = math.gamma(nu + 0.5) / (math.gamma(nu) * math.sqrt(math.pi))
        # S(ω) dω = σ² c cos^{2ν-1}(φ) dφ under ω = λ tan φ
        weights = 2 * (math.pi / 4) * w * outputscale.double() * constant * torch.cos(angle) ** (2 * nu - 1)
        return omega[:, None].to(lengthscale.dtype), weights.to(lengthscale.dtype)

    @staticmethod
    def _rbf_product_rule(ivars, kernel, outputscale: Tensor, lengthscale: Tensor) -> tuple[Tensor, Tensor]:
        """Tensor-product Gauss-Legendre rule for ``S(ω) = σ² Π_d ℓ_d/√(2π) exp(-ω_d²ℓ_d²/2)``.

        ``n = round(R^{1/D})`` nodes per dimension (``n^D`` features: for small ``D``): the first
        coordinate on ``[0, Ω_0]`` (the integrand is even in ``ω``, hence the factor 2), the others on
        ``[-Ω_d, Ω_d]``, ``Ω_d = 9.5/ℓ_d``.
        """
        dims = ivars.input_dim
        per_dim = max(2, round(ivars.num_rff ** (1 / dims)))
        z, w = gauss_legendre(per_dim, device=ivars.breakpoints.device)
        ell = lengthscale.double().expand(dims)
        axes, axis_weights = [], []
        for d in range(dims):
            # nodes ω = Ω_d u at fixed u: the rule moves with ℓ_d, so the features are a function of x/ℓ
            # and their gradient in ℓ is that of the values computed (L-BFGS needs the two to agree);
            # the weights Ω_d (1 - low)/2 w S_d(Ω_d u) do not depend on ℓ_d
            low = 0.0 if d == 0 else -1.0
            u = low + (1 - low) / 2 * (z + 1)
            axes.append(RBF_CUTOFF / ell[d] * u)
            axis_weights.append(RBF_CUTOFF * (1 - low) / 2 * w * torch.exp(-0.5 * (RBF_CUTOFF * u) ** 2) / math.sqrt(2 * math.pi))
        grid = torch.cartesian_prod(*axes).reshape(-1, dims)
        weights = torch.cartesian_prod(*axis_weights).reshape(-1, dims).prod(-1)
        return grid.to(lengthscale.dtype), (2 * outputscale.double() * weights).to(lengthscale.dtype)

    def __call__(self, ivars, kernel, x: Tensor) -> Tensor:
        r""":math:`\psi(x)`: ``(*batch, N, 2R)``."""
        frequencies, weights = self.frequencies_and_weights(ivars, kernel)
        projection = x @ frequencies.to(x.dtype).mT
        root = weights.to(x.dtype).sqrt()
        return torch.cat([root * torch.cos(projection), root * torch.sin(projection)], dim=-1)


class RecurrenceBackend:
    """The thesis's recurrence (Chen et al. (2025), thesis eq. (4.10) and §4.3.2) for time inputs, features carried
    across ``advance``.

    :param features: the kind of :class:`FourierFeatures`, ``"random"`` or ``"quadrature"``.
    :param kuf: ``"rff"``: :math:`K_{uf}` from the same features as :math:`K_{uu}`; ``"ode"``: from the HiPPO ODE driven by the exact
        kernel (:class:`~.hippo_variables.HiPPOInducingVariables`).
    """

    name = "recurrence"

    def __init__(self, features: str, kuf: str):
        self.features = FourierFeatures(features)
        self.kuf = kuf
        self._cache: tuple[tuple, Tensor, Tensor] | None = None  # (signature, breakpoints, Z)

    def supports(self, ivars, kernel) -> bool:
        """Whether ``ivars`` have 1-D (time) inputs.

        :param ivars: the HiPPO inducing variables.
        :param kernel: the GP's kernel :math:`k` (checked where it is used).
        """
        return ivars.input_dim == 1

    def grid(self, ivars) -> Tensor:
        """Uniform steps of at most ``dt`` between consecutive breakpoints: the times ``(T,)``, float64.

        :param ivars: the HiPPO inducing variables (their ``breakpoints`` and ``dt``).
        """
        bounds = list(zip(ivars.breakpoints[:-1].tolist(), ivars.breakpoints[1:].tolist()))
        counts = [max(1, (right - left) / ivars.dt - 1e-9) for left, right in bounds]
        check_work(sum(counts), f"the recurrence grid (steps of dt = {ivars.dt:g})", ivars)
        pieces = [ivars.breakpoints[:1]]
        for (left, right), count in zip(bounds, counts):
            steps = math.ceil(count)
            pieces.append(torch.linspace(left, right, steps + 1, dtype=torch.float64, device=ivars.breakpoints.device)[1:])
        return torch.cat(pieces)

    def _check_steps(self, ivars, steps: int) -> None:
        """``steps`` of the recurrence form ``M x M`` step matrices and ``2R`` features each."""
        M = ivars.num_inducing
        check_work(float(steps) * (M * M + 2 * ivars.num_rff + 2 * M), f"the recurrence over {steps} steps of dt = {ivars.dt:g}", ivars)

    def memory(self, ivars, kernel) -> Tensor:
        r""":math:`Z` (:math:`2R \times M`): HiPPO projections of the features along the time grid, resumed from the cache.

        :param ivars: the HiPPO inducing variables.
        :param kernel: the GP's kernel (its spectral density defines the features).
        """
        _, _, lengthscale, _ = kernel_parts(kernel)
        differentiable = torch.is_grad_enabled() and any(p.requires_grad for p in kernel.parameters())
        signature = kernel_signature(kernel) + (self.features.kind,)
        cache = self._cache
        if cache is not None and not differentiable and cache[0] == signature:
            done, Z = cache[1], cache[2]
            if torch.equal(done, ivars.breakpoints):
                return Z
            if done.shape[0] <= ivars.breakpoints.shape[0] and torch.equal(done, ivars.breakpoints[: done.shape[0]]):
                grid = self.grid(ivars)
                resume = int(torch.nonzero(grid == done[-1])[0])  # carried state: only the new segment
                segment = grid[resume:]
                self._check_steps(ivars, segment.shape[0])
                features = self.features(ivars, kernel, segment[:, None].to(Z.dtype)).mT
                Z = _fresh_memory(ivars).final_state(features, segment, initial_state=Z)
                self._cache = (signature, ivars.breakpoints.clone(), Z)
                return Z
        grid = self.grid(ivars)
        self._check_steps(ivars, grid.shape[0])
        features = self.features(ivars, kernel, grid[:, None].to(lengthscale.dtype)).mT  # (2R, T)
        Z = ivars.memory.final_state(features, grid)
        if not differentiable:
            self._cache = (signature, ivars.breakpoints.clone(), Z.detach())
        return Z

    def Kuf(self, ivars, kernel, x: Tensor) -> Tensor:
        r""":math:`\operatorname{cov}(u, f(x))`: :math:`Z^\top \psi(x)` (``kuf="rff"``) or the HiPPO ODE driven by
        :math:`k(x, s)` (``kuf="ode"``); ``(*batch, M, N)``.

        :param ivars: the HiPPO inducing variables.
        :param kernel: the GP's kernel :math:`k`.
        :param x: inputs ``(*batch, N, 1)``.
        """
        if self.kuf == "rff":
            return (self.features(ivars, kernel, x) @ self.memory(ivars, kernel).to(x.dtype)).mT
        grid = self.grid(ivars)
        self._check_steps(ivars, grid.shape[0])
        check_work(float(x[..., 0].numel()) * grid.shape[0], "the recurrence Kuf (inputs x steps)", ivars, kernel)
        K = kernel(x, grid[:, None].to(x.dtype)).to_dense()  # (*batch, N, T): the ODE's input k(x_n, s)
        return ivars.memory.final_state(K, grid).mT

    def cross(self, a, b, kernel) -> Tensor:
        r""":math:`\operatorname{cov}(u_a, u_b) \approx Z_a^\top Z_b`, ``(M, M')`` in the kernel's dtype.

        :param a: the first set of HiPPO inducing variables.
        :param b: the second set (the same features and seed as ``a``), or ``a`` itself.
        :param kernel: the GP's kernel :math:`k`.
        """
        if a.features != b.features or not torch.equal(a.rff_normal, b.rff_normal):
            raise ValueError("cross-covariance by Fourier features needs both sets to share their features (same seed and features)")
        Z = self.memory(a, kernel)
        Z_b = Z if b is a else b.backend_for(kernel).memory(b, kernel)
        return (Z.mT @ Z_b).to(floating_dtype(kernel))


class PathBackend:
    """Random-feature memory along the ordered path of multidimensional inputs (thesis §4.4; Chen et al. (2025), OHSVGP).

    :param features: the kind of :class:`FourierFeatures`, ``"random"`` or ``"quadrature"``.
    """

    name = "path"

    def __init__(self, features: str):
        self.features = FourierFeatures(features)
        self._cache: tuple[tuple, Tensor, Tensor] | None = None  # (signature, breakpoints, Z)

    def supports(self, ivars, kernel) -> bool:
        """Whether ``ivars`` have multidimensional inputs.

        :param ivars: the HiPPO inducing variables.
        :param kernel: the GP's kernel :math:`k` (checked where it is used).
        """
        return ivars.input_dim > 1

    def memory(self, ivars, kernel) -> Tensor:
        r""":math:`Z` (:math:`2R \times M`): the committed path memory continued over the current task's ordered inputs.

        :param ivars: the multidimensional HiPPO inducing variables, with a non-empty path
            (:meth:`~.hippo_variables.HiPPOInducingVariables.append_path`).
        :param kernel: the GP's kernel; its length scale must not change once a task is committed.
        """
        if ivars.path_pending.shape[0] == 0:
            raise RuntimeError("the path is empty: call append_path(x_ordered) before using the inducing variables")
        ivars.remember_kernel(kernel)  # append_path's default kernel for folding this task into the memory
        _, _, lengthscale, _ = kernel_parts(kernel)
        committed = ivars.path_memory.shape[0] > 0
        if committed and not torch.allclose(lengthscale.detach().double(), ivars.path_lengthscale, rtol=1e-12, atol=0):
            raise RuntimeError(
                "the kernel length scale changed after earlier tasks were folded into the path memory "
                f"({ivars.path_lengthscale.tolist()} -> {lengthscale.detach().tolist()}); keep it fixed after the first task"
            )
        differentiable = torch.is_grad_enabled() and any(p.requires_grad for p in kernel.parameters())
        signature = kernel_signature(kernel) + (self.features.kind,)
        cache = self._cache
        if not differentiable and cache is not None and cache[0] == signature and torch.equal(cache[1], ivars.breakpoints):
            return cache[2]
        Z = self._memory_uncached(ivars, kernel, lengthscale.dtype, committed)
        if not differentiable:
            self._cache = (signature, ivars.breakpoints.clone(), Z)
        return Z

    def _memory_uncached(self, ivars, kernel, dtype, committed: bool) -> Tensor:
        spacing = float(ivars.path_step) * ivars.dt
        n = ivars.path_pending.shape[0]
        t_begin = float(ivars.breakpoints[-2])
        device = ivars.breakpoints.device
        if committed:
            inputs = torch.cat([ivars.path_last, ivars.path_pending]).to(dtype)
            times = t_begin + spacing * torch.arange(n + 1, dtype=torch.float64, device=device)
            features = self.features(ivars, kernel, inputs).mT
            return _fresh_memory(ivars).final_state(features, times, initial_state=ivars.path_memory.to(dtype))
        times = t_begin + spacing * torch.arange(1, n + 1, dtype=torch.float64, device=device)
        features = self.features(ivars, kernel, ivars.path_pending.to(dtype)).mT
        return _fresh_memory(ivars).final_state(features, times)

    def Kuf(self, ivars, kernel, x: Tensor) -> Tensor:
        r""":math:`\operatorname{cov}(u, f(x)) \approx Z^\top \psi(x)`: ``(*batch, M, N)``.

        :param ivars: the multidimensional HiPPO inducing variables.
        :param kernel: the GP's kernel :math:`k`.
        :param x: inputs ``(*batch, N, D)``.
        """
        return (self.features(ivars, kernel, x) @ self.memory(ivars, kernel).to(x.dtype)).mT

    def cross(self, a, b, kernel) -> Tensor:
        r""":math:`\operatorname{cov}(u_a, u_b) \approx Z_a^\top Z_b`, ``(M, M')`` in the kernel's dtype.

        :param a: the first set of multidimensional HiPPO inducing variables.
        :param b: the second set (the same spectral samples as ``a``), or ``a`` itself.
        :param kernel: the GP's kernel :math:`k`.
        """
        if not torch.equal(a.rff_normal, b.rff_normal):
            raise ValueError("cross-covariance by random features needs both sets to share their spectral samples (same seed)")
        Z = self.memory(a, kernel)
        Z_b = Z if b is a else b.backend_for(kernel).memory(b, kernel)
        return (Z.mT @ Z_b).to(floating_dtype(kernel))


def _fresh_memory(ivars) -> HiPPO:
    """A new memory for one-off segment grids, so that ``ivars.memory`` keeps the cache of the full grid."""
    memory = ivars.memory
    return HiPPO(memory.measure, memory.M, memory.theta, memory.discretization).to(ivars.breakpoints.device)


class AdditiveBackend:
    r"""A sum of kernels :math:`k = \sum_j k_j` (GPyTorch's ``AdditiveKernel``, e.g. a trend plus a season,
    ``ScaleKernel(MaternKernel()) + ScaleKernel(PeriodicKernel())``): covariances are linear in the kernel, so
    :math:`K_{uu} = \sum_j K_{uu}^{(j)}`, :math:`K_{uf} = \sum_j K_{uf}^{(j)}` and likewise the cross covariance, each part
    from the backend that the inducing variables' ``method`` selects for it (:meth:`~.hippo_variables.HiPPOInducingVariables.backend_for`).
    """

    name = "additive"

    def supports(self, ivars, kernel) -> bool:
        """Whether ``kernel`` is a sum of kernels and ``ivars`` have 1-D (time) inputs.

        :param ivars: the HiPPO inducing variables.
        :param kernel: the GP's kernel :math:`k`.
        """
        return isinstance(kernel, gpytorch.kernels.AdditiveKernel) and ivars.input_dim == 1

    def Kuf(self, ivars, kernel, x: Tensor) -> Tensor:
        r""":math:`\sum_j \operatorname{cov}(u, f_j(x))`: ``(*batch, M, N)``.

        :param ivars: the HiPPO inducing variables.
        :param kernel: the sum of kernels.
        :param x: inputs ``(*batch, N, 1)``.
        """
        return sum(ivars.Kuf(part, x) for part in kernel.kernels)

    def cross(self, a, b, kernel) -> Tensor:
        r""":math:`\sum_j \operatorname{cov}_j(u_a, u_b)` without jitter, ``(M, M')``.

        :param a: the first set of HiPPO inducing variables.
        :param b: the second set, or ``a`` itself (then ``Kuu`` without jitter).
        :param kernel: the sum of kernels.
        """
        return sum(a.covariance_without_jitter(b, part) for part in kernel.kernels)
