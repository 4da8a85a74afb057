"""Sphinx configuration of the probseq API reference and tutorials (``make docs``)."""
import importlib
import inspect
import os
import pathlib
import pkgutil

from sphinx.ext import autosummary

project = "probseq"
author = "probseq contributors"
extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
    "sphinx.ext.mathjax",
    "sphinx-mathjax-offline",
    "myst_nb",
]
# Math renders offline: sphinx-mathjax-offline ships MathJax 3 and copies it into _static/mathjax, so
# the pages need no CDN (imgmath would need LaTeX and KaTeX's server-side rendering node packages).

# Tutorials are jupytext percent scripts rendered as notebooks. `make docs` executes them (so the
# site shows their plots; PROBSEQ_TUTORIAL_SIZE=small for a quick build); the warnings-as-errors
# check in the test suite renders them without executing, since tests/docs/test_tutorials.py
# already runs every one.
nb_custom_formats = {".py": ["jupytext.reads", {"fmt": "py:percent"}]}
nb_execution_mode = os.environ.get("PROBSEQ_DOCS_EXECUTE", "off")
nb_execution_timeout = 3600
nb_execution_raise_on_error = True
exclude_patterns = ["_build", "conf.py", "_intersphinx"]
myst_heading_anchors = 3
html_theme = "alabaster"
html_title = "probseq"
templates_path = ["_templates"]

# API reference: docs/api.rst runs autosummary over the three packages, recursively; every public
# module gets one page (docs/_templates/autosummary/module.rst) documenting the classes, functions
# and constants it defines. A package page lists its exported names (``__all__``), each linked to
# the module that defines it.
PACKAGES = ("gpytorch_hippo", "gpytorch_sgpa", "pseudovideo")
autosummary_generate = True
autosummary_ignore_module_all = True  # a module page documents what the module defines, not what it imports
autosummary_imported_members = False
# The summary of a name in a table is its docstring's first sentence; "thesis eq. (4.6)" and
# "thesis ch. 4" end none.
autosummary.WELL_KNOWN_ABBREVIATIONS += ("eq.", "eqs.", "ch.", "App.", "Fig.", "Figs.", "cf.")
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_class_signature = "mixed"
napoleon_numpy_docstring = False

# Cross-references into the libraries probseq builds on. The inventories are bundled in
# docs/_intersphinx/ (see the README there), so the build needs no network.
_INV = pathlib.Path(__file__).resolve().parent / "_intersphinx"
intersphinx_mapping = {
    name: (url, (str(_INV / f"{name}.inv"),))
    for name, url in {
        "torch": "https://docs.pytorch.org/docs/stable/",
        "gpytorch": "https://docs.gpytorch.ai/en/stable/",
        "botorch": "https://botorch.readthedocs.io/en/latest/",
        "linear_operator": "https://linear-operator.readthedocs.io/en/stable/",
        "numpy": "https://numpy.org/doc/stable/",
        "scipy": "https://docs.scipy.org/doc/scipy/",
    }.items()
}


def _is_ours(obj) -> bool:
    return (getattr(obj, "__module__", None) or "").split(".")[0] in PACKAGES


def _is_private(obj) -> bool:
    parts = [*(getattr(obj, "__module__", None) or "").split("."), *obj.__qualname__.split(".")]
    return any(part.startswith("_") and not part.startswith("__") for part in parts[1:]) or obj.__name__.startswith("_")


def _public_modules():
    """Every public module of the three packages (the ones the API pages document)."""
    for package in PACKAGES:
        yield importlib.import_module(package)
        for info in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
            if not any(part.startswith("_") for part in info.name.split(".")):
                yield importlib.import_module(info.name)


def _canonical(module, name: str) -> str:
    """Where ``module.name`` is documented: the module that defines it."""
    obj = getattr(module, name)
    if inspect.isclass(obj) or inspect.isfunction(obj):
        return f"{obj.__module__}.{obj.__qualname__}"
    if name == "__version__":
        return f"{module.__name__}.__version__"
    for other in _public_modules():  # a constant: the module whose own source assigns it
        if other.__dict__.get(name) is obj and other.__name__ != module.__name__:
            source = inspect.getsource(other)
            if f"\n{name} = " in source or source.startswith(f"{name} = "):
                return f"{other.__name__}.{name}"
    return f"{module.__name__}.{name}"


def _main_api() -> dict:
    """For each package with ``__all__``: the canonical names of its exports, in ``__all__`` order."""
    return {
        module.__name__: [_canonical(module, name) for name in module.__all__]
        for module in _public_modules()
        if hasattr(module, "__path__") and hasattr(module, "__all__")
    }


def _inherited_members() -> dict:
    """For each public class with private base classes of its own package (``_SGPAModel``,
    ``_MultiHeadAttention``): the names of the other classes of its MRO, the value of autodoc's
    ``:inherited-members:`` option, so that the class page shows the methods it inherits from its
    private bases and not those of ``torch.nn.Module``."""
    stops = {}
    for module in _public_modules():
        for name, cls in vars(module).items():
            if not inspect.isclass(cls) or cls.__module__ != module.__name__ or name.startswith("_"):
                continue
            private = [base for base in cls.__mro__[1:] if _is_ours(base) and _is_private(base)]
            if private:
                others = [base.__name__ for base in cls.__mro__[1:] if base not in private and base is not object]
                stops[f"{module.__name__}.{name}"] = ", ".join(dict.fromkeys(others)) or "object"
    return stops


def _public_path(cls) -> str:
    """The shortest public import path of a class of another library (``torch.nn.Module`` for
    ``torch.nn.modules.module.Module``); the defining module for probseq's own classes."""
    path = f"{cls.__module__}.{cls.__qualname__}"
    if _is_ours(cls):
        return path
    parts = cls.__module__.split(".")
    for i in range(1, len(parts) + 1):
        prefix = ".".join(parts[:i])
        if any(part.startswith("_") for part in parts[:i]):
            break
        try:
            if getattr(importlib.import_module(prefix), cls.__name__, None) is cls:
                return f"{prefix}.{cls.__name__}"
        except ImportError:
            break
    return path


def _public_bases(app, name, obj, options, bases):
    """``:show-inheritance:`` without private base classes: each is replaced by its own bases."""
    public = []

    def add(base):
        if base is object:
            return
        if inspect.isclass(base) and _is_private(base):
            for grand in base.__bases__:
                add(grand)
        elif base not in public:
            public.append(base)

    for base in list(bases):
        add(base)
    bases[:] = [
        (f":py:class:`~{_public_path(base)}`" if _is_ours(base) else f":py:class:`{_public_path(base)}`")
        if inspect.isclass(base) else base
        for base in public
    ] or [object]


def _skip_module_state(app, what, name, obj, skip, options):
    """``training``, the flag that every ``torch.nn.Module`` declares, is no method of a model."""
    return True if what == "class" and name == "training" else None


MAIN_API = _main_api()
autosummary_context = {"main_api": MAIN_API, "inherited_members": _inherited_members()}
# ``gpytorch_hippo.HiPPO`` (what users import) -> ``gpytorch_hippo.hippo.HiPPO`` (where it is documented)
ALIASES = {
    f"{package}.{canonical.rsplit('.', 1)[1]}": canonical for package, names in MAIN_API.items() for canonical in names
}


def _alias(target: str) -> str | None:
    """The documented name of a cross-reference target that is an alias: an exported name of a
    probseq package, or another library's object by its defining module
    (``gpytorch.kernels.kernel.Kernel``, ``torch._C.Generator``) rather than its public path."""
    target = {"Tensor": "torch.Tensor", "nn.Module": "torch.nn.Module"}.get(target, target)
    parts = target.split(".")
    for i in range(len(parts), 1, -1):
        head = ".".join(parts[:i])
        if head in ALIASES:
            return ".".join([ALIASES[head], *parts[i:]])
    if parts[0] in PACKAGES:
        return None
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr, None)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            return _public_path(obj)
        return None
    return None


def _resolve_alias(app, env, node, contnode):
    """Runs after intersphinx: resolves the aliases of :func:`_alias`, in this site or another."""
    if node.get("refdomain") != "py" or (target := _alias(node["reftarget"])) in (None, node["reftarget"]):
        return None
    from sphinx.ext.intersphinx import missing_reference

    aliased = node.deepcopy()
    aliased["reftarget"] = target
    domain = env.get_domain("py")
    found = domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"], target, aliased, contnode)
    return found if found is not None else missing_reference(app, env, aliased, contnode)


def setup(app):
    app.connect("autodoc-process-bases", _public_bases)
    app.connect("autodoc-skip-member", _skip_module_state)
    app.connect("missing-reference", _resolve_alias, priority=900)
