"""Infrastructure that probseq's three packages (``gpytorch_hippo``, ``gpytorch_sgpa``, ``pseudovideo``) share,
in private modules: nothing here is for users' code."""
