"""gpytorch_hippo: HiPPO recurrent memory and online sparse GPs with long-term memory (thesis ch. 4)."""
from .hippo import DISCRETIZATIONS, MEASURES, HiPPO, project, quadrature_rule, transition
from .inducing import HiPPOInducingVariables, InducingPoints, InducingVariables
from .likelihoods import NegativeBinomialLikelihood
from .online import OnlineELBO, OnlineSGPR
from .variational import InterdomainVariationalStrategy

__all__ = [
    "DISCRETIZATIONS",
    "MEASURES",
    "HiPPO",
    "project",
    "quadrature_rule",
    "transition",
    "InducingVariables",
    "InducingPoints",
    "HiPPOInducingVariables",
    "InterdomainVariationalStrategy",
    "OnlineSGPR",
    "OnlineELBO",
    "NegativeBinomialLikelihood",
]
