"""Chapter 4 experiments: online sparse GPs with HiPPO memory, streaming BO, the continual SVGPVAE."""
