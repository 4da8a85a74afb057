r"""``m`` independent outputs on shared inputs for :class:`~gpytorch_hippo.botorch.OnlineGPModel`.

``OnlineGPModel(train_X, train_Y)`` with ``train_Y`` of shape ``(n, m)``, ``m > 1``, builds a
:class:`MultiOutputOnlineGPModel`: one single-output online sparse GP per output, each with its own
hyperparameters and its own copy of the inducing variables, under shared input and outcome
transforms. The outputs are independent a posteriori,

.. math::
    q(f_1(X), \dots, f_m(X)) = \prod_{j=1}^m q_j(f_j(X)),

so its posterior is a multi-task normal with a block-diagonal covariance, as for BoTorch's batched
multi-output models, and it serves multi-objective acquisitions (``qLogNoisyExpectedHypervolume
Improvement``) and look-ahead ones on scalarised outputs.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, cast

import gpytorch
import torch
from botorch.acquisition.objective import PosteriorTransform
from botorch.exceptions.errors import BotorchTensorDimensionError
from botorch.fit import fit_gpytorch_mll
from botorch.models.model import Model
from botorch.models.transforms.input import InputTransform
from botorch.models.transforms.outcome import OutcomeTransform, Standardize
from botorch.posteriors.gpytorch import GPyTorchPosterior
from botorch.posteriors.posterior import Posterior
from botorch.utils.types import DEFAULT
from gpytorch.distributions import MultitaskMultivariateNormal, MultivariateNormal
from gpytorch.likelihoods import Likelihood
from gpytorch.mlls import ExactMarginalLogLikelihood, MarginalLogLikelihood
from linear_operator import to_linear_operator
from torch import Tensor, nn

from probseq._compat import DefaultType, GaussianLikelihoodBase, IncompatibleKeys, child_modules
from probseq._validation import check_tensor

from .._validation import floating_dtype
from ..inducing.base import InducingVariables
from ._checks import check_points_near, check_X_Y, check_Yvar, split_third_argument
from .models import OnlineGPModel, OnlineModelBase, register_multi_output_model, warn_posterior_not_restored

__all__ = ["MultiOutputOnlineGPModel", "IndependentOutputsLikelihood"]


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


_PER_OUTPUT = ("covar_module", "mean_module", "inducing_variables", "online")


@register_multi_output_model
class MultiOutputOnlineGPModel(OnlineModelBase):
    """``m`` independent online sparse GPs on shared inputs, built by ``OnlineGPModel`` from an
    ``(n, m)`` ``train_Y`` (see :class:`~gpytorch_hippo.botorch.OnlineGPModel` for the arguments). It is not an
    :class:`~gpytorch_hippo.botorch.OnlineGPModel` but holds one per output, as BoTorch's ``ModelListGP`` holds its
    models, and shares with it the base :class:`~gpytorch_hippo.botorch.models.OnlineModelBase` (BoTorch's
    transforms and fantasies).

    ``outputs[j]`` is output ``j``'s single-output :class:`~gpytorch_hippo.botorch.OnlineGPModel`
    in the transformed spaces (it holds no transforms); ``covar_module``, ``mean_module`` and
    ``inducing_variables`` are per output and read there. ``likelihood`` is an
    :class:`IndependentOutputsLikelihood` of the outputs' likelihoods (``likelihood.likelihoods[j]``), so that
    ``fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))`` fits every output's exact marginal
    likelihood, as for ``SingleTaskGP``; ``subset_output`` keeps some of the outputs.

    :param train_X: first batch of inputs, ``(n, d)``.
    :param train_Y: its targets, ``(n, m)`` with ``m > 1`` outputs.
    :param train_Yvar: known observation noise variances ``(n, m)``; ``None`` (default): each output learns its noise.
    :param inducing_variables: one set of inducing variables, copied per output, or a sequence of ``m`` sets;
        ``None`` (default): :func:`~gpytorch_hippo.botorch.models.default_inducing_points` per output.
    :param covar_module: kernel, copied per output (default: ``SingleTaskGP``'s).
    :param likelihood: ``GaussianLikelihood``, copied per output (default: ``SingleTaskGP``'s).
    :param mean_module: prior mean, copied per output (default ``ConstantMean``).
    :param input_transform: shared input transform (default none); statistics from the first batch, then fixed.
    :param outcome_transform: shared outcome transform, default ``Standardize(m=m)``; ``None``: no transform.
    :param fit_maxiter: L-BFGS iterations of each output's first fit (default 100; ``0``: keep the given hyperparameters).
    :param refit_every: each output refreshes its hyperparameters in every ``k``-th :meth:`observe`; ``None``
        (default): never.
    :param keep_data: store the observed data per output (default ``True``); ``False``: only the online summaries.
    :param ordering: criterion of :func:`~gpytorch_hippo.ordering.order_inputs` for path variables (default
        ``"kernel_max"``).
    :param num_inducing: number of default inducing points per output (default :data:`~gpytorch_hippo.botorch.models.DEFAULT_NUM_INDUCING`).
    """

    #: one single-output model per output (an ``nn.ModuleList``, typed by what it holds)
    outputs: Sequence[OnlineGPModel]
    #: BoTorch's outcome transform of all outputs, where the model has one
    outcome_transform: OutcomeTransform

    def __init__(
        self,
        train_X: Tensor,
        train_Y: Tensor,
        train_Yvar: Tensor | None = None,
        inducing_variables: InducingVariables | Sequence[InducingVariables] | None = None,
        covar_module: gpytorch.kernels.Kernel | None = None,
        likelihood: gpytorch.likelihoods.GaussianLikelihood | None = None,
        mean_module: gpytorch.means.Mean | None = None,
        input_transform: InputTransform | None = None,
        outcome_transform: OutcomeTransform | DefaultType | None = DEFAULT,
        fit_maxiter: int = 100,
        refit_every: int | None = None,
        keep_data: bool = True,
        ordering: str = "kernel_max",
        num_inducing: int | None = None,
    ):
        super().__init__()
        train_Yvar, inducing_variables = split_third_argument(train_Yvar, inducing_variables)
        num_outputs = train_Y.shape[-1]
        check_X_Y(train_X, train_Y, "train_X", "train_Y", num_outputs)
        if train_X.dim() != 2:
            raise ValueError(f"train_X must have shape (n, d), got {tuple(train_X.shape)}")
        check_Yvar(train_Yvar, train_Y, "train_Yvar")
        per_output: list[InducingVariables | None]
        if isinstance(inducing_variables, InducingVariables) or inducing_variables is None:
            per_output = [copy.deepcopy(inducing_variables) for _ in range(num_outputs)]
        elif not (
            isinstance(inducing_variables, Sequence)
            and len(inducing_variables) == num_outputs
            and all(isinstance(v, InducingVariables) for v in inducing_variables)
        ):
            raise TypeError(
                f"inducing_variables must be one InducingVariables instance or a sequence of {num_outputs} "
                f"(one per output), got {inducing_variables!r}"
            )
        else:
            per_output = list(inducing_variables)
        if isinstance(outcome_transform, DefaultType):
            outcome_transform = Standardize(m=num_outputs)
        if input_transform is not None:
            self.input_transform = input_transform.to(train_X)
        if outcome_transform is not None:
            self.outcome_transform = outcome_transform.to(train_X)
        x, y = self._to_model_space(train_X, train_Y, fit_transforms=True)
        noise = None
        if train_Yvar is not None:
            noise = self.outcome_transform(train_Y, train_Yvar, X=x)[1] if outcome_transform is not None else train_Yvar
        if input_transform is not None:
            for variables in per_output:
                if variables is not None:
                    check_points_near(variables, x)
        models = [
            OnlineGPModel(
                x,
                y[..., j : j + 1],
                None if noise is None else noise[..., j : j + 1],
                inducing_variables=per_output[j],
                covar_module=copy.deepcopy(covar_module),
                likelihood=copy.deepcopy(likelihood),
                mean_module=copy.deepcopy(mean_module),
                outcome_transform=None,
                fit_maxiter=fit_maxiter,
                refit_every=refit_every,
                keep_data=keep_data,
                ordering=ordering,
                num_inducing=num_inducing,
            )
            for j in range(num_outputs)
        ]
        self.outputs = cast(Sequence[OnlineGPModel], nn.ModuleList(models))
        self.fit_maxiter, self.refit_every, self.keep_data, self.ordering = fit_maxiter, refit_every, keep_data, ordering
        self.eval()

    def train(self, mode: bool = True) -> MultiOutputOnlineGPModel:
        """GPyTorch's modes; each output refreshes its own stored posterior (:meth:`OnlineGPModel.train`).

        :param mode: ``True`` (default) for train mode, ``False`` for eval mode.
        """
        return Model.train(self, mode)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """A checkpoint of this model restored whole, or a warm start per output
        (:meth:`OnlineGPModel.load_state_dict`): kernels, likelihoods and means loaded, this model's data,
        transforms and posteriors (recomputed from the kept data) kept, with one :class:`~.models.OnlineGPModelWarning`.

        :param state_dict: a ``state_dict`` of a :class:`MultiOutputOnlineGPModel` with the same number of outputs.
        :param strict: as ``torch.nn.Module.load_state_dict`` for a whole checkpoint (default ``True``); a warm start ignores it.
        :param assign: as ``torch.nn.Module.load_state_dict`` for a whole checkpoint (default ``False``).
        :return: ``(missing_keys, unexpected_keys)`` as ``torch.nn.Module.load_state_dict`` returns them (a warm start:
            each output's, under its ``outputs.j.`` prefix).
        """
        per_output = [
            {k[len(f"outputs.{j}.") :]: v for k, v in state_dict.items() if k.startswith(f"outputs.{j}.")} for j in range(len(self.outputs))
        ]
        if any(output.is_warm_start(sub) for output, sub in zip(self.outputs, per_output)):
            keep_data = self.outputs[0].stored_inputs is not None
            if keep_data:
                warn_posterior_not_restored()
            missing, unexpected = [], []
            for j, (output, sub) in enumerate(zip(self.outputs, per_output)):
                # without kept data an output's warm start is refused by its load_state_dict, naming what to call
                warm_without_data = not keep_data and output.is_warm_start(sub)
                result = output.load_state_dict(sub) if warm_without_data else output.load_hyperparameters(sub)
                missing += [f"outputs.{j}.{key}" for key in result.missing_keys]
                unexpected += [f"outputs.{j}.{key}" for key in result.unexpected_keys]
            return IncompatibleKeys(missing, unexpected)
        return torch.nn.Module.load_state_dict(self, state_dict, strict=strict, assign=assign)

    # ------------------------------------------------------------------ BoTorch's model contract
    @property
    def num_outputs(self) -> int:
        return len(self.outputs)

    @property
    def num_updates(self) -> Tensor:
        """The number of batches absorbed (the same for every output: each output model's ``num_updates`` buffer)."""
        return self.outputs[0].num_updates

    @property
    def batch_shape(self) -> torch.Size:
        return self.outputs[0].batch_shape

    @property
    def likelihood(self) -> IndependentOutputsLikelihood:
        return IndependentOutputsLikelihood([output.likelihood for output in self.outputs])

    def starts_from_sparse_fit(self) -> bool:
        return any(output.starts_from_sparse_fit() for output in self.outputs)

    def custom_fit(self, mll: MarginalLogLikelihood, closure=None, closure_kwargs=None, optimizer_kwargs=None, **kwargs: Any):
        """BoTorch's ``fit_gpytorch_mll(mll)`` for this model: an ``ExactMarginalLogLikelihood`` without a closure of
        its own is maximised output by output (each output's exact marginal likelihood and priors, as ``SingleTaskGP``
        fits its outputs); any other objective as :meth:`OnlineModelBase.custom_fit` does.

        :param mll: the marginal likelihood of this model to maximise.
        :param closure: ``fit_gpytorch_mll``'s closure (``None``: BoTorch's default).
        :param closure_kwargs: ``fit_gpytorch_mll``'s keyword arguments of the closure.
        :param optimizer_kwargs: ``fit_gpytorch_mll``'s keyword arguments of the optimiser.
        :param kwargs: ``fit_gpytorch_mll``'s other keyword arguments (``optimizer``, ``max_attempts``, ...).
        """
        if isinstance(mll, ExactMarginalLogLikelihood) and closure is None:
            for output in self.outputs:
                fit_gpytorch_mll(
                    type(mll)(output.likelihood, output), closure_kwargs=closure_kwargs, optimizer_kwargs=optimizer_kwargs, **kwargs
                )
            return mll.eval()
        return super().custom_fit(mll, closure=closure, closure_kwargs=closure_kwargs, optimizer_kwargs=optimizer_kwargs, **kwargs)

    def subset_output(self, idcs: list[int]) -> MultiOutputOnlineGPModel:
        """BoTorch's ``subset_output``: a model of the outputs ``idcs`` only, with their posteriors (and transforms).

        :param idcs: the outputs to keep, a non-empty list of distinct ints in ``[0, m)``.
        """
        indices = list(idcs)
        if (
            not indices
            or len(set(indices)) != len(indices)
            or any(not isinstance(j, int) or not 0 <= j < self.num_outputs for j in indices)
        ):
            raise ValueError(f"idcs must be a non-empty list of distinct ints in [0, {self.num_outputs}), got {idcs!r}")
        model = self._with_outputs([copy.deepcopy(self.outputs[j]) for j in indices])
        if hasattr(self, "outcome_transform"):
            model.outcome_transform = self.outcome_transform.subset_output(indices)
        return model

    def __getattr__(self, name: str):
        if name in _PER_OUTPUT:
            outputs = child_modules(self).get("outputs")
            count = len(outputs) if isinstance(outputs, nn.ModuleList) else 0
            raise AttributeError(f"a model with {count} outputs has one {name} per output: read model.outputs[j].{name}")
        return super().__getattr__(name)

    @property
    def train_inputs(self) -> tuple[Tensor]:
        """The stored inputs per output, ``(m, n, d)`` (BoTorch's batched multi-output layout), if ``keep_data``."""
        return (torch.stack([output.train_inputs[0] for output in self.outputs], dim=-3),)

    @property
    def train_targets(self) -> Tensor:
        """The stored (outcome-transformed) targets per output, ``(m, n)``, if ``keep_data``."""
        return torch.stack([output.train_targets for output in self.outputs], dim=-2)

    def posterior(  # type: ignore[override]  # Model's signature, which FantasizeMixin's narrower one does not follow
        self,
        X: Tensor,
        output_indices: list[int] | None = None,
        observation_noise: bool | Tensor = False,
        posterior_transform: PosteriorTransform | None = None,
    ) -> Posterior:
        """The independent outputs' joint posterior at ``X`` ``(*b, q, d)``: a ``GPyTorchPosterior`` over
        ``broadcast(b, batch_shape) x q x m'`` (``m'`` = ``len(output_indices)``, default all ``m``).

        :param X: inputs ``(*b, q, d)`` in the original input space.
        :param output_indices: the outputs to return, a non-empty list of ints in ``[0, m)``; ``None`` (default): all.
        :param observation_noise: ``False`` (default): the latent ``f``; ``True``: add each output's likelihood noise;
            a tensor ``(*b, q, m)``: these noise variances, one column per output (model space).
        :param posterior_transform: BoTorch ``PosteriorTransform`` applied to the result; ``None`` (default): none.
        """
        indices = list(range(self.num_outputs)) if output_indices is None else list(output_indices)
        if not indices or any(not isinstance(j, int) or not 0 <= j < self.num_outputs for j in indices):
            raise ValueError(f"output_indices must be a non-empty list of ints in [0, {self.num_outputs}), got {output_indices!r}")
        X = check_tensor(X, "X", dtype=floating_dtype(self.outputs[0].covar_module))
        if X.dim() < 2:
            raise ValueError(f"X must have shape (*batch, q, d), got {tuple(X.shape)}")
        if isinstance(observation_noise, Tensor) and (observation_noise.dim() < 2 or observation_noise.shape[-1] != self.num_outputs):
            raise BotorchTensorDimensionError(
                f"observation_noise must have shape (*batch, q, {self.num_outputs}) (one column per output), "
                f"got {tuple(observation_noise.shape)}"
            )
        self.eval()
        x = self.transform_inputs(X)
        mvns = []
        for j in indices:
            noise = observation_noise[..., j : j + 1] if isinstance(observation_noise, Tensor) else observation_noise
            mvns.append(self.outputs[j].posterior(x, observation_noise=noise).distribution)
        mvn = mvns[0] if len(mvns) == 1 else MultitaskMultivariateNormal.from_independent_mvns(mvns)
        posterior: Posterior = GPyTorchPosterior(distribution=mvn)
        if hasattr(self, "outcome_transform"):
            transform = self.outcome_transform if len(indices) == self.num_outputs else self.outcome_transform.subset_output(indices)
            posterior = transform.untransform_posterior(posterior, X=x)
        if posterior_transform is not None:
            return posterior_transform(posterior)
        return posterior

    def forward(self, X: Tensor) -> MultivariateNormal:
        """``q(f(X))`` in the model's spaces, batched over the outputs: mean ``(*b, m, q)``, as
        BoTorch's batched multi-output GPs return from ``model(X)``. In train mode each output's prior at model-space
        inputs ``(*b, m, n, d)`` (:attr:`train_inputs`; ``(n, d)``: the same inputs for every output), as
        :meth:`OnlineGPModel.forward`, for ``ExactMarginalLogLikelihood``.

        :param X: inputs ``(*b, q, d)`` in the original input space (train mode: as described).
        """
        X = check_tensor(X, "X", dtype=floating_dtype(self.outputs[0].covar_module), min_dim=2)
        if self.training:
            X = X.expand(self.num_outputs, *X.shape) if X.dim() == 2 else X
            mvns = [output(X[..., j, :, :]) for j, output in enumerate(self.outputs)]
        else:
            x = self.transform_inputs(X)
            mvns = [output.online(x) for output in self.outputs]
        return MultivariateNormal(
            torch.stack([mvn.mean for mvn in mvns], dim=-2),
            to_linear_operator(torch.stack([mvn.covariance_matrix for mvn in mvns], dim=-3)),
        )

    def condition_on_observations(self, X: Tensor, Y: Tensor, **kwargs: Any) -> MultiOutputOnlineGPModel:
        """A new model with ``(X, Y)``, ``Y`` of ``(*b', n, m)``, absorbed by one online update per output
        (``noise``: ``(*b, n, m)``, in the outcome space as ``Y``). The original model is not changed.

        :param X: new inputs ``(*b, n, d)`` in the original input space.
        :param Y: their observations ``(*b', n, m)`` in the original outcome space.
        :param kwargs: only ``noise``: known noise variances ``(*b, n, m)`` like ``Y``; without it the likelihoods' noise.
        """
        unknown = sorted(set(kwargs) - {"noise"})
        if unknown:
            raise TypeError(f"condition_on_observations got unexpected keyword arguments {unknown}")
        m = self.num_outputs
        if isinstance(X, Tensor) and isinstance(Y, Tensor) and X.dim() >= 2 and X.shape[-2] == 0 and Y.shape[-2:] == (0, m):
            return self._with_outputs([output.condition_on_observations(X, Y[..., j : j + 1]) for j, output in enumerate(self.outputs)])
        check_X_Y(X, Y, "X", "Y", m)
        noise = kwargs.get("noise")
        if noise is not None:
            noise = check_tensor(noise, "noise", dtype=floating_dtype(self.outputs[0].covar_module))
            if noise.dim() < 2 or noise.shape[-1] != m:
                raise BotorchTensorDimensionError(f"noise must have shape (*batch, n, {m}) like Y, got {tuple(noise.shape)}")
        if hasattr(self, "outcome_transform"):
            Y, noise = self.outcome_transform(Y, noise, X=X)
        x = self.transform_inputs(X)
        return self._with_outputs(
            [output.get_fantasy_model(x, Y[..., j], None if noise is None else noise[..., j]) for j, output in enumerate(self.outputs)]
        )

    def get_fantasy_model(self, inputs: Tensor, targets: Tensor, noise: Tensor | None = None, **kwargs: Any):
        """Not supported for several outputs: raises ``NotImplementedError`` (use :meth:`condition_on_observations`).

        :param inputs: new inputs (GPyTorch's interface).
        :param targets: their observations.
        :param noise: their noise variances.
        """
        raise NotImplementedError(
            "get_fantasy_model of a multi-output OnlineGPModel: use condition_on_observations with Y of shape "
            f"(*batch, n, {self.num_outputs}), or put single-output OnlineGPModels in a ModelListGP"
        )

    def observe(self, X: Tensor, Y: Tensor, Yvar: Tensor | None = None) -> MultiOutputOnlineGPModel:
        """Streaming step for ``(X, Y)`` of ``(n, d)``, ``(n, m)`` (and known noise ``Yvar`` ``(n, m)``): every
        output's :meth:`OnlineGPModel.observe` (with its own hyperparameter refreshes every ``refit_every`` batches).

        :param X: the batch's inputs ``(n, d)`` in the original input space.
        :param Y: its observations ``(n, m)`` in the original outcome space.
        :param Yvar: its known noise variances ``(n, m)``; ``None`` (default) for outputs that learn their noise.
        """
        check_X_Y(X, Y, "X", "Y", self.num_outputs)
        if X.dim() != 2:
            raise ValueError(f"X must have shape (n, d) in observe (streaming data), got {tuple(X.shape)}")
        check_Yvar(Yvar, Y, "Yvar")
        x, y = self._to_model_space(X, Y)
        if Yvar is not None and hasattr(self, "outcome_transform"):
            Yvar = self.outcome_transform(Y, Yvar, X=x)[1]
        return self._with_outputs(
            [output.observe(x, y[..., j : j + 1], None if Yvar is None else Yvar[..., j : j + 1]) for j, output in enumerate(self.outputs)]
        )

    def fit_hyperparameters(self, x: Tensor, y: Tensor, maxiter: int = 100) -> None:
        """Each output's :meth:`OnlineGPModel.fit_hyperparameters` on its column of ``y`` ``(n, m)`` (model space).

        :param x: the batch's inputs ``(n, d)`` in the model (input-transformed) space.
        :param y: its targets ``(n, m)`` in the model (outcome-transformed) space.
        :param maxiter: the most L-BFGS-B iterations per output (default 100).
        """
        for j, output in enumerate(self.outputs):
            output.fit_hyperparameters(x, y[..., j], maxiter=maxiter)

    # ------------------------------------------------------------------ internals
    def _with_outputs(self, outputs: list[OnlineGPModel]) -> MultiOutputOnlineGPModel:
        """A copy of this model (transforms and settings) with ``outputs`` in place of its own."""
        model = copy.deepcopy(self, {id(output): output for output in self.outputs})
        model.outputs = cast(Sequence[OnlineGPModel], nn.ModuleList(outputs))
        return model

    def _to_model_space(
        self, X: Tensor, Y: Tensor, fit_transforms: bool = False, outcome_transformed: bool = False
    ) -> tuple[Tensor, Tensor]:
        """Transformed inputs ``(*b, n, d)`` and targets ``(*b, n, m)`` (see :meth:`OnlineGPModel._to_model_space`)."""
        x = self._inputs_to_model_space(X, fit_transforms)
        if hasattr(self, "outcome_transform") and not outcome_transformed:
            self.outcome_transform.train(fit_transforms)
            Y, _ = self.outcome_transform(Y, X=x)
            self.outcome_transform.eval()
        batch = torch.broadcast_shapes(x.shape[:-2], Y.shape[:-2])
        return x.expand(*batch, *x.shape[-2:]), Y.expand(*batch, *Y.shape[-2:])
