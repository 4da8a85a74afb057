"""Sparse Gaussian process attention (thesis ch. 3 and App. B; Chen & Li (2023), SGPA).

Layers (:mod:`gpytorch_sgpa.attention`), attention kernels (:mod:`gpytorch_sgpa.kernels`),
Transformers (:mod:`gpytorch_sgpa.transformer`) and the training objective
(:mod:`gpytorch_sgpa.elbo`).
"""

from importlib.metadata import PackageNotFoundError as _PackageNotFoundError
from importlib.metadata import version as _version

try:
    __version__ = _version("probseq")  # one source: the version in setup.cfg, read from the installed metadata
except _PackageNotFoundError:  # pragma: no cover - the source tree on sys.path without an install
    __version__ = "0+unknown"

from .adapters import register_adapter
from .attention import (
    KernelAttention,
    ScaledDotProductAttention,
    SGPANoise,
    SGPAPosterior,
    SGPAStepState,
    SGPAttention,
    per_example_noise,
    posterior_mean,
)
from .dropin import MultiheadSGPAttention, convert, global_kl_divergence, kl_divergence, predict_proba
from .elbo import SGPAELBO
from .kernels import ExponentialKernel, evaluate_kernel, kernel_blocks, make_attention_kernel
from .lora import lora_target_modules
from .pretrained import from_pretrained
from .transformer import ATTENTION_TYPES, SGPABlock, SGPADecoder, SGPATransformer, SGPAViT, build_attention

__all__ = [
    "__version__",
    "ATTENTION_TYPES",
    "ExponentialKernel",
    "KernelAttention",
    "MultiheadSGPAttention",
    "SGPABlock",
    "SGPADecoder",
    "SGPAELBO",
    "SGPANoise",
    "SGPAPosterior",
    "SGPAStepState",
    "SGPATransformer",
    "SGPAViT",
    "SGPAttention",
    "ScaledDotProductAttention",
    "build_attention",
    "convert",
    "evaluate_kernel",
    "from_pretrained",
    "global_kl_divergence",
    "kernel_blocks",
    "kl_divergence",
    "lora_target_modules",
    "make_attention_kernel",
    "per_example_noise",
    "posterior_mean",
    "predict_proba",
    "register_adapter",
]
