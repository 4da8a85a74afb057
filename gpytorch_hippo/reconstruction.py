r"""Finite-basis reconstruction of the posterior OHSGPR / OHSVGP (thesis App. C.2).

If :math:`f \sim q_t(f)` is the posterior of a sparse GP with HiPPO inducing variables
:math:`u_m^{(t)} = \int f(x)\, \phi_m^{(t)}(x)\, \mathrm{d}x`, :math:`\phi_m^{(t)} = g_m^{(t)} \omega^{(t)}`, then the HiPPO
coefficients of :math:`f` are distributed exactly as :math:`q(u^{(t)}) = \mathcal{N}(m_u, S_u)` (App. C). Truncating
the expansion of :math:`f` in the orthonormal bases gives the finite-basis approximation of the
posterior (thesis §4.3, Fig. 4.1):

.. math::
    f(x) \approx \sum_{m=1}^M u_m^{(t)} g_m^{(t)}(x), \qquad u^{(t)} \sim q(u^{(t)}),

i.e. with :math:`G = [g_m^{(t)}(x_n)]_{nm}` the reconstruction at inputs :math:`x` is Gaussian with mean
:math:`G m_u` and covariance :math:`G S_u G^\top`. The approximation is meaningful on the support of the
measure :math:`\omega^{(t)}` (:math:`[0, t]` for LegS).

Inducing variables project the centred process :math:`f - m` (see
:class:`~gpytorch_hippo.inducing.InducingVariables`, "Prior mean"): when their ``prior_mean`` is
``None`` (zero) the model's mean function :math:`m(x)` is added back to the reconstruction; otherwise
:math:`u` already includes it.
"""

from __future__ import annotations

from typing import NamedTuple, cast

import gpytorch
import torch
from gpytorch.distributions import MultivariateNormal
from linear_operator import to_dense
from linear_operator.operators import RootLinearOperator
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor

from .inducing.base import InducingVariables
from .online import OnlineSGPR
from .variational import InterdomainVariationalStrategy

__all__ = ["sample_coefficients", "sample_reconstruction", "reconstruction_moments"]


class _Posterior(NamedTuple):
    q_u: MultivariateNormal
    inducing_variables: InducingVariables
    mean_module: gpytorch.means.Mean | None


def _posterior(model) -> _Posterior:
    """``q(u)``, the inducing variables it is defined over, and the prior mean function of ``model``."""
    if isinstance(model, OnlineSGPR):
        # q(u) is over the frozen copy taken at the end of the last task: later `advance` calls on
        # model.inducing_variables must not change the bases of the stored posterior.
        q_u = model.inducing_posterior()  # raises before the first task, so the frozen copy below is set
        return _Posterior(q_u, cast(InducingVariables, model.posterior_inducing_variables), model.mean_module)
    if isinstance(model, gpytorch.models.ApproximateGP):
        strategy = getattr(model, "variational_strategy", None)
        while strategy is not None and not isinstance(strategy, InterdomainVariationalStrategy):
            strategy = getattr(strategy, "base_variational_strategy", None)
        if strategy is not None:
            return _Posterior(strategy.inducing_posterior(), strategy.inducing_variables, strategy.mean_module)
    raise TypeError(
        "model must be an OnlineSGPR or a gpytorch ApproximateGP whose variational_strategy is an "
        f"InterdomainVariationalStrategy (possibly wrapped by IndependentMultitaskVariationalStrategy), got {type(model).__name__}"
    )


def _check_x(x) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() == 2 and x.shape[-1] == 1:
        x = x.squeeze(-1)
    if x.dim() != 1:
        raise ValueError(f"x must be 1-D inputs of shape (N,) or (N, 1), got {tuple(x.shape)}")
    if not torch.isfinite(x).all():
        raise ValueError("x contains NaN or infinite values")
    return x


def _basis_and_offset(posterior: _Posterior, x: Tensor) -> tuple[Tensor, Tensor | None]:
    """``G = [g_m^{(t)}(x_n)]`` (``N x M``) and the mean function to add back (or ``None``)."""
    ivs = posterior.inducing_variables
    if not callable(getattr(ivs, "basis", None)):
        raise TypeError(
            f"the model's inducing variables ({type(ivs).__name__}) have no basis(x) method: a finite-basis "
            "reconstruction needs projection inducing variables such as HiPPOInducingVariables"
        )
    basis = ivs.basis(x)
    num_inducing = posterior.q_u.mean.shape[-1]
    if basis.shape[-2:] != (x.shape[0], num_inducing):
        raise ValueError(f"inducing_variables.basis(x) must have shape ({x.shape[0]}, {num_inducing}), got {tuple(basis.shape)}")
    offset = None
    mean_module = posterior.mean_module
    if mean_module is not None and ivs.prior_mean(mean_module) is None and not isinstance(mean_module, gpytorch.means.ZeroMean):
        offset = mean_module(x.unsqueeze(-1))
    return basis.to(posterior.q_u.mean.dtype), offset


def _check_num_samples(num_samples) -> int:
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")
    return num_samples


def _sample(q_u: MultivariateNormal, num_samples: int, generator: torch.Generator | None) -> Tensor:
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    mean = q_u.mean
    chol = psd_safe_cholesky(to_dense(q_u.lazy_covariance_matrix))
    device = generator.device if generator is not None else mean.device
    noise = torch.randn(num_samples, *mean.shape, generator=generator, dtype=mean.dtype, device=device).to(mean.device)
    return mean + (chol @ noise.unsqueeze(-1)).squeeze(-1)


def sample_coefficients(model, num_samples: int, generator: torch.Generator | None = None) -> Tensor:
    r"""Draws :math:`u \sim q(u) = \mathcal{N}(m_u, S_u)` of the model's inducing variables: ``(num_samples, *batch, M)``.

    Drawn as :math:`m_u + \operatorname{chol}(S_u)\, \varepsilon` with :math:`\varepsilon \sim \mathcal{N}(0, I)` from
    ``generator`` (so a seeded generator gives reproducible draws). By thesis App. C these are draws of the HiPPO
    coefficients of :math:`f \sim q_t(f)`.

    :param model: an :class:`~gpytorch_hippo.online.OnlineSGPR` with at least one task absorbed, or a
        GPyTorch ``ApproximateGP`` using :class:`~gpytorch_hippo.variational.InterdomainVariationalStrategy`.
    :param num_samples: number of draws, a positive int.
    :param generator: random generator for :math:`\varepsilon`; ``None`` (default) uses the global one.
    """
    num_samples = _check_num_samples(num_samples)
    return _sample(_posterior(model).q_u, num_samples, generator)


def sample_reconstruction(model, x: Tensor, num_samples: int, generator: torch.Generator | None = None) -> Tensor:
    r"""Samples of the finite-basis posterior :math:`f(x) = m(x) + \sum_m u_m g_m^{(t)}(x)`, :math:`u \sim q(u)`
    (thesis App. C.2): ``(num_samples, *batch, N)``.

    :param model: an :class:`~gpytorch_hippo.online.OnlineSGPR` or an ``ApproximateGP`` with
        :class:`~gpytorch_hippo.variational.InterdomainVariationalStrategy`, whose inducing variables
        have a ``basis(x)`` method (HiPPO inducing variables with 1-D time inputs). For
        ``OnlineSGPR`` the bases are those of the last absorbed task
        (``model.posterior_inducing_variables``), over which ``q(u)`` is defined.
    :param x: 1-D inputs ``(N,)`` or ``(N, 1)``.
    :param num_samples: number of draws.
    :param generator: random generator (reproducible draws; the coefficients are those of
        :func:`sample_coefficients` with the same generator state).
    """
    num_samples = _check_num_samples(num_samples)
    x = _check_x(x)
    posterior = _posterior(model)
    basis, offset = _basis_and_offset(posterior, x)
    coefficients = _sample(posterior.q_u, num_samples, generator)
    samples = (coefficients.unsqueeze(-2) @ basis.mT).squeeze(-2)
    return samples if offset is None else samples + offset.to(samples.dtype)


def reconstruction_moments(model, x: Tensor) -> MultivariateNormal:
    r"""The exact distribution of the finite-basis reconstruction at ``x`` (thesis App. C):
    :math:`\mathcal{N}(m(x) + G m_u,\, G S_u G^\top)` with :math:`G = [g_m^{(t)}(x_n)]_{nm}` (``N x M``).

    The covariance has rank :math:`\le M` and is returned as a ``RootLinearOperator`` with root
    :math:`G \operatorname{chol}(S_u)` (sampling and marginal variances work; ``log_prob`` needs :math:`N \le M`).
    Arguments as in :func:`sample_reconstruction`.

    :param model: an :class:`~gpytorch_hippo.online.OnlineSGPR` or an ``ApproximateGP`` with
        :class:`~gpytorch_hippo.variational.InterdomainVariationalStrategy` whose inducing variables have a
        ``basis(x)`` method.
    :param x: 1-D inputs ``(N,)`` or ``(N, 1)``.
    """
    x = _check_x(x)
    posterior = _posterior(model)
    basis, offset = _basis_and_offset(posterior, x)
    q_u = posterior.q_u
    mean = (basis @ q_u.mean.unsqueeze(-1)).squeeze(-1)
    if offset is not None:
        mean = mean + offset.to(mean.dtype)
    root = basis @ psd_safe_cholesky(to_dense(q_u.lazy_covariance_matrix))
    return MultivariateNormal(mean, RootLinearOperator(root))
