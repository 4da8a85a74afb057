"""BoTorch models over the online sparse GPs of :mod:`gpytorch_hippo` (thesis ch. 4).

:class:`~gpytorch_hippo.botorch.models.OnlineGPModel` is a BoTorch ``Model`` whose posterior is the
collapsed online sparse GP of Bui et al. (2017) (OHSGPR with HiPPO inducing variables, OSGPR with
inducing points); new observations enter by one online update that touches only the new batch and
the stored summary ``q(u)``. The modules:

* :mod:`~gpytorch_hippo.botorch.models`: :class:`~gpytorch_hippo.botorch.models.OnlineGPModel`,
  :class:`~gpytorch_hippo.botorch.models.OnlineCollapsedMLL` (the collapsed online bound for
  ``botorch.fit.fit_gpytorch_mll``) and the default inducing points;
* :mod:`~gpytorch_hippo.botorch.multioutput`: ``m`` independent outputs, what
  ``OnlineGPModel(train_X, train_Y)`` builds for a target of shape ``(n, m)``, ``m > 1``;
* :mod:`~gpytorch_hippo.botorch.paths`: pathwise posterior samples (registered with BoTorch's
  dispatchers when this package is imported);
* :mod:`~gpytorch_hippo.botorch.variational`: OHSVGP / OSVGP for non-Gaussian observations.

Every name is importable from here: ``from gpytorch_hippo.botorch import OnlineGPModel``.
"""

from . import paths  # noqa: F401  (registers the models with BoTorch's pathwise sampling)
from .models import (
    DEFAULT_NUM_INDUCING,
    InducingApproximationWarning,
    OnlineCollapsedMLL,
    OnlineGPModel,
    OnlineGPModelWarning,
    default_inducing_points,
)
from .multioutput import IndependentOutputsLikelihood, MultiOutputOnlineGPModel
from .variational import OnlineVariationalGPModel

__all__ = [
    "OnlineGPModel",
    "OnlineGPModelWarning",
    "InducingApproximationWarning",
    "OnlineCollapsedMLL",
    "MultiOutputOnlineGPModel",
    "IndependentOutputsLikelihood",
    "OnlineVariationalGPModel",
    "default_inducing_points",
    "DEFAULT_NUM_INDUCING",
]
