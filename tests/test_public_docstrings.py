"""Every parameter of the public API is described in its docstring.

The public API is what the site's API pages document (docs/conf.py, docs/api.rst): the names in each
package's ``__all__``, and in every public module (no ``_`` in its dotted name) the public classes and
functions it defines, with each class's public methods (its own and those it inherits from private
base classes of the same package, which the class page shows). A class's parameters are those of its
signature (``__init__``, or a named tuple's ``__new__``), described in the class docstring, which is
the text the page shows (``autoclass_content = "class"``); an ``__init__`` docstring counts as well.

A parameter is described by a Sphinx field (``:param name:``, ``:param type name:``, or one of the
synonyms ``:parameter:``, ``:arg:``, ``:argument:``, ``:key:``, ``:keyword:``) or by an entry of a
napoleon section (``Args:``, ``Arguments:``, ``Parameters``, ``Keyword Args:``). ``self``, ``cls`` (a named tuple's
``_cls``), ``*args`` and ``**kwargs`` need no description.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import pytest

PACKAGES = ("gpytorch_hippo", "gpytorch_sgpa", "pseudovideo")

_FIELD = re.compile(r"^\s*:(?:param|parameter|arg|argument|key|keyword)\s+(?:[^:]*\s)?\*{0,2}((?:\w|\\_)+)\s*:", re.M)
_SECTION = re.compile(r"^(\s*)(Args|Arguments|Parameters|Keyword Args|Keyword Arguments|Other Parameters)\s*:?\s*$")


def _described(doc: str) -> set[str]:
    """The parameter names a docstring describes (Sphinx fields and napoleon sections)."""
    names = {name.replace("\\_", "_") for name in _FIELD.findall(doc)}  # ``global\_``: an escaped trailing underscore
    lines = doc.splitlines()
    for i, line in enumerate(lines):
        match = _SECTION.match(line)
        if not match:
            continue
        indent = len(match.group(1))
        body = lines[i + 1 :]
        if body and set(body[0].strip()) == {"-"}:  # numpydoc's underline
            body = body[1:]
        entry_indent = None
        for entry in body:
            if not entry.strip():
                continue
            width = len(entry) - len(entry.lstrip())
            if width < indent or (width == indent and entry_indent is not None and entry_indent > indent):
                break
            if entry_indent is None:
                entry_indent = width
            if width == entry_indent:
                name = re.match(r"\s*\*{0,2}(\w+)", entry)
                if name:
                    names.add(name.group(1))
    return names


def _is_ours(obj) -> bool:
    return (getattr(obj, "__module__", None) or "").split(".")[0] in PACKAGES


def _is_private_class(cls) -> bool:
    parts = [*cls.__module__.split(".")[1:], *cls.__qualname__.split(".")]
    return any(part.startswith("_") and not part.startswith("__") for part in parts)


def _public_modules():
    for package in PACKAGES:
        yield importlib.import_module(package)
        for info in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
            if not any(part.startswith("_") for part in info.name.split(".")):
                yield importlib.import_module(info.name)


def _parameters(function) -> list[str]:
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return []
    return [
        name
        for name, parameter in signature.parameters.items()
        if name not in ("self", "cls", "_cls") and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
    ]


def _methods(cls):
    """(name, function) for the public methods the class page documents: the class's own and those
    of its private base classes from the same package."""
    owners = [cls, *(base for base in cls.__mro__[1:] if _is_ours(base) and _is_private_class(base))]
    seen = set()
    for owner in owners:
        for name, value in vars(owner).items():
            if name.startswith("_") or name in seen:
                continue
            seen.add(name)
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            if inspect.isfunction(value):
                yield name, value


def _class_init(cls):
    """The function whose signature the class page shows (``__init__``, or a named tuple's
    ``__new__``) and the docstrings that may describe its parameters; ``(None, [])`` where that
    function is another library's (``torch.nn.Module.__init__``) or ``object``'s."""
    for owner in cls.__mro__:
        function = vars(owner).get("__init__", vars(owner).get("__new__"))
        if function is None:
            continue
        if isinstance(function, staticmethod):
            function = function.__func__
        if not _is_ours(owner) or not inspect.isfunction(function):
            return None, []
        return function, [cls.__doc__ or "", function.__doc__ or "", owner.__doc__ or ""]
    return None, []


def _public_objects():
    """(dotted name, object) for every public class and function the API pages document."""
    found = {}
    for module in _public_modules():
        names = [
            name
            for name, obj in vars(module).items()
            if not name.startswith("_")
            and (inspect.isclass(obj) or inspect.isfunction(obj))
            and getattr(obj, "__module__", None) == module.__name__
        ]
        names += [
            name
            for name in getattr(module, "__all__", ())
            if inspect.isclass(getattr(module, name, None)) or inspect.isfunction(getattr(module, name, None))
        ]
        for name in names:
            obj = getattr(module, name)
            if _is_ours(obj):
                found.setdefault(f"{obj.__module__}.{obj.__qualname__}", obj)
    return found


def _undocumented() -> list[tuple[str, str]]:
    missing = []
    for path, obj in sorted(_public_objects().items()):
        if inspect.isclass(obj):
            init, docs = _class_init(obj)
            if init is not None:
                described = set().union(*(_described(doc) for doc in docs))
                missing += [(path, name) for name in _parameters(init) if name not in described]
            for name, method in _methods(obj):
                described = _described(inspect.getdoc(method) or "")
                missing += [(f"{path}.{name}", parameter) for parameter in _parameters(method) if parameter not in described]
        else:
            described = _described(inspect.getdoc(obj) or "")
            missing += [(path, name) for name in _parameters(obj) if name not in described]
    return sorted(set(missing))


@pytest.fixture(scope="module")
def undocumented():
    return _undocumented()


def test_described_finds_fields_and_sections():
    doc = (
        "Summary.\n\n:param x: one.\n:param int y: two.\n:param u\\_: zero.\n\nArgs:\n    z (int): three.\n        more of z.\n"
        "    w: four.\n\nParameters\n----------\nv : float\n    five.\n"
    )
    assert _described(doc) == {"x", "y", "u_", "z", "w", "v"}


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_parameter_is_described(undocumented, package):
    missing = [pair for pair in undocumented if pair[0].startswith(package + ".")]
    assert not missing, f"{len(missing)} public parameters of {package} have no description in their docstrings:\n" + "\n".join(
        f"  {path}: {name}" for path, name in missing
    )
