"""gpytorch_hippo: HiPPO recurrent memory and online sparse GPs with long-term memory (thesis ch. 4)."""
from .hippo import DISCRETIZATIONS, MEASURES, HiPPO, project, quadrature_rule, transition

__all__ = ["DISCRETIZATIONS", "MEASURES", "HiPPO", "project", "quadrature_rule", "transition"]
