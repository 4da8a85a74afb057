"""Inducing variables: objects that know their own covariances (``Kuu``, ``Kuf``; the interface is
:class:`~gpytorch_hippo.inducing.base.InducingVariables`), so that one variational strategy serves them all."""

from .base import CapturedVarianceWarning, InconsistentCovarianceWarning, InducingVariables, InputsOutsideSupportError
from .covariances import CovarianceBackend, StationaryKernelSpec, UnsupportedKernelError, register_stationary_kernel
from .fourier import FourierInducingVariables
from .hippo_variables import HiPPOInducingVariables
from .points import InducingPoints
from .selection import select_pivoted_cholesky

__all__ = [
    "InducingVariables",
    "InputsOutsideSupportError",
    "CapturedVarianceWarning",
    "InconsistentCovarianceWarning",
    "InducingPoints",
    "HiPPOInducingVariables",
    "select_pivoted_cholesky",
    "FourierInducingVariables",
    "register_stationary_kernel",
    "StationaryKernelSpec",
    "CovarianceBackend",
    "UnsupportedKernelError",
]
