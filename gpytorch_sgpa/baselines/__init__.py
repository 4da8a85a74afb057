"""Calibration baselines of thesis ch. 3: MC dropout, temperature scaling, deep / SGPA ensembles, last-layer Laplace."""

from .ensemble import EnsembleClassifier
from .laplace import LastLayerLaplace
from .mc_dropout import dropout_enabled, mc_dropout_predict_proba
from .prediction import predict_proba
from .temperature import TemperatureScaling

__all__ = [
    "predict_proba",
    "mc_dropout_predict_proba",
    "dropout_enabled",
    "TemperatureScaling",
    "EnsembleClassifier",
    "LastLayerLaplace",
]
