"""Former module of :class:`~gpytorch_hippo.botorch.multioutput.MultiOutputOnlineGPModel`, now in
:mod:`gpytorch_hippo.botorch.multioutput`; kept so that imports from here keep working."""

from .botorch.multioutput import MultiOutputOnlineGPModel

__all__ = ["MultiOutputOnlineGPModel"]
