r"""The likelihood of ``m`` independent outputs of :class:`~gpytorch_hippo.botorch.OnlineGPModel`.

``OnlineGPModel(train_X, train_Y)`` with ``train_Y`` of shape ``(n, m)``, ``m > 1``, has one single-output online
sparse GP per output (``model.outputs[j]``), each with its own hyperparameters and inducing variables, under shared
input and outcome transforms. The outputs are independent a posteriori,

.. math::
    q(f_1(X), \dots, f_m(X)) = \prod_{j=1}^m q_j(f_j(X)),

so the posterior is a multi-task normal with a block-diagonal covariance, as for BoTorch's batched multi-output
models, and :class:`IndependentOutputsLikelihood` is the likelihood BoTorch's exact fit reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import gpytorch
import torch
from gpytorch.distributions import MultivariateNormal
from gpytorch.likelihoods import Likelihood
from torch import Tensor, nn

from probseq._compat import GaussianLikelihoodBase

__all__ = ["IndependentOutputsLikelihood"]


class IndependentOutputsLikelihood(GaussianLikelihoodBase):
    r"""The outputs' Gaussian likelihoods as one, over BoTorch's batched multi-output layout: a function distribution
    with mean ``(*b, m, n)`` gets output ``j``'s noise :math:`\sigma_j^2` on the diagonal of row ``j``, so that
    ``ExactMarginalLogLikelihood(model.likelihood, model)`` sums each output's exact marginal likelihood
    :math:`\log \mathcal{N}(y_j;\, m_j(X), K_j(X, X) + \sigma_j^2 I)`, as for ``SingleTaskGP`` with ``m`` outputs.

    :param likelihoods: the outputs' ``GaussianLikelihood`` modules (shared, not copied): ``likelihoods[j]``.
    """

    #: the outputs' likelihoods (an ``nn.ModuleList``, typed by what it holds)
    likelihoods: Sequence[gpytorch.likelihoods.GaussianLikelihood]

    def __init__(self, likelihoods: Sequence[gpytorch.likelihoods.GaussianLikelihood]):
        Likelihood.__init__(self)  # the noise lives in the outputs' likelihoods, not in a noise model of its own
        self.likelihoods = cast(Sequence[gpytorch.likelihoods.GaussianLikelihood], nn.ModuleList(likelihoods))

    def _noise(self, shape: torch.Size) -> Tensor:
        noise = torch.cat([likelihood.noise.reshape(-1)[:1] for likelihood in self.likelihoods])
        return noise.unsqueeze(-1).expand(shape)

    def marginal(self, function_dist: MultivariateNormal, *args: Any, **kwargs: Any) -> MultivariateNormal:
        r""":math:`\mathcal{N}(\mu, K + \operatorname{diag}(\sigma_j^2))` for ``function_dist`` of mean ``(*b, m, n)``.

        :param function_dist: the outputs' distributions at their inputs, batched over the outputs.
        """
        mean = function_dist.mean
        return MultivariateNormal(mean, function_dist.lazy_covariance_matrix.add_diagonal(self._noise(mean.shape)))

    def forward(self, function_samples: Tensor, *args: Any, **kwargs: Any) -> torch.distributions.Normal:
        r""":math:`p(y \mid f)`, independent normals with output ``j``'s noise on row ``j`` of ``(*b, m, n)``.

        :param function_samples: samples of ``f``, ``(*b, m, n)``.
        """
        return torch.distributions.Normal(function_samples, self._noise(function_samples.shape).sqrt())
