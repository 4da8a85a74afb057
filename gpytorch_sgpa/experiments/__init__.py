"""Experiment runners for chapter 3 (``python -m gpytorch_sgpa.experiments.calibration``)."""
