"""BoTorch models over the online sparse GPs of :mod:`gpytorch_hippo` (thesis ch. 4).

:class:`~gpytorch_hippo.botorch.models.OnlineGPModel` is a BoTorch ``Model`` whose posterior is the
collapsed online sparse GP of Bui et al. (2017) (OHSGPR with HiPPO inducing variables, OSGPR with
inducing points); new observations enter by one online update that touches only the new batch and
the stored summary ``q(u)``; a target of shape ``(n, m)`` gives ``m`` independent outputs. The modules:

* :mod:`~gpytorch_hippo.botorch.models`: :class:`~gpytorch_hippo.botorch.models.OnlineGPModel`, BoTorch's hooks;
* :mod:`~gpytorch_hippo.botorch.fit`: :class:`~gpytorch_hippo.botorch.fit.OnlineCollapsedMLL` (the collapsed online
  bound for ``botorch.fit.fit_gpytorch_mll``) and the online refit;
* :mod:`~gpytorch_hippo.botorch.inducing`: the default inducing points and how inducing variables follow the stream;
* :mod:`~gpytorch_hippo.botorch.exceptions`: the models' warnings;
* :mod:`~gpytorch_hippo.botorch.multioutput`: the likelihood of ``m`` independent outputs;
* :mod:`~gpytorch_hippo.botorch.paths`: pathwise posterior samples (registered with BoTorch's
  dispatchers when this package is imported);
* :mod:`~gpytorch_hippo.botorch.variational`: OHSVGP / OSVGP for non-Gaussian observations;
* :mod:`~gpytorch_hippo.botorch.streaming`: :class:`~gpytorch_hippo.botorch.streaming.OnlineGPStream`, the class swap
  that streams inside loops that rebuild their model every iteration.

Every name is importable from here: ``from gpytorch_hippo.botorch import OnlineGPModel``.
"""

import warnings

from . import paths  # noqa: F401  (registers the models with BoTorch's pathwise sampling)
from .exceptions import InducingApproximationWarning, OnlineGPModelWarning
from .fit import OnlineCollapsedMLL
from .inducing import DEFAULT_NUM_INDUCING, default_inducing_points
from .models import OnlineGPModel
from .multioutput import IndependentOutputsLikelihood
from .streaming import OnlineGPStream
from .variational import OnlineVariationalGPModel

__all__ = [
    "OnlineGPModel",
    "OnlineGPStream",
    "OnlineGPModelWarning",
    "InducingApproximationWarning",
    "OnlineCollapsedMLL",
    "IndependentOutputsLikelihood",
    "OnlineVariationalGPModel",
    "default_inducing_points",
    "DEFAULT_NUM_INDUCING",
]


def __getattr__(name: str):
    if name == "MultiOutputOnlineGPModel":  # the class of several outputs is OnlineGPModel itself
        warnings.warn(
            "MultiOutputOnlineGPModel is OnlineGPModel: OnlineGPModel(train_X, train_Y) with train_Y of shape (n, m) has "
            "m independent outputs; import OnlineGPModel instead",
            DeprecationWarning,
            stacklevel=2,
        )
        return OnlineGPModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
