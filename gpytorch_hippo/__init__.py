"""gpytorch_hippo: HiPPO recurrent memory and online sparse GPs with long-term memory (thesis ch. 4)."""
