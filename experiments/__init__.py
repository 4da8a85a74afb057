"""The thesis's experiments, demos and loaders of data outside the package dependencies.

Run from a checkout of the repository (``python -m experiments.hippo.online ...``); this tree is not part
of the installed distribution, and the three packages import nothing from it.
"""
