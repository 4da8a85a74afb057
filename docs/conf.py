"""Sphinx configuration of the probseq API reference and tutorials (``make docs``)."""

import importlib
import importlib.metadata
import inspect
import os
import pathlib
import pkgutil
import sys

from sphinx.ext import autosummary

project = "probseq"
author = "the probseq authors"
copyright = f"2026, {author}"
# The version shown on the site is the installed package's (setup.cfg's ``version``).
try:
    release = importlib.metadata.version("probseq")
except importlib.metadata.PackageNotFoundError:  # a checkout that is not installed
    release = "unknown"
version = ".".join(release.split(".")[:2])
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
# The kernels that execute the tutorials inherit this environment: no progress bars, and no
# "IProgress not found" warning from tqdm.auto (which Hugging Face libraries import) in the pages.
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"), "ignore:IProgress not found"]))
exclude_patterns = ["_build", "conf.py", "_intersphinx"]
myst_heading_anchors = 3
# Furo: a maintained theme with a collapsible sidebar of the toctrees in docs/index.md (guides,
# tutorials, API reference, results) and a light/dark switch.
html_theme = "furo"
html_title = f"probseq {release}"
templates_path = ["_templates"]

# API reference: docs/api.rst runs autosummary over the three packages, recursively; every public
# module gets one page (docs/_templates/autosummary/module.rst) documenting the classes, functions
# and constants it defines. A package page lists its exported names (``__all__``), each linked to
# the module that defines it.
PACKAGES = ("gpytorch_hippo", "gpytorch_sgpa", "pseudovideo")
autosummary_generate = True
# Every cross-reference must resolve (-W turns a broken one into an error), except those to private
# names (``_smooth_ratio``), which docstrings may mention without the site documenting them.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(.*\.)?_[A-Za-z]\w*(\..*)?"),
    # diffusers' site (Hugging Face doc-builder) publishes no Sphinx inventory: its
    # classes (pseudovideo's bases ModelMixin, DiffusionPipeline, ...) stay unlinked
    (r"py:class", r"diffusers(\..*)?\.[A-Z]\w*"),
    # the same for transformers (gpytorch_sgpa.trainer.SGPATrainer's base Trainer)
    (r"py:class", r"transformers(\..*)?\.[A-Z]\w*"),
    # NumPy's inventory has no entries for its scalar types (one page documents them all)
    (r"py:class", r"numpy\.datetime64"),
]
autosummary_ignore_module_all = True  # a module page documents what the module defines, not what it imports
autosummary_imported_members = False
# The summary of a name in a table is its docstring's first sentence; "thesis eq. (4.6)" and
# "thesis ch. 4" end none.
autosummary.WELL_KNOWN_ABBREVIATIONS += ("eq.", "eqs.", "ch.", "App.", "Fig.", "Figs.", "cf.")
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_class_signature = "mixed"

# Cross-references into Python and the libraries probseq builds on. The inventories are bundled in
# docs/_intersphinx/ (docs/_intersphinx/build_inventories.py says where each comes from), so the
# build needs no network.
_INV = pathlib.Path(__file__).resolve().parent / "_intersphinx"
intersphinx_mapping = {
    name: (url, (str(_INV / f"{name}.inv"),))
    for name, url in {
        "python": "https://docs.python.org/3/",
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
    ``_attention_base.MultiHeadAttentionBase``): the names of the other classes of its MRO, the value of autodoc's
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
        (f":py:class:`~{_public_path(base)}`" if _is_ours(base) else f":py:class:`{_public_path(base)}`") if inspect.isclass(base) else base
        for base in public
    ] or [object]


def _skip_module_state(app, what, name, obj, skip, options):
    """``training``, the flag that every ``torch.nn.Module`` declares, is no method of a model."""
    return True if what == "class" and name == "training" else None


def _prune_stale_pages() -> None:
    """Remove the generated page of a module that no longer exists (docs/api/ is git-ignored)."""
    modules = {module.__name__ for module in _public_modules()}
    for page in (pathlib.Path(__file__).resolve().parent / "api").glob("*.rst"):
        if page.stem not in modules:
            page.unlink(missing_ok=True)


_prune_stale_pages()
MAIN_API = _main_api()
autosummary_context = {"main_api": MAIN_API, "inherited_members": _inherited_members()}
# ``gpytorch_hippo.HiPPO`` (what users import) -> ``gpytorch_hippo.hippo.HiPPO`` (where it is documented)
ALIASES = {f"{package}.{canonical.rsplit('.', 1)[1]}": canonical for package, names in MAIN_API.items() for canonical in names}


# Names in the signatures of other libraries' methods (``Kernel.__init__``) that autodoc leaves bare
BARE_NAMES = {
    "Tensor": "torch.Tensor",
    "nn.Module": "torch.nn.Module",
    "Prior": "gpytorch.priors.Prior",
    "Interval": "gpytorch.constraints.Interval",
}


# Public paths of other libraries' classes that their inventories list under the defining module only
INVENTORY_PATHS = {"botorch.exceptions.BotorchWarning": "botorch.exceptions.warnings.BotorchWarning"}


def _documented_path(obj) -> str:
    return f"{obj.__module__}.{obj.__qualname__}" if _is_ours(obj) else _public_path(obj)


def _alias(target: str, module: str | None = None) -> str | None:
    """The documented name of a cross-reference target that is an alias: an exported name of a
    probseq package (``gpytorch_hippo.HiPPO``), another library's object by its defining module
    (``gpytorch.kernels.kernel.Kernel``, ``torch._C.Generator``) rather than its public path, or a
    name imported into ``module``, the module of the docstring (``SGPAttention``, ``Prior``)."""
    if target.startswith("builtins."):
        return target.removeprefix("builtins.")
    target = BARE_NAMES.get(target, target)
    parts = target.split(".")
    for i in range(len(parts), 0, -1):
        prefixes = ("", f"{module}.", f"{module.split('.')[0]}.") if module else ("",)
        for head in (prefix + ".".join(parts[:i]) for prefix in prefixes):
            if head in ALIASES:
                return ".".join([ALIASES[head], *parts[i:]])
    starts = []  # (object, index of the next part): the longest importable module, or ``module``
    for i in range(len(parts) - 1, 0, -1):
        try:
            starts.append((importlib.import_module(".".join(parts[:i])), i))
            break
        except ImportError:
            continue
    if module:
        starts.append((importlib.import_module(module), 0))
    for obj, i in starts:
        named, rest = None, parts[i:]
        for j, attr in enumerate(parts[i:]):
            obj = getattr(obj, attr, None)
            if obj is None:
                break
            if inspect.isclass(obj) or inspect.isfunction(obj):
                named, rest = obj, parts[i + j + 1 :]
        else:
            if named is not None:
                return ".".join([_documented_path(named), *rest])
    return None


def _own_docstring_only(app, what, name, obj, options, lines):
    """A method that overrides another library's without a docstring of its own (``forward``,
    ``train``) shows no text rather than the overridden method's (PyTorch's ``Module.forward``);
    a named tuple's field, none rather than "Alias for field number 0"."""
    if lines and " ".join(lines).strip().startswith("Alias for field number"):
        lines.clear()
    if what not in ("method", "property") or getattr(obj, "__doc__", None) or not lines:
        return
    module_name, _, qualname = name.rpartition(".")
    while module_name and module_name not in sys.modules:
        module_name, _, head = module_name.rpartition(".")
        qualname = f"{head}.{qualname}"
    owner = sys.modules.get(module_name)
    for part in qualname.split(".")[:-1]:
        owner = getattr(owner, part, None)
    attr = qualname.rsplit(".", 1)[-1]
    for cls in getattr(owner, "__mro__", ())[1:]:
        if attr in vars(cls) and getattr(vars(cls)[attr], "__doc__", None):
            if not _is_ours(cls):
                lines.clear()
            return


def _resolve_alias(app, env, node, contnode):
    """Runs after intersphinx: resolves the aliases of :func:`_alias`, in this site or another."""
    if node.get("refdomain") != "py":
        return None
    target = INVENTORY_PATHS.get(node["reftarget"]) or _alias(node["reftarget"], node.get("py:module"))
    if target in (None, node["reftarget"]):
        return None
    from sphinx.ext.intersphinx import missing_reference

    aliased = node.deepcopy()
    aliased["reftarget"] = target
    domain = env.get_domain("py")
    found = domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"], target, aliased, contnode)
    return found if found is not None else missing_reference(app, env, aliased, contnode)


def _napoleon_for_callables_only(app) -> None:
    """Napoleon reads the first line of an attribute's, constant's or property's docstring as
    ``type: description`` (Google style), which turns sentences such as "Shape: one input ..." into
    type references; those docstrings are prose here, so napoleon only sees the other objects'."""
    listeners = app.events.listeners["autodoc-process-docstring"]
    for listener in list(listeners):
        if getattr(listener.handler, "__module__", "").startswith("sphinx.ext.napoleon"):
            napoleon = listener.handler
            app.disconnect(listener.id)

            def callables_only(app, what, name, obj, options, lines, napoleon=napoleon):
                if what not in ("attribute", "data", "property"):
                    napoleon(app, what, name, obj, options, lines)

            app.connect("autodoc-process-docstring", callables_only, priority=listener.priority)


def setup(app):
    _napoleon_for_callables_only(app)
    app.connect("autodoc-process-bases", _public_bases)
    app.connect("autodoc-skip-member", _skip_module_state)
    app.connect("autodoc-process-docstring", _own_docstring_only)
    app.connect("missing-reference", _resolve_alias, priority=900)
