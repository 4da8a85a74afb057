r"""The inducing-variable interface shared by every sparse GP in :mod:`gpytorch_hippo`.

An inducing variable is a linear functional of the GP, :math:`u_m = L_m f` (thesis §4.2.1,
"Interdomain Gaussian Processes"): a point evaluation :math:`f(z_m)` or a projection
:math:`\int f(x)\, \phi_m(x)\, \mathrm{d}x`. The object knows its own covariances, so the variational strategy and the
online objectives never need to know which kind they are working with.
"""

from __future__ import annotations

import gpytorch
import torch
from linear_operator import to_linear_operator
from linear_operator.operators import DenseLinearOperator, LinearOperator
from torch import Tensor

from probseq._compat import cholesky_dtype


class InputsOutsideSupportError(ValueError):
    """Training inputs lie outside the input range the inducing variables summarise
    (:meth:`InducingVariables.input_support`): the model could not learn from them -- their
    covariance with the inducing variables is zero or truncated -- so they would be lost silently."""


class CapturedVarianceWarning(RuntimeWarning):
    """The inducing variables keep too little of the prior variance over the inputs seen so far
    (:meth:`InducingVariables.captured_variance` below a model's ``captured_variance_warning`` level): expect underfitting
    and lost memory there. A ``RuntimeWarning``, so filters written for it keep working; escalate it with
    ``warnings.simplefilter("error", CapturedVarianceWarning)``."""


class InconsistentCovarianceWarning(RuntimeWarning):
    r""":math:`K_{uu}` and :math:`K_{uf}` disagree: the Nyström residual :math:`k(x, x) - K_{xu} K_{uu}^{-1} K_{ux}` is negative beyond
    round-off (e.g. HiPPO ``kuf="ode"`` with few random features), so predictive variances and bounds are unreliable."""


class InducingVariables(gpytorch.Module):
    r"""Abstract set of :math:`M` inducing variables :math:`u = (u_1, \dots, u_M)` of a GP :math:`f \sim \mathcal{GP}(m, k)`.

    Subclasses implement

    * :attr:`num_inducing` -- :math:`M`;
    * :meth:`Kuu` -- :math:`\operatorname{cov}(u, u)` as a ``(*batch, M, M)`` PSD ``LinearOperator`` (jitter included);
    * :meth:`Kuf` -- :math:`\operatorname{cov}(u, f(x))` as a ``(*batch, M, N)`` tensor for inputs ``x`` of shape
      ``(*batch, N, D)`` (batch dimensions broadcast like GPyTorch's);

    and may override :meth:`Kuu_cross` (covariance with another set, needed by the online
    updates of Bui et al. (2017), thesis eq. (4.6), when old and new inducing variables differ) and
    :meth:`prior_mean`.

    **Jitter policy.** :meth:`Kuu` returns :math:`K_{uu} + \mathrm{jitter}\, I` with
    ``jitter = self.jitter`` when set, otherwise
    ``gpytorch.settings.variational_cholesky_jitter.value(dtype)`` (1e-4 for float32, 1e-6 for
    float64) times :meth:`_jitter_scale` -- ``1`` for point inducing variables (the value GPyTorch's
    ``VariationalStrategy`` adds, so that results coincide with GPyTorch), the mean of
    :math:`\operatorname{diag}(K_{uu})` for interdomain variables whose scale shrinks with the stream (HiPPO; this
    relative jitter is the float64 value 1e-6 in every dtype, so that a float32 model is the float64
    model: :class:`~gpytorch_hippo.online.OnlineSGPR` and the variational strategy factorise
    :math:`K_{uu}` in float64).
    Subclasses build the jittered matrix with :meth:`add_jitter`. Read the jitter as white noise added to :math:`f` for the inducing
    variables only: :meth:`Kuf` carries none, and :meth:`Kuu_cross` carries it exactly where the two sets
    share a variable (for point sets: coinciding points), so that ``Kuu_cross(copy_of_self)``
    equals ``Kuu()`` and online updates with unchanged inducing variables stay exact.

    **Prior mean.** :math:`\mathbb{E}[u]` is returned by :meth:`prior_mean`; the default ``None`` means zero:
    interdomain inducing variables are projections of the centred process :math:`f - m` (so a mean
    function shifts :math:`f` but not :math:`u`). :class:`~gpytorch_hippo.inducing.InducingPoints`
    overrides this with :math:`m(Z)` so that :math:`u = f(Z)` exactly as in GPyTorch.

    :param jitter: the diagonal jitter :meth:`Kuu` adds, a float :math:`\ge 0`; ``None`` (default): the policy above
        (GPyTorch's variational jitter, absolute or relative to :math:`\operatorname{mean}(\operatorname{diag} K_{uu})`).
    """

    jitter: float | None = None
    #: the default jitter is relative to ``mean(diag K_uu)`` (:meth:`_jitter_scale`) and then the same
    #: for every dtype (the float64 value): the online algebra factorises ``K_uu`` in float64
    _relative_jitter: bool = False
    #: the name of the variational strategy whose ``q(u)`` lives on these variables (they refuse to move then), or ``None``
    variational_owner: str | None = None

    def __init__(self, jitter: float | None = None):
        super().__init__()
        if jitter is not None and not (float(jitter) >= 0.0):
            raise ValueError(f"jitter must be a non-negative float or None, got {jitter!r}")
        self.jitter = None if jitter is None else float(jitter)

    @property
    def num_inducing(self) -> int:
        """Number :math:`M` of inducing variables."""
        raise NotImplementedError

    def Kuu(self, kernel: gpytorch.kernels.Kernel) -> LinearOperator:
        r"""Prior covariance :math:`\operatorname{cov}(u, u) + \mathrm{jitter}\, I`: a ``(*batch, M, M)`` PSD ``LinearOperator``.

        :param kernel: the GP's kernel :math:`k` (a GPyTorch kernel; its hyperparameters are used as they are now).
        """
        raise NotImplementedError

    def Kuf(self, kernel: gpytorch.kernels.Kernel, x: Tensor) -> Tensor:
        r"""Prior cross-covariance :math:`\operatorname{cov}(u, f(x))`: ``(*batch, M, N)`` for ``x`` of shape ``(*batch, N, D)``.

        :param kernel: the GP's kernel :math:`k`.
        :param x: inputs ``(*batch, N, D)``.
        """
        raise NotImplementedError

    def captured_variance(self, kernel: gpytorch.kernels.Kernel, grid: Tensor, reduction: str = "mean") -> Tensor:
        r"""Fraction of the prior variance these variables capture on ``grid`` ``(*batch, N, D)``:
        :math:`[K_{fu} K_{uu}^{-1} K_{uf}]_{nn} / k(x_n, x_n)` (1: the sparse prior is exact there), averaged over
        the grid (``reduction="mean"``, shape ``batch``) or per point (``"none"``, ``(*batch, N)``).

        Rule of thumb for HiPPO-LegS on ``[0, t]`` with an RBF length scale :math:`\ell`: the :math:`M` basis
        polynomials resolve about :math:`M` wiggles, so :math:`M` must exceed a few times :math:`t / \ell` (see the
        package README); a value well below 1 means a larger :math:`M` (or a longer :math:`\ell`) is needed.
        LegS resolves the two ends of ``[0, t]`` best and the middle worst (Legendre polynomials
        oscillate fastest near :math:`\pm 1`), which ``reduction="none"`` shows.

        :param kernel: the GP's kernel :math:`k`.
        :param grid: inputs ``(*batch, N, D)`` at which the captured fraction is evaluated.
        :param reduction: ``"mean"`` (default): the average over the grid; ``"none"``: one value per point.
        """
        if reduction not in ("mean", "none"):
            raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")
        from linear_operator.utils.cholesky import psd_safe_cholesky

        with torch.no_grad():
            kuu = self.Kuu(kernel).to_dense()
            working = torch.promote_types(kuu.dtype, cholesky_dtype())
            chol = psd_safe_cholesky(kuu.to(working))
            W = torch.linalg.solve_triangular(chol, self.Kuf(kernel, grid).to(working), upper=False)
            captured = (W.square().sum(-2) / kernel(grid, diag=True)).to(kuu.dtype)
            return captured.mean(-1) if reduction == "mean" else captured

    def input_support(self) -> tuple[float, float] | None:
        """``(lower, upper)``: the 1-D input range these variables summarise (a HiPPO memory's
        ``[start, t]`` or window, a Fourier interval), ``None`` where any input is reachable (points)."""
        return None

    def check_inputs_within_support(self, x: Tensor, what: str = "training inputs") -> None:
        """Raise :class:`InputsOutsideSupportError` if 1-D inputs ``x`` ``(*batch, N, 1)`` lie before or
        beyond :meth:`input_support` (by more than round-off of ``x``'s dtype), naming the fix
        (:meth:`coverage_advice`: e.g. ``advance(t)`` or ``start=`` for HiPPO bases). Online models call
        it on every task's training inputs; predictions outside the support stay allowed (forecasting).

        :param x: inputs ``(*batch, N, 1)``; inputs of another dimension, or none, are not checked.
        :param what: how the error message names the inputs (default ``"training inputs"``).
        """
        support = self.input_support()
        if support is None or x.shape[-1] != 1 or x.numel() == 0:
            return
        low, high = float(x.detach().min()), float(x.detach().max())
        relative = max(1e-9, 8 * torch.finfo(x.dtype).eps) if x.is_floating_point() else 1e-9
        tolerance = relative * max(abs(support[0]), abs(support[1]), 1.0)
        for cause, outside in (("before", low < support[0] - tolerance), ("beyond", high > support[1] + tolerance)):
            if outside:
                raise InputsOutsideSupportError(
                    f"the {what} span [{low:.9g}, {high:.9g}], {cause} the range [{support[0]:.9g}, {support[1]:.9g}] "
                    f"that the {type(self).__name__} summarise, so the model cannot learn from them: "
                    f"{self.coverage_advice(cause)}"
                )

    def coverage_advice(self, cause: str) -> str:
        """What to change when the online models find inputs ``"before"`` or ``"beyond"``
        :meth:`input_support`, or ``"too few"`` variables to capture them
        (:meth:`~gpytorch_hippo.inducing.base.InducingVariables.captured_variance`).

        :param cause: ``"before"``, ``"beyond"`` (inputs outside :meth:`input_support`) or ``"too few"``.
        :return: the advice, a clause for an error or warning message.
        """
        if cause in ("before", "beyond"):
            return "move or replace the inducing variables so that they reach the new inputs"
        return "use more inducing variables, or place them where the inputs are (e.g. pivoted Cholesky, inducing.select_pivoted_cholesky)"

    def jitter_value(self, dtype: torch.dtype) -> float:
        """The diagonal jitter added by :meth:`Kuu` for matrices of ``dtype`` (see the class docstring).

        :param dtype: the matrices' floating dtype (GPyTorch's default jitter depends on it; a relative one does not).
        """
        if self.jitter is not None:
            return self.jitter
        return gpytorch.settings.variational_cholesky_jitter.value(dtype=torch.float64 if self._relative_jitter else dtype)

    def unshared_jitter(self, other: InducingVariables, kuu: Tensor) -> Tensor:
        """Variances ``(*batch, M)`` of the jitter noise of these variables that ``other`` does not
        share (class docstring: ``Kuu_cross`` carries the shared part); ``kuu`` is :meth:`Kuu`
        densified. Online updates average the stored task over this noise
        (:func:`gpytorch_hippo.collapsed.smooth_ratio`) so that it never counts as information about :math:`f`.

        :param other: the other set (e.g. the current variables, for these stored ones).
        :param kuu: :meth:`Kuu` of these variables as a dense ``(*batch, M, M)`` tensor.
        """
        unshared = ~self._shares_jitter_with(other)
        return self.jitter_variance(kuu) * unshared.to(kuu.dtype)

    def jitter_variance(self, kuu: Tensor) -> Tensor:
        r"""Variances ``(*batch, M)`` of the jitter white noise that :meth:`Kuu` adds (``kuu`` is its
        densified value; for a relative jitter the scale is read off it, an :math:`O(\mathrm{jitter}^2)` difference).

        :param kuu: :meth:`Kuu` as a dense ``(*batch, M, M)`` tensor (jitter included).
        """
        variance = self.jitter_value(kuu.dtype) * self._jitter_scale(kuu)
        return torch.full(kuu.shape[:-1], variance, dtype=kuu.dtype, device=kuu.device)

    def _shares_jitter_with(self, other: InducingVariables) -> Tensor:
        """Boolean ``(*batch, M)`` (broadcastable): which of these variables share their jitter noise
        with a variable of ``other``. By default all of them when ``other`` is the same set (same type
        and state, e.g. a frozen copy), none otherwise; subclasses that share some refine this."""
        if type(other) is not type(self):
            return torch.tensor(False)
        mine, theirs = self.state_dict(), other.state_dict()
        return torch.tensor(
            mine.keys() == theirs.keys()
            and all(a.shape == b.shape and torch.equal(a, b.to(a.device)) for a, b in ((mine[k], theirs[k]) for k in mine))
        )

    def _jitter_scale(self, covariance: LinearOperator) -> float:
        """Scale the jitter is relative to (class docstring); ``1``: absolute, as in GPyTorch."""
        return 1.0

    def add_jitter(self, covariance: LinearOperator | Tensor) -> LinearOperator:
        r"""Return :math:`\mathrm{covariance} + \mathrm{jitter}\, I` following the jitter policy of this set (a dense
        ``covariance`` stays dense: the same values as linear_operator's added diagonal, formed once).

        :param covariance: the covariance without jitter, ``(*batch, M, M)``, a tensor or ``LinearOperator``.
        """
        jitter = self.jitter_value(covariance.dtype) * self._jitter_scale(covariance)
        if isinstance(covariance, Tensor):
            eye = torch.eye(covariance.shape[-1], dtype=covariance.dtype, device=covariance.device)
            return DenseLinearOperator(covariance + jitter * eye)
        return to_linear_operator(covariance).add_jitter(jitter)

    def _check_movable(self, step: str) -> None:
        """Refuse to move these variables in place (``step``, e.g. ``"advance(t_new)"``) while a
        variational ``q(u)`` lives on them: it would silently become a distribution over the moved
        variables. The owning strategy moves them itself and carries ``q(u)`` forward."""
        if self.variational_owner is not None:
            raise RuntimeError(
                f"{step} would silently re-interpret the q(u) of the {self.variational_owner} that uses these "
                f"inducing variables as a distribution over the moved ones; call model.variational_strategy.{step} "
                "instead, which carries q(u) forward"
            )

    def prior_mean(self, mean_module: gpytorch.means.Mean | None) -> Tensor | None:
        r"""Prior mean :math:`\mathbb{E}[u]` of shape ``(*batch, M)``, or ``None`` when it is zero (the default).

        :param mean_module: the GP's prior mean function :math:`m` (``None``: zero).
        """
        return None

    def Kuu_cross(self, other: InducingVariables, kernel: gpytorch.kernels.Kernel) -> Tensor:
        r"""Prior cross-covariance :math:`\operatorname{cov}(u, u')` between this set (:math:`M`) and ``other`` (:math:`M'`).

        Resolved by double dispatch: ``self._cross_covariance(other, kernel)`` is tried first, then
        ``other._cross_covariance(self, kernel)`` transposed. Point inducing variables are
        evaluations, :math:`\operatorname{cov}(u, f(Z'))` = ``Kuf(kernel, Z')``, so
        :class:`~gpytorch_hippo.inducing.points.InducingPoints` answers for any set and every
        implementation of :meth:`Kuf` pairs with it for free. A new pair of interdomain types
        overrides ``_cross_covariance`` in one of them (adding the jitter on the variables the two
        sets share, see the class docstring). Returns a dense ``(*batch, M, M')`` tensor.

        :param other: the other set of inducing variables (:math:`M'` of them).
        :param kernel: the GP's kernel :math:`k`.
        """
        if not isinstance(other, InducingVariables):
            raise TypeError(f"other must be an InducingVariables instance, got {type(other).__name__}")
        result = self._cross_covariance(other, kernel)
        if result is NotImplemented:
            result = other._cross_covariance(self, kernel)
            if result is NotImplemented:
                raise TypeError(
                    f"no cross-covariance is defined between {type(self).__name__} and {type(other).__name__}; "
                    f"implement _cross_covariance in one of them"
                )
            result = result.mT
        return result

    def _cross_covariance(self, other: InducingVariables, kernel: gpytorch.kernels.Kernel):
        """``cov(u_self, u_other)`` or ``NotImplemented`` (hook of :meth:`Kuu_cross`). The base class
        knows no pair: a subclass answers for the sets it knows (point inducing variables answer for
        every set through its :meth:`Kuf`), and :meth:`Kuu_cross` asks the other set when one does not."""
        return NotImplemented
