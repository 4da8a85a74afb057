"""Sphinx configuration of the probseq API reference and tutorials (``make docs``)."""
import os

project = "probseq"
author = "probseq contributors"
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.mathjax", "myst_nb"]
# Tutorials are jupytext percent scripts rendered as notebooks. `make docs` executes them (so the
# site shows their plots; PROBSEQ_TUTORIAL_SIZE=small for a quick build); the warnings-as-errors
# check in the test suite renders them without executing, since tests/docs/test_tutorials.py
# already runs every one.
nb_custom_formats = {".py": ["jupytext.reads", {"fmt": "py:percent"}]}
nb_execution_mode = os.environ.get("PROBSEQ_DOCS_EXECUTE", "off")
nb_execution_timeout = 3600
nb_execution_raise_on_error = True
exclude_patterns = ["_build", "conf.py"]
myst_heading_anchors = 3
autodoc_member_order = "bysource"
autodoc_default_options = {"show-inheritance": True}
autodoc_typehints = "description"
napoleon_numpy_docstring = False
html_theme = "alabaster"
html_title = "probseq"
