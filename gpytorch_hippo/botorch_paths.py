"""Former module of the pathwise samples of :mod:`gpytorch_hippo.botorch`, now
:mod:`gpytorch_hippo.botorch.paths`; importing either registers them with BoTorch's dispatchers."""

from .botorch import paths  # noqa: F401
