r"""Pathwise posterior samples of :class:`~gpytorch_hippo.botorch.OnlineGPModel` for BoTorch.

Registered with BoTorch's pathwise dispatchers, so that ``draw_matheron_paths``,
``get_matheron_path_model``, ``get_optimal_samples`` and the acquisitions built on them
(Thompson sampling through paths, ``qJointEntropySearch``, ``qPredictiveEntropySearch``,
``qLowerBoundMaxValueEntropy`` with optimal samples) run on the online surrogate. Matheron's rule
(Wilson et al. 2020) with the stored :math:`q(u)` in place of data, for inducing variables
:math:`u = g(f) + e` (:math:`g` linear, :math:`e` the :math:`K_{uu}` jitter):

.. math::
    (f \mid u)(\cdot) = f(\cdot) + K_{\cdot u}\,K_{uu}^{-1}\,(u - g(f) - e),
    \qquad u \sim q(u),\quad f \sim GP(m, k)\ \text{by Fourier features},

whose mean and covariance are those of the online posterior :math:`q(f)` (up to the features' error).
Inducing points: :math:`g(f) = f(Z)` on BoTorch's own prior paths. HiPPO variables:
:math:`g(f) = \int f(s)\,\phi(s)\,\mathrm{d}s`; the prior path :math:`f = m + \psi^\top w` uses Fourier features
:math:`\psi` whose projections :math:`Z = \int \psi(s)\,\phi(s)\,\mathrm{d}s` are known, so :math:`g(f) = Z^\top w`:
the variables' own random features along the path (inputs of several dimensions), or, for time
inputs, random features whose projections are the closed-form transforms :math:`\hat c(\omega)` of
:mod:`gpytorch_hippo.inducing.spectral`.
"""

from __future__ import annotations

import copy
from typing import cast

import torch
from botorch.sampling.pathwise.features import FeatureMap
from botorch.sampling.pathwise.paths import GeneralizedLinearPath, PathList
from botorch.sampling.pathwise.posterior_samplers import DrawMatheronPaths, MatheronPath
from botorch.sampling.pathwise.prior_samplers import DrawKernelFeaturePaths
from botorch.sampling.pathwise.update_strategies import GaussianUpdate
from botorch.sampling.pathwise.utils import get_input_transform, get_output_transform
from botorch.utils.context_managers import delattr_ctx
from gpytorch.likelihoods import Likelihood
from linear_operator import to_dense
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Size, Tensor

from probseq._compat import generic_kernel_feature_paths, tensor_version

from .._validation import floating_dtype
from ..inducing.base import InducingVariables
from ..inducing.hippo_backends import FourierFeatures, PathBackend
from ..inducing.hippo_variables import HiPPOInducingVariables
from ..inducing.points import InducingPoints
from ..inducing.spectral import hippo_support, hippo_transform
from .models import OnlineGPModel


def _stored_variables(model: OnlineGPModel) -> InducingPoints | HiPPOInducingVariables:
    """The stored task's inducing variables, or a named error for what paths do not cover."""
    if len(model.batch_shape) > 0:
        raise NotImplementedError(f"pathwise samples of a batched (fantasy) OnlineGPModel, batch_shape {tuple(model.batch_shape)}")
    variables = model.online.posterior_inducing_variables
    if not isinstance(variables, (InducingPoints, HiPPOInducingVariables)):
        raise NotImplementedError(
            f"pathwise samples of OnlineGPModel need InducingPoints or HiPPOInducingVariables, got {type(variables).__name__}"
        )
    return variables


class _CrossCovarianceMap(FeatureMap):
    r""":math:`x \mapsto K_{xu}` (``(*b, n, M)``): the feature map of the Matheron update for any inducing variables."""

    def __init__(self, variables: InducingVariables, kernel, input_transform=None):
        super().__init__()
        # a frozen copy of the kernel: paths are differentiated in x only, and backends reuse their caches
        # (a HiPPO path memory, say) only for kernels without gradients
        kernel = copy.deepcopy(kernel).requires_grad_(False)
        self.variables, self.kernel, self.input_transform, self.output_transform = variables, kernel, input_transform, None
        self.num_outputs, self.batch_shape = variables.num_inducing, Size()

    def forward(self, x: Tensor) -> Tensor:
        return to_dense(self.variables.Kuf(self.kernel, x)).mT


class _HiPPOFourierMap(FeatureMap):
    r""":math:`\psi(x) = \sqrt{a}\, [\cos(Wx), \sin(Wx)]` with :math:`k(x, x') \approx \psi(x)^\top \psi(x')` and the HiPPO
    projections :math:`Z = \int \psi(s)\, \phi(s)\, \mathrm{d}s` (``2R x M``) of the same features (module docstring)."""

    projections: Tensor
    frequencies: Tensor
    root: Tensor

    def __init__(self, variables: HiPPOInducingVariables, kernel):
        super().__init__()
        self.input_transform, self.output_transform = None, None
        if variables.input_dim > 1:  # the variables' own random features, projected along the path
            backend = cast(PathBackend, variables.backend_for(kernel))  # validates the kernel too
            frequencies, weights = backend.features.frequencies_and_weights(variables, kernel)
            self.projections = backend.memory(variables, kernel)
        else:
            support = hippo_support(variables.measure, variables.num_inducing, variables.memory.theta, variables.t, variables.start)
            if support is None:
                raise NotImplementedError(
                    f"pathwise samples of HiPPO variables with measure {variables.measure!r} whose support is clipped by "
                    f"the stream start ({variables.start}): their projections of Fourier features have no closed form"
                )
            frequencies, weights = FourierFeatures("random").frequencies_and_weights(variables, kernel)
            frequencies = frequencies.abs()  # k(r) = E cos(ωr) is even in ω: |ω| gives the same kernel
            omega = frequencies[:, 0].double()
            chat = torch.polar(torch.ones_like(omega), omega * support[0])[:, None] * hippo_transform(
                variables.measure, variables.num_inducing, variables.memory.theta, variables.t, variables.start, omega
            )
            root = weights.double().sqrt()[:, None]
            self.projections = torch.cat([root * chat.real, root * chat.imag])
        self.frequencies, self.root = frequencies.detach(), weights.detach().sqrt()
        self.num_outputs, self.batch_shape = 2 * self.frequencies.shape[0], Size()

        # (x, its version, grad mode, ψ(x)): the update path reuses the prior path's ψ(x)
        self._last: tuple[Tensor, int, bool, Tensor] | None = None

    def forward(self, x: Tensor) -> Tensor:
        last = self._last
        if last is not None and last[0] is x and last[1] == tensor_version(x) and last[2] == torch.is_grad_enabled():
            return last[3]
        phase = x @ self.frequencies.to(x.dtype).mT
        root = self.root.to(x.dtype)
        features = torch.cat([root * torch.cos(phase), root * torch.sin(phase)], dim=-1)
        self._last = (x, tensor_version(x), torch.is_grad_enabled(), features)
        return features


class _ProjectedFeatureMap(FeatureMap):
    r""":math:`x \mapsto \psi(x) Z = K_{xu}` for HiPPO variables on a path, whose ``Kuf`` is exactly this product."""

    def __init__(self, features: _HiPPOFourierMap):
        super().__init__()
        self.features, self.input_transform, self.output_transform = features, None, None
        self.num_outputs, self.batch_shape = features.projections.shape[-1], Size()

    def forward(self, x: Tensor) -> Tensor:
        return self.features(x) @ self.features.projections.to(x.dtype)


def _hippo_prior_paths(
    model: OnlineGPModel, variables: HiPPOInducingVariables, sample_shape: Size, input_transform=None, output_transform=None
) -> GeneralizedLinearPath:
    """``m + ψᵀ w``, ``w ~ N(0, I)``, on the features of :class:`_HiPPOFourierMap` of the stored ``variables``."""
    feature_map = _HiPPOFourierMap(variables, model.covar_module)
    dtype = floating_dtype(model.covar_module)
    weight = torch.randn(*sample_shape, feature_map.num_outputs, dtype=dtype, device=feature_map.projections.device)
    return GeneralizedLinearPath(
        feature_map=feature_map,
        weight=weight,
        bias_module=model.mean_module,
        input_transform=input_transform,
        output_transform=output_transform,
    )


@DrawKernelFeaturePaths.register(OnlineGPModel)
def _prior_paths(model: OnlineGPModel, **kwargs) -> GeneralizedLinearPath:
    variables = _stored_variables(model)
    if isinstance(variables, InducingPoints):
        return generic_kernel_feature_paths(
            num_inputs=variables.points.shape[-1],
            mean_module=model.mean_module,
            covar_module=model.covar_module,
            input_transform=get_input_transform(model),
            output_transform=get_output_transform(model),
            **kwargs,
        )
    sample_shape = kwargs.get("sample_shape", Size())
    return _hippo_prior_paths(model, variables, sample_shape, get_input_transform(model), get_output_transform(model))


def _prior_values_of_u(model: OnlineGPModel, variables: InducingVariables, prior_paths: GeneralizedLinearPath) -> Tensor:
    """``g(f)`` of the prior paths at the stored ``variables``: ``f(Z)`` for inducing points, ``E[u] + Zᵀ w`` for HiPPO variables."""
    if isinstance(variables, InducingPoints):
        return prior_paths.forward(variables.points)
    projections = cast(_HiPPOFourierMap, prior_paths.feature_map).projections
    values = prior_paths.weight @ projections.to(prior_paths.weight.dtype)
    mean = variables.prior_mean(model.mean_module)
    return values if mean is None else values + mean.to(values.dtype)


@GaussianUpdate.register(OnlineGPModel, (Likelihood, type(None)))
def _update_paths(model: OnlineGPModel, likelihood, *, sample_values: Tensor, **ignore) -> GeneralizedLinearPath:
    """``K_{·u} K_uu^{-1} (u - g(f) - e)`` with ``u ~ q(u)``, ``e ~ N(0, jitter I)``, for prior values ``g(f)``."""
    variables = _stored_variables(model)
    feature_map = _CrossCovarianceMap(variables, model.covar_module, input_transform=get_input_transform(model))
    return GeneralizedLinearPath(feature_map=feature_map, weight=_update_weight(model, variables, sample_values))


def _update_weight(model: OnlineGPModel, variables: InducingVariables, sample_values: Tensor) -> Tensor:
    """``K_uu^{-1} (u - g(f) - e)`` (``sample_shape x M``) of the Matheron update at the stored ``variables``."""
    kernel = model.covar_module
    kuu = to_dense(variables.Kuu(kernel)).to(sample_values.dtype)
    chol = psd_safe_cholesky(kuu)
    jitter = variables.jitter_variance(kuu)
    targets = model.online.inducing_posterior().rsample(sample_values.shape[:-1]).to(sample_values.dtype)
    noise = jitter.sqrt() * torch.randn_like(sample_values)
    return torch.cholesky_solve((targets - sample_values - noise).unsqueeze(-1), chol).squeeze(-1)


@DrawMatheronPaths.register(OnlineGPModel)
def _matheron_paths(model: OnlineGPModel, *, sample_shape: Size, prior_sampler, update_strategy) -> MatheronPath | PathList:
    if model.num_outputs > 1:
        return _matheron_paths_multioutput(model, sample_shape=sample_shape, prior_sampler=prior_sampler, update_strategy=update_strategy)
    variables = _stored_variables(model)  # in the transformed input space, as BoTorch assumes for inducing variables
    output_transform = get_output_transform(model)
    if isinstance(variables, InducingPoints):
        with delattr_ctx(model, "outcome_transform"):
            prior_paths = prior_sampler(model=model, sample_shape=sample_shape)
            update_paths = update_strategy(model=model, sample_values=_prior_values_of_u(model, variables, prior_paths))
        return MatheronPath(prior_paths=prior_paths, update_paths=update_paths, output_transform=output_transform)
    # HiPPO variables: both paths see the same transformed inputs, so that on a path (several input
    # dimensions) the update K_xu = ψ(x) Z reuses the prior's ψ(x): one feature evaluation per call
    prior_paths = _hippo_prior_paths(model, variables, sample_shape)
    weight = _update_weight(model, variables, _prior_values_of_u(model, variables, prior_paths))
    if variables.input_dim > 1:
        cross_covariance: FeatureMap = _ProjectedFeatureMap(cast(_HiPPOFourierMap, prior_paths.feature_map))
    else:
        cross_covariance = _CrossCovarianceMap(variables, model.covar_module)
    update_paths = GeneralizedLinearPath(feature_map=cross_covariance, weight=weight)
    return MatheronPath(
        prior_paths=prior_paths, update_paths=update_paths, input_transform=get_input_transform(model), output_transform=output_transform
    )


def _stack_outputs(values: list[Tensor]) -> Tensor:
    return torch.stack(values, dim=-2)


class _OutputPaths(PathList):
    """The outputs' paths stacked at ``-2``; a singleton batch dimension at ``-3`` of the inputs broadcasts
    against the outputs, as for BoTorch's batched multi-output models (``MatheronPathModel`` adds one)."""

    def forward(self, x: Tensor, **kwargs) -> Tensor:
        if x.dim() >= 3 and x.shape[-3] == 1:
            x = x.squeeze(-3)
        return cast(Tensor, super().forward(x, **kwargs))  # one tensor: the paths' reducer stacks the outputs


def _matheron_paths_multioutput(model: OnlineGPModel, *, sample_shape: Size, prior_sampler, update_strategy) -> PathList:
    """One path per output (each output's own posterior), stacked as BoTorch's multi-output models return
    them: ``sample x batch x m x n``; the model's input and outcome transforms around them."""
    paths = [
        DrawMatheronPaths(output, sample_shape=sample_shape, prior_sampler=prior_sampler, update_strategy=update_strategy)
        for output in model.outputs
    ]
    return _OutputPaths(
        paths, join=_stack_outputs, input_transform=get_input_transform(model), output_transform=get_output_transform(model)
    )
