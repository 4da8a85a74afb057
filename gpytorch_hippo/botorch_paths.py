"""Pathwise posterior samples of :class:`~gpytorch_hippo.botorch.OnlineGPModel` for BoTorch.

Registered with BoTorch's pathwise dispatchers, so that ``draw_matheron_paths``,
``get_matheron_path_model``, ``get_optimal_samples`` and the acquisitions built on them
(Thompson sampling through paths, ``qJointEntropySearch``, ``qPredictiveEntropySearch``,
``qLowerBoundMaxValueEntropy`` with optimal samples) run on the online surrogate. Matheron's rule
(Wilson et al. 2020) with the stored ``q(u)`` in place of data, for point inducing variables
``u = f(Z) + e`` (``e`` the ``K_uu`` jitter):

.. math::
    (f \\mid u)(\\cdot) = f(\\cdot) + k(\\cdot, Z)\\,K_{uu}^{-1}\\,(u - f(Z) - e),
    \\qquad u \\sim q(u),\\quad f \\sim GP(m, k)\\ \\text{by random Fourier features},

whose mean and covariance are those of the online posterior ``q(f)`` (up to the features' error).
"""

from __future__ import annotations

import torch
from botorch.sampling.pathwise.features import KernelEvaluationMap
from botorch.sampling.pathwise.paths import GeneralizedLinearPath
from botorch.sampling.pathwise.posterior_samplers import DrawMatheronPaths, MatheronPath
from botorch.sampling.pathwise.prior_samplers import DrawKernelFeaturePaths, _draw_kernel_feature_paths_fallback
from botorch.sampling.pathwise.update_strategies import GaussianUpdate
from botorch.sampling.pathwise.utils import get_input_transform, get_output_transform
from botorch.utils.context_managers import delattr_ctx
from gpytorch.likelihoods import Likelihood
from linear_operator import to_dense
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Size, Tensor

from .botorch import OnlineGPModel
from .inducing.points import InducingPoints


def _stored_points(model: OnlineGPModel) -> Tensor:
    """The inputs ``Z`` of the stored task's point inducing variables (model space), or a named error."""
    variables = model.online.posterior_inducing_variables
    if not isinstance(variables, InducingPoints):
        raise NotImplementedError(
            f"pathwise samples of OnlineGPModel need point inducing variables; {type(variables).__name__} are "
            "projections of f whose prior paths the random features do not give: use InducingPoints, or "
            "posterior-based acquisitions"
        )
    if len(model.batch_shape) > 0:
        raise NotImplementedError(f"pathwise samples of a batched (fantasy) OnlineGPModel, batch_shape {tuple(model.batch_shape)}")
    return variables.points


@DrawKernelFeaturePaths.register(OnlineGPModel)
def _prior_paths(model: OnlineGPModel, **kwargs) -> GeneralizedLinearPath:
    return _draw_kernel_feature_paths_fallback(
        num_inputs=_stored_points(model).shape[-1],
        mean_module=model.mean_module,
        covar_module=model.covar_module,
        input_transform=get_input_transform(model),
        output_transform=get_output_transform(model),
        **kwargs,
    )


@GaussianUpdate.register(OnlineGPModel, (Likelihood, type(None)))
def _update_paths(model: OnlineGPModel, likelihood, *, sample_values: Tensor, **ignore) -> GeneralizedLinearPath:
    """``k(·, Z) K_uu^{-1} (u - f(Z) - e)`` with ``u ~ q(u)``, ``e ~ N(0, jitter I)``, for prior values ``f(Z)``."""
    points = _stored_points(model)
    variables, kernel = model.online.posterior_inducing_variables, model.covar_module
    kuu = to_dense(variables.Kuu(kernel)).to(sample_values.dtype)
    chol = psd_safe_cholesky(kuu)
    jitter = variables.jitter_variance(kuu)
    sample_shape = sample_values.shape[:-1]
    targets = model.online.inducing_posterior().rsample(sample_shape).to(sample_values.dtype)
    noise = jitter.sqrt() * torch.randn_like(sample_values)
    weight = torch.cholesky_solve((targets - sample_values - noise).unsqueeze(-1), chol).squeeze(-1)
    feature_map = KernelEvaluationMap(kernel=kernel, points=points, input_transform=get_input_transform(model))
    return GeneralizedLinearPath(feature_map=feature_map, weight=weight)


@DrawMatheronPaths.register(OnlineGPModel)
def _matheron_paths(model: OnlineGPModel, *, sample_shape: Size, prior_sampler, update_strategy) -> MatheronPath:
    points = _stored_points(model)  # in the transformed input space, as BoTorch assumes for inducing points
    with delattr_ctx(model, "outcome_transform"):
        prior_paths = prior_sampler(model=model, sample_shape=sample_shape)
        update_paths = update_strategy(model=model, sample_values=prior_paths.forward(points))
    return MatheronPath(prior_paths=prior_paths, update_paths=update_paths, output_transform=get_output_transform(model))
