"""A BoTorch surrogate for non-Gaussian streams: OHSVGP / OSVGP (:class:`~gpytorch_hippo.online.OnlineELBO`).

:class:`OnlineVariationalGPModel` is the counterpart of :class:`~gpytorch_hippo.botorch.OnlineGPModel`
for any GPyTorch likelihood (``BernoulliLikelihood`` for pass/fail observations,
:class:`~gpytorch_hippo.likelihoods.NegativeBinomialLikelihood` for counts): each batch is absorbed by
maximising the online ELBO (Bui et al. 2017; thesis eq. (4.6)) over ``q(u)`` with Adam, old batches are
never revisited, and ``posterior`` is the latent ``q(f(X))`` -- BoTorch's convention for models with
non-Gaussian likelihoods (acquisitions act on the latent function).
"""

from __future__ import annotations

import copy
from typing import Any

import gpytorch
import torch
from botorch.acquisition.objective import PosteriorTransform
from botorch.models.model import Model
from botorch.posteriors.gpytorch import GPyTorchPosterior
from gpytorch.distributions import MultivariateNormal
from torch import Tensor

from probseq._validation import check_real, check_tensor

from .._validation import floating_dtype
from ..inducing.base import InducingVariables
from ..inducing.hippo_variables import HiPPOInducingVariables
from ..online import OnlineELBO
from ..variational import InterdomainVariationalStrategy

__all__ = ["OnlineVariationalGPModel"]


class _LatentGP(gpytorch.models.ApproximateGP):
    """``f ~ GP(m, k)`` with ``q(u)`` on the given inducing variables (Cholesky variational distribution)."""

    def __init__(self, inducing_variables: InducingVariables, covar_module, mean_module):
        q = gpytorch.variational.CholeskyVariationalDistribution(inducing_variables.num_inducing)
        super().__init__(InterdomainVariationalStrategy(self, inducing_variables, q))
        self.covar_module, self.mean_module = covar_module, mean_module

    def forward(self, x: Tensor) -> MultivariateNormal:
        return MultivariateNormal(self.mean_module(x), self.covar_module(x))


class OnlineVariationalGPModel(Model, gpytorch.models.GP):
    """Online variational surrogate (OHSVGP with HiPPO inducing variables, OSVGP with points).

    :param train_X: first batch of inputs ``(n, d)``.
    :param train_Y: its observations ``(n, 1)`` (0/1 for Bernoulli, counts for negative binomial).
    :param inducing_variables: any :class:`~gpytorch_hippo.inducing.InducingVariables`; 1-D HiPPO
        ones are advanced to each batch's last input (the time), points stay where they are.
    :param likelihood: a GPyTorch likelihood of one latent function.
    :param covar_module: kernel (default: a scaled RBF with ``d`` length scales).
    :param mean_module: prior mean (default ``ZeroMean``; it is fixed after the first batch).
    :param num_steps: Adam steps on the online ELBO per batch.
    :param lr: Adam's learning rate.
    :param fit_hyperparameters: also train the kernel (and likelihood) on the first batch; later
        batches train ``q(u)`` only.
    """

    def __init__(
        self,
        train_X: Tensor,
        train_Y: Tensor,
        inducing_variables: InducingVariables,
        likelihood: gpytorch.likelihoods.Likelihood,
        covar_module: gpytorch.kernels.Kernel | None = None,
        mean_module: gpytorch.means.Mean | None = None,
        num_steps: int = 200,
        lr: float = 0.05,
        fit_hyperparameters: bool = True,
    ):
        super().__init__()
        train_X, train_Y = _check_batch(train_X, train_Y)
        if not isinstance(likelihood, gpytorch.likelihoods.Likelihood):
            raise TypeError(f"likelihood must be a gpytorch Likelihood, got {type(likelihood).__name__}")
        if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
            raise ValueError(f"num_steps must be a positive int, got {num_steps!r}")
        self.num_steps, self.lr = num_steps, check_real(lr, "lr", low=0, low_open=True)
        if covar_module is None:
            covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=train_X.shape[-1]))
        mean_module = gpytorch.means.ZeroMean() if mean_module is None else mean_module
        self.gp = _LatentGP(inducing_variables, covar_module, mean_module).to(train_X)
        self.likelihood = likelihood.to(train_X)
        self.elbo = OnlineELBO(self.likelihood, self.gp, num_data=train_X.shape[-2])
        self._absorb(train_X, train_Y, hyperparameters=fit_hyperparameters)
        self.gp.mean_module.requires_grad_(False)

    @property
    def num_outputs(self) -> int:
        return 1

    @property
    def batch_shape(self) -> torch.Size:
        return torch.Size([])

    def _absorb(self, X: Tensor, Y: Tensor, hyperparameters: bool = False) -> None:
        """Maximise the online ELBO of the batch ``(X, Y)`` over ``q(u)`` (and the hyperparameters)."""
        parameters = list(self.gp.variational_parameters())
        if hyperparameters:
            parameters += list(self.gp.hyperparameters()) + list(self.likelihood.parameters())
        optimizer = torch.optim.Adam([p for p in parameters if p.requires_grad], lr=self.lr)
        self.gp.train(), self.likelihood.train()
        y = Y[..., 0]
        for _ in range(self.num_steps):
            optimizer.zero_grad()
            (-self.elbo(self.gp(X), y)).backward()
            optimizer.step()
        self.gp.eval(), self.likelihood.eval()  # GPyTorch's eval() drops the strategy's train-mode caches

    def observe(self, X: Tensor, Y: Tensor) -> OnlineVariationalGPModel:
        """A new model with the batch ``(X, Y)`` absorbed (this one unchanged): the finished batch is
        stored (``end_task``), HiPPO variables advance to ``max(X)``, and ``q(u)`` is trained on the
        new batch's online ELBO.

        :param X: the batch's inputs ``(n, d)``.
        :param Y: its observations ``(n, 1)``.
        """
        X, Y = _check_batch(X, Y)
        model = copy.deepcopy(self)
        model.elbo.end_task(num_data=X.shape[-2])
        variables = model.gp.variational_strategy.inducing_variables
        if isinstance(variables, HiPPOInducingVariables) and variables.input_dim == 1 and float(X.max()) > variables.t:
            model.gp.variational_strategy.advance(float(X.max()))
        model._absorb(X, Y)
        return model

    def condition_on_observations(self, X: Tensor, Y: Tensor, **kwargs: Any) -> OnlineVariationalGPModel:
        """:meth:`observe` (an iterative online update; fantasies of non-Gaussian data are not provided).

        :param X: the batch's inputs ``(n, d)`` (no batch dimensions).
        :param Y: its observations ``(n, 1)``.
        :param kwargs: none accepted (BoTorch's interface).
        """
        if kwargs:
            raise TypeError(f"condition_on_observations got unexpected keyword arguments {sorted(kwargs)}")
        return self.observe(X, Y)

    def forward(self, X: Tensor) -> MultivariateNormal:
        """The latent ``q(f(X))`` (GPyTorch's ``model(X)``).

        :param X: inputs ``(*b, n, d)``.
        """
        return self.gp(check_tensor(X, "X", dtype=floating_dtype(self.gp.covar_module), min_dim=2))

    def posterior(
        self,
        X: Tensor,
        output_indices: list[int] | None = None,
        observation_noise: bool | Tensor = False,
        posterior_transform: PosteriorTransform | None = None,
        **kwargs: Any,
    ) -> GPyTorchPosterior:
        """The latent ``q(f(X))`` for ``X`` of shape ``(*b, q, d)``, as a ``GPyTorchPosterior``.

        :param X: inputs ``(*b, q, d)``.
        :param output_indices: ``None`` (default) or ``[0]``: the model has one output.
        :param observation_noise: must be ``False`` (default): the posterior is over the latent function only.
        :param posterior_transform: BoTorch ``PosteriorTransform`` applied to the result; ``None`` (default): none.
        """
        if output_indices is not None and list(output_indices) != [0]:
            raise ValueError(f"output_indices must be None or [0] for a single-output model, got {output_indices!r}")
        if observation_noise is not False:
            raise ValueError("observation_noise: the posterior of a non-Gaussian likelihood is over the latent function only")
        self.eval()
        posterior = GPyTorchPosterior(distribution=self(X))
        return posterior if posterior_transform is None else posterior_transform(posterior)


def _check_batch(X, Y) -> tuple[Tensor, Tensor]:
    X = check_tensor(X, "X", min_dim=2)
    Y = check_tensor(Y, "Y", dtype=X.dtype, min_dim=2)
    if X.dim() != 2 or X.shape[-2] < 1:
        raise ValueError(f"X must have shape (n, d) with n >= 1, got {tuple(X.shape)}")
    if Y.shape != (X.shape[0], 1):
        raise ValueError(f"Y must have shape ({X.shape[0]}, 1) to match X, got {tuple(Y.shape)}")
    return X, Y
