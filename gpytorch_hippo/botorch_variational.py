"""Former module of :class:`~gpytorch_hippo.botorch.variational.OnlineVariationalGPModel`, now in
:mod:`gpytorch_hippo.botorch.variational`; kept so that imports from here keep working."""

from .botorch.variational import OnlineVariationalGPModel

__all__ = ["OnlineVariationalGPModel"]
