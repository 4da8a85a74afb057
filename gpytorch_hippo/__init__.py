"""gpytorch_hippo: HiPPO recurrent memory and online sparse GPs with long-term memory (thesis ch. 4)."""

from importlib.metadata import PackageNotFoundError as _PackageNotFoundError
from importlib.metadata import version as _version

try:
    __version__ = _version("probseq")  # one source: the version in setup.cfg, read from the installed metadata
except _PackageNotFoundError:  # pragma: no cover - the source tree on sys.path without an install
    __version__ = "0+unknown"

from .fitting import FitReport, RefitPolicy, RefitWarning, fit_online_bound
from .gpvae import SVGPVAE, ContinualSVGPVAE, ElasticWeightConsolidation
from .hippo import DISCRETIZATIONS, MEASURES, HiPPO, project, quadrature_rule, transition
from .inducing import (
    CapturedVarianceWarning,
    FourierInducingVariables,
    HiPPOInducingVariables,
    InconsistentCovarianceWarning,
    InducingPoints,
    InducingVariables,
    InputsOutsideSupportError,
)
from .likelihoods import NegativeBinomialLikelihood
from .monitor import CapturedVarianceMonitor
from .online import OnlineELBO, OnlineSGPR
from .ordering import ORDERING_CRITERIA, order_inputs
from .reconstruction import reconstruction_moments, sample_coefficients, sample_reconstruction
from .timeaxis import TimeAxis
from .variational import InterdomainVariationalStrategy

__all__ = [
    "__version__",
    "DISCRETIZATIONS",
    "MEASURES",
    "HiPPO",
    "project",
    "quadrature_rule",
    "transition",
    "InducingVariables",
    "InputsOutsideSupportError",
    "CapturedVarianceWarning",
    "InconsistentCovarianceWarning",
    "InducingPoints",
    "HiPPOInducingVariables",
    "FourierInducingVariables",
    "InterdomainVariationalStrategy",
    "OnlineSGPR",
    "OnlineELBO",
    "fit_online_bound",
    "FitReport",
    "RefitPolicy",
    "RefitWarning",
    "CapturedVarianceMonitor",
    "NegativeBinomialLikelihood",
    "ORDERING_CRITERIA",
    "order_inputs",
    "sample_coefficients",
    "sample_reconstruction",
    "reconstruction_moments",
    "TimeAxis",
    "SVGPVAE",
    "ContinualSVGPVAE",
    "ElasticWeightConsolidation",
]
