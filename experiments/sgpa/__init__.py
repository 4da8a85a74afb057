"""Chapter 3 experiments: SGPA Transformers trained by an ELBO, calibration and distribution shift."""
