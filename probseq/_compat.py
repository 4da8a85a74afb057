"""Every access of probseq's packages to another library's private internals, each a named function or name with
the reason no public way exists; ``tests/test_compat.py`` checks each against the tested versions
(:data:`TESTED_VERSIONS`, pinned in ``constraints.txt``).

Nothing heavy is imported here: a function imports its library when called, and a private class used as a base
or an annotation is looked up at the first import of its name (:data:`PRIVATE_NAMES`, PEP 562), so ``pseudovideo``
may import this module without importing the GP libraries. An internal missing from the installed version raises
:class:`UpstreamInternalsError`, which names the version to install; it is never skipped silently.

Overrides of a base class's protected hooks (torch's ``_load_from_state_dict`` and ``_apply``, GPyTorch's
``_cholesky_factor`` and ``_clear_cache``, BoTorch's ``_set_transformed_inputs``, ``Trainer._prepare_inputs`` called
by a ``Trainer`` subclass) are those libraries' extension points for subclasses and stay in the subclasses.
"""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from botorch.utils.types import _DefaultType as DefaultType
    from gpytorch.likelihoods.gaussian_likelihood import _GaussianLikelihoodBase as GaussianLikelihoodBase
    from gpytorch.likelihoods.likelihood import _OneDimensionalLikelihood as OneDimensionalLikelihood
    from gpytorch.mlls._approximate_mll import _ApproximateMarginalLogLikelihood as ApproximateMarginalLogLikelihood
    from gpytorch.variational import _VariationalDistribution as VariationalDistributionBase
    from gpytorch.variational._variational_strategy import _VariationalStrategy as VariationalStrategyBase
    from torch.nn.modules.module import _IncompatibleKeys as IncompatibleKeys

__all__ = [
    "PRIVATE_NAMES",
    "TESTED_VERSIONS",
    "ApproximateMarginalLogLikelihood",
    "DefaultType",
    "GaussianLikelihoodBase",
    "IncompatibleKeys",
    "OneDimensionalLikelihood",
    "UpstreamInternalsError",
    "VariationalDistributionBase",
    "VariationalStrategyBase",
    "attn_implementation",
    "can_record_registry",
    "child_modules",
    "cholesky_dtype",
    "experts_implementation",
    "fit_mll_generic",
    "forward_hooks",
    "generic_kernel_feature_paths",
    "move_forward_hooks",
    "output_capturing_installed",
    "set_implementations",
    "tensor_version",
    "validate_tensor_args",
    "without_memoized_values",
]

#: The versions every access below is tested with (``constraints.txt`` pins the same).
TESTED_VERSIONS = {"torch": "2.13.0", "gpytorch": "1.15.2", "botorch": "0.18.1", "transformers": "5.24.0"}

#: ``name: (module, private name, reason)`` of the private classes and types used as bases or in annotations.
PRIVATE_NAMES = {
    "VariationalStrategyBase": (
        "gpytorch.variational._variational_strategy",
        "_VariationalStrategy",
        "the base GPyTorch's ApproximateGP expects of a strategy; its public subclasses fix the inducing points' algebra",
    ),
    "VariationalDistributionBase": (
        "gpytorch.variational",
        "_VariationalDistribution",
        "the base of GPyTorch's variational distributions; no public class is its abstract interface",
    ),
    "OneDimensionalLikelihood": (
        "gpytorch.likelihoods.likelihood",
        "_OneDimensionalLikelihood",
        "GPyTorch's base of scalar likelihoods with Gauss-Hermite expected log-probabilities",
    ),
    "GaussianLikelihoodBase": (
        "gpytorch.likelihoods.gaussian_likelihood",
        "_GaussianLikelihoodBase",
        "GPyTorch's base of Gaussian likelihoods with a custom noise model, which BoTorch's posteriors recognise",
    ),
    "ApproximateMarginalLogLikelihood": (
        "gpytorch.mlls._approximate_mll",
        "_ApproximateMarginalLogLikelihood",
        "the base of GPyTorch's variational objectives, which BoTorch's fit dispatches on",
    ),
    "DefaultType": ("botorch.utils.types", "_DefaultType", "the type of BoTorch's DEFAULT, in its models' public signatures"),
    "IncompatibleKeys": (
        "torch.nn.modules.module",
        "_IncompatibleKeys",
        "the result type of torch's Module.load_state_dict, which an override returns",
    ),
}


class UpstreamInternalsError(ImportError):
    """An internal of another library that probseq uses is missing from the installed version."""


def _missing(library: str, what: str, reason: str) -> UpstreamInternalsError:
    try:
        installed = importlib.import_module(library).__version__
    except (ImportError, AttributeError):
        installed = "(not installed)"
    return UpstreamInternalsError(
        f"{library} {installed} has no {what}, which probseq uses ({reason}): install the tested version, "
        f"pip install {library}=={TESTED_VERSIONS[library]}"
    )


def _private(module: str, name: str, reason: str) -> Any:
    """``module.name`` (``name`` may be dotted), or an :class:`UpstreamInternalsError` naming the tested version."""
    try:
        return functools.reduce(getattr, name.split("."), importlib.import_module(module))
    except (ImportError, AttributeError) as error:
        raise _missing(module.partition(".")[0], f"{module}.{name}", reason) from error


def _attribute(obj: Any, name: str, library: str, reason: str) -> Any:
    """``obj.name``, a private attribute of an object of ``library``, or an :class:`UpstreamInternalsError`."""
    try:
        return getattr(obj, name)
    except AttributeError as error:
        raise _missing(library, f"{type(obj).__name__}.{name}", reason) from error


def __getattr__(name: str) -> Any:
    """The private classes of :data:`PRIVATE_NAMES`, looked up at their first import."""
    if name not in PRIVATE_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return _private(*PRIVATE_NAMES[name])


# --------------------------------------------------------------------------- GPyTorch
def cholesky_dtype() -> torch.dtype:
    """GPyTorch's dtype of Cholesky factors (float64 by default): set through the public ``settings.linalg_dtypes``,
    read only through its private setting."""
    return _private("gpytorch.settings", "_linalg_dtype_cholesky", "the dtype of Cholesky factors").value()


def without_memoized_values(state: dict) -> dict:
    """A module's pickled state (its ``__getstate__``) without the values GPyTorch's ``@cached`` memoised on it: they
    live in the private ``_memoize_cache``, which the public ``gpytorch.utils.memoize.clear_cache_hook`` empties only
    on the live module (a copy or a pickle of it must not carry them: train-mode ones hold autograd graphs).

    :param state: the module's ``__dict__`` copy, as ``torch.nn.Module.__getstate__`` returns it.
    """
    return {**state, "_memoize_cache": {}}


# --------------------------------------------------------------------------- BoTorch
def fit_mll_generic(mll, **kwargs: Any):
    """BoTorch's generic fit (``botorch.fit._fit_fallback``), which ``fit_gpytorch_mll`` runs for a model without a
    ``custom_fit``: a model's ``custom_fit`` (which ``fit_gpytorch_mll`` calls instead) has no public way to it.

    :param mll: the marginal likelihood to maximise.
    :param kwargs: ``fit_gpytorch_mll``'s keyword arguments (``closure``, ``optimizer_kwargs``, ``max_attempts``, ...).
    """
    return _private("botorch.fit", "_fit_fallback", "the generic fit of fit_gpytorch_mll")(mll, **kwargs)


def validate_tensor_args(X, Y, Yvar=None) -> None:
    """BoTorch's shape checks of a model's training data (``GPyTorchModel._validate_tensor_args``, protected).

    :param X: inputs ``(*batch, n, d)``; :param Y: targets ``(*batch, n, m)``; :param Yvar: their noise or ``None``.
    """
    _private("botorch.models.gpytorch", "GPyTorchModel._validate_tensor_args", "the shape checks of training data")(X=X, Y=Y, Yvar=Yvar)


def generic_kernel_feature_paths(**kwargs: Any):
    """BoTorch's generic prior paths from a kernel's features (``_draw_kernel_feature_paths_fallback``), which its
    public dispatcher ``draw_kernel_feature_paths`` reaches only for BoTorch's own model types.

    :param kwargs: the fallback's keywords (``num_inputs``, ``mean_module``, ``covar_module``, ``sample_shape``, ...).
    """
    return _private("botorch.sampling.pathwise.prior_samplers", "_draw_kernel_feature_paths_fallback", "the generic prior paths")(**kwargs)


# --------------------------------------------------------------------------- transformers
def can_record_registry():
    """transformers' table of the outputs (``output_attentions``, ...) each model records with forward hooks
    (``_CAN_RECORD_REGISTRY``): a converted model installs the same hooks on its replaced modules."""
    return _private("transformers.utils.output_capturing", "_CAN_RECORD_REGISTRY", "the outputs a model records")


def output_capturing_installed(model) -> bool:
    """Whether transformers installed a model's output-recording hooks already (it does so at the first request)."""
    return bool(getattr(model, "_output_capturing_hooks_installed", False))


def attn_implementation(config) -> str | None:
    """A config's attention implementation: transformers reads it only through the private ``_attn_implementation``."""
    return _attribute(config, "_attn_implementation", "transformers", "a config's attention implementation")


def experts_implementation(config) -> str | None:
    """A config's mixture-of-experts implementation (private ``_experts_implementation``, as the attention's)."""
    return _attribute(config, "_experts_implementation", "transformers", "a config's experts implementation")


def set_implementations(config, attention: str | None, experts: str | None) -> None:
    """Set a config's attention and experts implementations before a model is built from it, as
    ``from_pretrained(attn_implementation=...)`` does through the private setters (sub-configs included).

    :param config: a ``PretrainedConfig``; :param attention: its attention implementation; :param experts: its experts'.
    """
    for name in ("_attn_implementation", "_experts_implementation"):
        _attribute(type(config), name, "transformers", "the setters of a config's implementations")
    config._attn_implementation = attention
    config._experts_implementation = experts


# --------------------------------------------------------------------------- torch
def forward_hooks(module) -> list:
    """The forward hooks registered on ``module``: torch registers them publicly but lists them only in the private
    ``Module._forward_hooks``."""
    return list(_attribute(module, "_forward_hooks", "torch", "a module's forward hooks").values())


def move_forward_hooks(old, new) -> None:
    """Give ``new`` the forward hooks and pre-hooks registered on ``old``, which it replaces: the same tables (torch's
    private ``Module._forward_hooks``, ``_forward_pre_hooks`` and their keyword and always-called tables), so that the
    hooks' handles still remove them. torch registers hooks publicly but offers no way to move them.

    :param old: the module whose hooks move; :param new: the module that receives them.
    """
    for name in (
        "_forward_hooks",
        "_forward_hooks_with_kwargs",
        "_forward_hooks_always_called",
        "_forward_pre_hooks",
        "_forward_pre_hooks_with_kwargs",
    ):
        hooks = _attribute(old, name, "torch", "a module's hooks")
        if hooks:
            setattr(new, name, hooks)


def child_modules(module) -> dict:
    """A module's children by name, each name even where one module fills several (``named_children`` yields a
    shared child once) and unset ones (``None``) included: torch's private ``Module._modules``."""
    return _attribute(module, "_modules", "torch", "a module's children by name")


def tensor_version(tensor) -> int:
    """A tensor's in-place version counter (it grows with every in-place change): torch's private ``Tensor._version``."""
    return _attribute(tensor, "_version", "torch", "a tensor's version counter")
