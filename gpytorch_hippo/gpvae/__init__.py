"""Continual SVGPVAE (thesis §4.6.3, App. C.3; the SVGPVAE of Jazbec et al. (2021) learnt online as in Chen et al. (2025)):
GP-VAE with HiPPO or point inducing variables and EWC."""

from .continual import METHODS, ContinualSVGPVAE
from .ewc import ElasticWeightConsolidation, fisher_diagonal
from .model import SVGPVAE, EncodedVariationalDistribution, LatentGP, SVGPVAETerms

__all__ = [
    "METHODS",
    "ContinualSVGPVAE",
    "ElasticWeightConsolidation",
    "fisher_diagonal",
    "SVGPVAE",
    "SVGPVAETerms",
    "EncodedVariationalDistribution",
    "LatentGP",
]
