r"""SVGPVAE (Jazbec et al. 2021) with any inducing variables, thesis App. C.3.

An encoder maps each observation :math:`y_t` (with missing entries masked) to Gaussian
pseudo-observations :math:`(\tilde y_t^l, \tilde v_t^l)` of :math:`L` latent channels; every channel is a GP over time
whose :math:`q(u^l)` is the closed form of the pseudo-observations (App. C); a decoder maps the latent
:math:`f_t` back to the mean of :math:`y_t`. The latent GPs are one batched
:class:`~gpytorch_hippo.variational.InterdomainVariationalStrategy`, so HiPPO inducing variables
(OHSVGP) and inducing points (OSVGP, OVC) are the same code.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import gpytorch
import torch
from gpytorch.distributions import MultivariateNormal
from linear_operator import to_dense
from linear_operator.operators import RootLinearOperator
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor

from probseq._compat import VariationalDistributionBase

from ..inducing.base import InducingVariables
from ..online import OnlineELBO
from ..variational import InterdomainVariationalStrategy
from ..variational import solve_lower as _solve_lower

__all__ = ["EncodedVariationalDistribution", "LatentGP", "SVGPVAE", "SVGPVAETerms"]


class EncodedVariationalDistribution(VariationalDistributionBase):
    r""":math:`q(v) = \mathcal{N}(\mathrm{mean}, R R^\top)` (:math:`R` = ``root``) with no parameters of its own: it is set
    from the encoder's pseudo-observations by :meth:`SVGPVAE.encode_posterior` (amortised inference, thesis App. C).

    ``mean`` and ``root`` are non-persistent buffers, so that the strategy's eval-mode caches see
    every new encoding (it drops them when a watched buffer changes) and ``state_dict`` skips them.

    :param num_inducing: the number ``M`` of inducing variables.
    :param batch_shape: batch shape, ``(L,)`` for ``L`` latent channels (default ``()``).
    :param mean_init_std: GPyTorch's initialisation noise of the mean (default 0; unused: the mean is set, not learned).
    """

    def __init__(self, num_inducing: int, batch_shape: torch.Size = torch.Size([]), mean_init_std: float = 0.0):
        super().__init__(num_inducing, batch_shape, mean_init_std=mean_init_std)
        self.register_buffer("dtype_anchor", torch.zeros(0))  # carries dtype/device through .to()
        self.register_buffer("encoded_mean", None, persistent=False)
        self.register_buffer("encoded_root", None, persistent=False)

    @property
    def dtype(self) -> torch.dtype:
        return self.dtype_anchor.dtype

    @property
    def device(self) -> torch.device:
        return self.dtype_anchor.device

    def set(self, mean: Tensor, root: Tensor) -> None:
        r"""Use :math:`q(v) = \mathcal{N}(\mathrm{mean}, R R^\top)` (batch ``(L,)``, size ``M``) until the next call.

        :param mean: the mean ``(L, M)`` (the distribution's shape).
        :param root: the covariance root :math:`R`, ``(L, M, M)``.
        """
        if mean.shape != self.shape() or root.shape != (*self.shape(), self.num_inducing_points):
            raise ValueError(
                f"mean and root must have shapes {tuple(self.shape())} and {(*self.shape(), self.num_inducing_points)}, "
                f"got {tuple(mean.shape)} and {tuple(root.shape)}"
            )
        self.encoded_mean = mean
        self.encoded_root = root

    def forward(self) -> MultivariateNormal:
        if self.encoded_mean is None:
            raise RuntimeError("no pseudo-observations were encoded yet: call SVGPVAE.encode_posterior first")
        return MultivariateNormal(self.encoded_mean, RootLinearOperator(self.encoded_root))

    def initialize_variational_distribution(self, prior_dist: MultivariateNormal) -> None:
        """Called by the strategy before first use and when it carries :math:`q` across ``advance``.

        :param prior_dist: the distribution to set: its mean and the Cholesky factor of its covariance (detached).
        """
        covariance = to_dense(prior_dist.lazy_covariance_matrix).detach()
        self.set(prior_dist.mean.detach().expand(self.shape()).clone(), psd_safe_cholesky(covariance).expand(*self.shape(), -1).clone())


class LatentGP(gpytorch.models.ApproximateGP):
    """``L`` independent latent GPs over time sharing one set (or ``L`` sets) of inducing variables.

    :param inducing_variables: shared (``Kuu`` of shape ``(M, M)``) or per channel (``(L, M, M)``).
    :param kernel: the prior kernel, batch shape ``()`` (shared) or ``(L,)`` (per channel).
    :param num_channels: the number ``L`` of latent channels.
    """

    def __init__(self, inducing_variables: InducingVariables, kernel: gpytorch.kernels.Kernel, num_channels: int):
        q = EncodedVariationalDistribution(inducing_variables.num_inducing, torch.Size([num_channels]))
        super().__init__(InterdomainVariationalStrategy(self, inducing_variables, q, whitened=True))
        self.mean_module = gpytorch.means.ZeroMean()
        self.covar_module = kernel

    def forward(self, x: Tensor) -> MultivariateNormal:
        r"""The prior :math:`p(f(x)) = \mathcal{N}(0, k(x, x))` of each channel.

        :param x: times ``(L, T, 1)`` (or broadcasting to the kernel's batch shape).
        """
        return MultivariateNormal(self.mean_module(x), self.covar_module(x))


class SVGPVAETerms(NamedTuple):
    r"""The terms of the SVGPVAE ELBO (thesis App. C), each summed over time and channels.

    :math:`\mathrm{elbo} = \mathrm{reconstruction} - \mathrm{pseudo\_fit} + \mathrm{gp\_elbo}`, where ``gp_elbo`` is the
    "Hensman" ELBO :math:`\mathcal{L}_H` of the latent GPs on the pseudo-observations (online with ``online_kl=True``)
    and ``pseudo_fit`` is its data term :math:`\sum_t \mathbb{E}_q \log \mathcal{N}(\tilde y_t \mid f_t, \tilde v_t)`.

    :param elbo: the SVGPVAE ELBO, a scalar.
    :param reconstruction: :math:`\sum_t \mathbb{E}_{q(f_t)} \log \mathcal{N}(y_t \mid \varphi(f_t), \sigma^2)` over the
        observed entries (a Monte-Carlo mean over the draws).
    :param pseudo_fit: the data term of ``gp_elbo`` above.
    :param gp_elbo: :math:`\sum_l \mathcal{L}_H^l`, the latent GPs' ELBO on the pseudo-observations.
    """

    elbo: Tensor
    reconstruction: Tensor
    pseudo_fit: Tensor
    gp_elbo: Tensor


def _mlp(in_dim: int, hidden_dim: int, out_dim: int) -> torch.nn.Sequential:
    r"""The thesis's two-layer MLP (§4.6.3): :math:`x \mapsto W_3 \tanh(W_2 \tanh(W_1 x + b_1) + b_2) + b_3`."""
    return torch.nn.Sequential(
        torch.nn.Linear(in_dim, hidden_dim),
        torch.nn.Tanh(),
        torch.nn.Linear(hidden_dim, hidden_dim),
        torch.nn.Tanh(),
        torch.nn.Linear(hidden_dim, out_dim),
    )


class SVGPVAE(gpytorch.Module):
    r"""GP-VAE with sparse latent GPs over time (Jazbec et al. 2021; thesis App. C).

    Model: :math:`f^l \sim \mathcal{GP}(0, k)` for :math:`l = 1, \dots, L`,
    :math:`y_t \mid f_t \sim \mathcal{N}(\varphi(f_t), \operatorname{diag}(\sigma^2))` on the observed
    entries only (missing entries are masked out of the likelihood and zeroed, with the mask, at the
    encoder's input; nothing is imputed). The encoder gives :math:`(\tilde y_t, \tilde v_t)`; for each channel, with
    :math:`L_u = \operatorname{chol}(K_{uu})`, :math:`W = L_u^{-1} K_{uf}` and
    :math:`B = I + W \operatorname{diag}(\tilde v)^{-1} W^T`, the whitened
    :math:`q(v) = \mathcal{N}(B^{-1} W \tilde v^{-1} \tilde y, B^{-1})` is App. C's :math:`q(u) = \mathcal{N}(m, A)` with
    :math:`m = K_{uu} S^{-1} K_{uf} \tilde v^{-1} \tilde y`, :math:`A = K_{uu} S^{-1} K_{uu}`,
    :math:`S = K_{uu} + K_{uf} \tilde v^{-1} K_{fu}` (since :math:`S = L_u B L_u^T`).

    The GP part :math:`\mathcal{L}_H` (pseudo-likelihood ``FixedNoiseGaussianLikelihood`` with noise :math:`\tilde v`) is the
    Hensman ELBO :math:`\sum_t \mathbb{E}_q \log \mathcal{N}(\tilde y_t \mid f_t, \tilde v_t) - \mathrm{KL}(q(u) \| p(u))`,
    GPyTorch's ``VariationalELBO``
    (the thesis, App. C.3, after Jazbec et al. 2021). With ``online_kl=True`` it is
    :class:`~gpytorch_hippo.online.OnlineELBO` instead, and after ``gp_objective.end_task()`` its KL
    becomes the online KL of Bui et al. (2017) (thesis eq. (4.6)), which ties :math:`q(u)` of the new task to a stored
    posterior of the old ones (a departure from the thesis, whose continual SVGPVAE keeps its memory in
    the EWC-protected networks and the inducing variables only).

    :param observation_dim: :math:`D`.
    :param latent_gp: the :class:`LatentGP` (fixes :math:`L` and the inducing variables).
    :param hidden_dim: width of the two-layer MLP encoder and decoder.
    :param min_pseudo_variance: lower bound added to the encoder's :math:`\tilde v`.
    :param online_kl: use the online ELBO for the GP part (see above; default ``False``, the thesis).
    """

    def __init__(
        self, observation_dim: int, latent_gp: LatentGP, hidden_dim: int = 64, min_pseudo_variance: float = 1e-3, online_kl: bool = False
    ):
        super().__init__()
        for name, value in (("observation_dim", observation_dim), ("hidden_dim", hidden_dim)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not isinstance(latent_gp, LatentGP):
            raise TypeError(f"latent_gp must be a LatentGP, got {type(latent_gp).__name__}")
        if not min_pseudo_variance > 0:
            raise ValueError(f"min_pseudo_variance must be positive, got {min_pseudo_variance!r}")
        self.observation_dim = observation_dim
        self.latent_dim = latent_gp.variational_strategy._variational_distribution.batch_shape[0]
        self.latent_gp = latent_gp
        self.encoder = _mlp(2 * observation_dim, hidden_dim, 2 * self.latent_dim)
        self.decoder = _mlp(self.latent_dim, hidden_dim, observation_dim)
        self.min_pseudo_variance = float(min_pseudo_variance)
        self.register_parameter("raw_noise", torch.nn.Parameter(torch.full((observation_dim,), -2.0)))
        self.register_constraint("raw_noise", gpytorch.constraints.GreaterThan(1e-4))
        pseudo_likelihood = gpytorch.likelihoods.FixedNoiseGaussianLikelihood(torch.ones(1), learn_additional_noise=False)
        objective = OnlineELBO if online_kl else gpytorch.mlls.VariationalELBO
        self.gp_objective = objective(pseudo_likelihood, latent_gp, num_data=1, combine_terms=False)

    @property
    def noise(self) -> Tensor:
        r"""Observation noise variances :math:`\sigma^2` of the :math:`D` outputs."""
        return self.raw_noise_constraint.transform(self.raw_noise)

    # ------------------------------------------------------------------ inputs
    def _check(self, times: Tensor, y: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        if not isinstance(times, Tensor) or times.dim() != 1 or times.shape[0] < 1:
            raise ValueError(f"times must be a 1-D tensor of length T >= 1, got {getattr(times, 'shape', type(times))}")
        if not torch.isfinite(times).all() or (times.shape[0] > 1 and not (times[1:] > times[:-1]).all()):
            raise ValueError("times must be finite and strictly increasing")
        if not isinstance(y, Tensor) or y.shape != (times.shape[0], self.observation_dim):
            raise ValueError(f"y must have shape (T, D) = ({times.shape[0]}, {self.observation_dim}), got {getattr(y, 'shape', type(y))}")
        if mask is None:
            mask = ~torch.isnan(y)
        elif not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.shape != y.shape:
            raise ValueError(f"mask must be a bool tensor of the shape of y {tuple(y.shape)}, got {getattr(mask, 'shape', type(mask))}")
        if (torch.isnan(y) & mask).any():
            raise ValueError("y is NaN at entries the mask marks as observed")
        if torch.isinf(y[mask]).any():
            raise ValueError("y contains infinite observed values")
        return times, torch.where(mask, y, torch.zeros((), dtype=y.dtype, device=y.device)), mask

    def _latent_inputs(self, times: Tensor) -> Tensor:
        return times.expand(self.latent_dim, -1).unsqueeze(-1)  # (L, T, 1)

    # ------------------------------------------------------------------ inference
    def encode(self, y: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        r"""Pseudo-observations :math:`(\tilde y, \tilde v)`, each ``(L, T)``, from zero-filled ``y`` and its mask.

        :param y: observations ``(T, D)``, zero at missing entries.
        :param mask: ``(T, D)`` bool, ``True`` at observed entries.
        """
        out = self.encoder(torch.cat([y, mask.to(y.dtype)], dim=-1))
        mean, raw_var = out.split(self.latent_dim, dim=-1)
        var = torch.nn.functional.softplus(raw_var) + self.min_pseudo_variance
        return mean.mT, var.mT

    def set_posterior(self, times: Tensor, pseudo_mean: Tensor, pseudo_var: Tensor) -> None:
        r"""Set the latent GPs' whitened :math:`q(v) = \mathcal{N}(B^{-1} W \tilde v^{-1} \tilde y, B^{-1})` (class docstring).

        :param times: the task's times ``(T,)``.
        :param pseudo_mean: the pseudo-observations :math:`\tilde y`, ``(L, T)``.
        :param pseudo_var: their variances :math:`\tilde v > 0`, ``(L, T)``.
        """
        strategy = self.latent_gp.variational_strategy
        kernel = strategy.kernel
        ivs = strategy.inducing_variables
        chol = psd_safe_cholesky(to_dense(ivs.Kuu(kernel)))
        W = _solve_lower(chol, ivs.Kuf(kernel, self._latent_inputs(times)))  # (L, M, T)
        W_scaled = W / pseudo_var.unsqueeze(-2)
        eye = torch.eye(W.shape[-2], dtype=W.dtype, device=W.device)
        B_chol = psd_safe_cholesky(eye + W_scaled @ W.mT)
        shift = W_scaled @ pseudo_mean.unsqueeze(-1)
        mean = torch.cholesky_solve(shift, B_chol).squeeze(-1)
        root = torch.linalg.solve_triangular(B_chol, eye.expand_as(B_chol), upper=False).mT  # B^{-1} = root root^T
        strategy._variational_distribution.set(mean, root)
        strategy.variational_params_initialized.fill_(1)

    def encode_posterior(self, times: Tensor, y: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        r"""Encode ``(times, y, mask)``, set :math:`q(u)` from it; returns :math:`(\tilde y, \tilde v, \mathrm{mask})`.

        :param times: the times ``(T,)``, finite and strictly increasing.
        :param y: observations ``(T, D)``, NaN allowed at missing entries.
        :param mask: ``(T, D)`` bool, ``True`` at observed entries; ``None`` (default): where ``y`` is not NaN.
        """
        times, y, mask = self._check(times, y, mask)
        pseudo_mean, pseudo_var = self.encode(y, mask)
        self.set_posterior(times, pseudo_mean, pseudo_var)
        return pseudo_mean, pseudo_var, mask

    def latent_marginals(self, times: Tensor) -> tuple[Tensor, Tensor]:
        r"""Mean and variance of :math:`q(f_t^l)`, each ``(L, T)``, under the current :math:`q(u)`.

        :param times: the times ``(T,)``.
        """
        q_f = self.latent_gp(self._latent_inputs(times))
        return q_f.mean, q_f.variance

    # ------------------------------------------------------------------ objective
    def _log_likelihood(self, y: Tensor, mask: Tensor, decoded: Tensor) -> Tensor:
        r""":math:`\log \mathcal{N}(y \mid \mathrm{decoded}, \sigma^2)` summed over the observed entries, for each leading sample."""
        noise = self.noise.to(y.dtype)
        log_density = -0.5 * (torch.log(2 * math.pi * noise) + (y - decoded).square() / noise)
        return (log_density * mask.to(y.dtype)).sum((-2, -1))

    def gp_terms(self, times: Tensor, pseudo_mean: Tensor, pseudo_var: Tensor) -> tuple[Tensor, Tensor, MultivariateNormal]:
        r"""``(pseudo_fit, gp_elbo, q(f))`` of the latent GPs with :math:`q(u)` set from the pseudo-observations
        :math:`(\tilde y, \tilde v)` (each ``(L, T)``):
        :math:`\mathrm{pseudo\_fit} = \sum_{l,t} \mathbb{E}_q \log \mathcal{N}(\tilde y \mid f, \tilde v)` and ``gp_elbo`` its
        Hensman ELBO :math:`\sum_l \mathcal{L}_H^l` (online with ``online_kl=True``), computed by ``gp_objective``.

        :param times: the task's times ``(T,)``.
        :param pseudo_mean: the pseudo-observations :math:`\tilde y`, ``(L, T)``.
        :param pseudo_var: their variances :math:`\tilde v > 0`, ``(L, T)``.
        """
        self.set_posterior(times, pseudo_mean, pseudo_var)
        q_f = self.latent_gp(self._latent_inputs(times))
        num_data = times.shape[0]
        self.gp_objective.num_data = num_data
        fit, kl, log_prior = self.gp_objective(q_f, pseudo_mean, noise=pseudo_var)
        return fit.sum() * num_data, (fit - kl + log_prior).sum() * num_data, q_f

    def elbo_terms(self, times: Tensor, y: Tensor, mask: Tensor | None = None, num_samples: int = 1) -> SVGPVAETerms:
        """The SVGPVAE ELBO of one (whole) task (thesis App. C), with ``num_samples`` reparameterised
        draws of :math:`f_t` from its marginal :math:`q(f_t)` for the reconstruction term.

        :param times: the task's times ``(T,)``, finite and strictly increasing.
        :param y: observations ``(T, D)``, NaN allowed at missing entries.
        :param mask: ``(T, D)`` bool, ``True`` at observed entries; ``None`` (default): where ``y`` is not NaN.
        :param num_samples: the number of draws, a positive int (default 1).
        """
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")
        times, y, mask = self._check(times, y, mask)
        pseudo_mean, pseudo_var = self.encode(y, mask)
        pseudo_fit, gp_elbo, q_f = self.gp_terms(times, pseudo_mean, pseudo_var)
        mean, var = q_f.mean, q_f.variance
        eps = torch.randn(num_samples, *mean.shape, dtype=mean.dtype, device=mean.device)
        latent = (mean + var.clamp_min(0).sqrt() * eps).mT  # (S, T, L)
        reconstruction = self._log_likelihood(y, mask, self.decoder(latent)).mean()
        return SVGPVAETerms(reconstruction - pseudo_fit + gp_elbo, reconstruction, pseudo_fit, gp_elbo)

    # ------------------------------------------------------------------ prediction
    @torch.no_grad()
    def predictive_samples(self, times: Tensor, y: Tensor, mask: Tensor | None = None, num_samples: int = 100) -> Tensor:
        r"""Draws of the decoded mean :math:`\varphi(f_t)`, ``(S, T, D)``, with :math:`q(u)` encoded from the
        observed entries of ``y``; the predictive of :math:`y_t` is their mixture with noise :math:`\sigma^2`.

        :param times: the times ``(T,)``, finite and strictly increasing.
        :param y: observations ``(T, D)``, NaN allowed at missing entries (those to predict).
        :param mask: ``(T, D)`` bool, ``True`` at the entries to encode; ``None`` (default): where ``y`` is not NaN.
        :param num_samples: the number ``S`` of draws (default 100).
        """
        self.encode_posterior(times, y, mask)
        mean, var = self.latent_marginals(times)
        eps = torch.randn(num_samples, *mean.shape, dtype=mean.dtype, device=mean.device)
        return self.decoder((mean + var.clamp_min(0).sqrt() * eps).mT)
