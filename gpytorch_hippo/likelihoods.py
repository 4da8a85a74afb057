"""Likelihoods used by the online experiments of thesis ch. 4 that GPyTorch does not ship."""

from __future__ import annotations

import torch
from gpytorch.constraints import Interval, Positive
from gpytorch.priors import Prior
from torch import Tensor

from probseq._compat import OneDimensionalLikelihood

__all__ = ["NegativeBinomialLikelihood"]


class NegativeBinomialLikelihood(OneDimensionalLikelihood):
    r"""Negative binomial likelihood for over-dispersed counts (the COVID deaths task, thesis §4.6).

    .. math::
        p(y \mid f) = \frac{\Gamma(y + r)}{\Gamma(r)\, y!}
            \Big(\frac{r}{r + \mu}\Big)^{r} \Big(\frac{\mu}{r + \mu}\Big)^{y},
        \qquad \mu = e^{f},

    so :math:`\mathbb{E}[y \mid f] = e^f` and :math:`\operatorname{Var}[y \mid f] = \mu + \mu^2 / r`; the learnable
    dispersion :math:`r > 0` (``total_count`` of ``torch.distributions.NegativeBinomial``) recovers the Poisson as
    :math:`r \to \infty`. ``expected_log_prob`` (the expected log-likelihood term
    :math:`\sum_i \mathbb{E}_{q(f_i)}[\log p(y_i \mid f_i)]` of the online ELBO, thesis eq. (4.6)) uses
    GPyTorch's 1-D Gauss-Hermite quadrature.

    :param dispersion_prior: optional prior on :math:`r`; ``None`` (default) registers none.
    :param dispersion_constraint: constraint on :math:`r`; ``None`` (default) means ``Positive()``.
    :param batch_shape: batch shape of :math:`r` (default ``torch.Size()``, one shared dispersion).
    """

    def __init__(
        self,
        dispersion_prior: Prior | None = None,
        dispersion_constraint: Interval | None = None,
        batch_shape: torch.Size = torch.Size(),
    ):
        super().__init__()
        if dispersion_constraint is None:
            dispersion_constraint = Positive()
        self.register_parameter("raw_dispersion", torch.nn.Parameter(torch.zeros(*batch_shape, 1)))
        self.register_constraint("raw_dispersion", dispersion_constraint)
        if dispersion_prior is not None:
            self.register_prior("dispersion_prior", dispersion_prior, lambda m: m.dispersion, lambda m, v: m._set_dispersion(v))
        self.dispersion = 1.0

    @property
    def dispersion(self) -> Tensor:
        """The dispersion ``r`` (number of failures), ``Var[y|f] = e^f + e^{2f} / r``."""
        return self.raw_dispersion_constraint.transform(self.raw_dispersion)

    @dispersion.setter
    def dispersion(self, value) -> None:
        self._set_dispersion(value)

    def _set_dispersion(self, value) -> None:
        value = torch.as_tensor(value, dtype=self.raw_dispersion.dtype, device=self.raw_dispersion.device)
        if not bool((value > 0).all()):
            raise ValueError(f"dispersion must be positive, got {value}")
        self.initialize(raw_dispersion=self.raw_dispersion_constraint.inverse_transform(value))

    def forward(self, function_samples: Tensor, *args, **kwargs) -> torch.distributions.NegativeBinomial:
        r"""The conditional :math:`p(y \mid f)`, a ``NegativeBinomial`` with mean :math:`e^f` and dispersion :math:`r`.

        :param function_samples: latent function values :math:`f`, any shape ``(..., N)`` broadcastable with :math:`r`.
        """
        r = self.dispersion.squeeze(-1)
        # total_count * exp(logits) = exp(f): the mean of the counts.
        return torch.distributions.NegativeBinomial(total_count=r, logits=function_samples - r.log(), validate_args=False)

    def expected_log_prob(self, observations: Tensor, function_dist, *args, **kwargs) -> Tensor:
        r"""Per-point :math:`\mathbb{E}_{q(f_i)}[\log p(y_i \mid f_i)]` by Gauss-Hermite quadrature.

        :param observations: the counts :math:`y`, non-negative integers (any float dtype), shape ``(..., N)``.
        :param function_dist: the Gaussian marginals :math:`q(f)` (a ``MultivariateNormal`` over the ``N`` points).
        :return: the expected log-likelihoods ``(..., N)``.
        :raises ValueError: if ``observations`` holds NaN, negative or non-integer values.
        """
        if torch.isnan(observations).any():
            raise ValueError("observations contains NaN values")
        if (observations < 0).any() or (observations != observations.round()).any():
            raise ValueError("observations must be non-negative integer counts")
        return super().expected_log_prob(observations, function_dist, *args, **kwargs)
