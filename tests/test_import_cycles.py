"""No import cycle among the modules of the three packages (and ``probseq``, their shared private modules);
no module reaches into another's private names, by import or by attribute; none imports the experiments
(the top-level ``experiments/`` tree, which is not installed).

Every import statement counts: module-level ones, those inside functions and methods (a
function-level import only postpones a cycle to the first call), and those at the end of a
file.  The graph's nodes are modules; ``import a.b`` and ``from a import b`` (``b`` a
submodule) are edges to ``a.b``; ``from a import name`` (``name`` defined or re-exported by
``a/__init__.py``) is an edge to the package ``a`` itself.  A package's ``__init__`` importing
its own submodules is therefore an ordinary edge, and a submodule that imports a name from its
own package's ``__init__`` while that ``__init__`` imports the submodule closes a cycle.
Importing ``a.b.c`` also runs ``a/__init__`` and ``a/b/__init__`` first, but those implied
edges are not counted: every absolute import would otherwise point back at the top-level
package.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gpytorch_hippo", "gpytorch_sgpa", "pseudovideo", "probseq")


def _modules(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, tuple[Path, bool]]:
    """Map each dotted module name to (its file, whether it is a package ``__init__``)."""
    found: dict[str, tuple[Path, bool]] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            found[".".join(parts)] = (path, is_package)
    return found


def _resolve_relative(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute name of ``from <level dots><target> import ...`` written in ``module``."""
    parts = module.split(".")
    # A package's __init__ is its package: one dot means the package itself.
    base = parts if is_package else parts[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def _deepest_module(name: str, modules: dict[str, tuple[Path, bool]]) -> str | None:
    """``name`` if it is a project module, else its longest prefix that is one."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def import_graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, dict[str, int]]:
    """Edges between project modules: ``graph[a][b]`` is the line of ``a`` that imports ``b``."""
    modules = _modules(root, packages)
    graph: dict[str, dict[str, int]] = {name: {} for name in modules}
    for name, (path, is_package) in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve_relative(name, is_package, node.level, node.module) if node.level else node.module or ""
                for alias in node.names:
                    submodule = f"{base}.{alias.name}"
                    # ``from pkg import sub`` depends on pkg.sub when that is a module, else on pkg.
                    targets.append(submodule if submodule in modules else base)
            for target in targets:
                resolved = _deepest_module(target, modules)
                if resolved is not None and resolved != name:
                    graph[name].setdefault(resolved, node.lineno)
    return graph


def find_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0

    def visit(start: str) -> None:
        nonlocal counter
        # Iterative depth-first search: deep package graphs must not hit the recursion limit.
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return sorted(components)


def _describe(component: list[str], graph: dict[str, dict[str, int]]) -> str:
    members = set(component)
    edges = [f"    {a} -> {b} (line {graph[a][b]})" for a in component for b in sorted(graph[a]) if b in members]
    return "cycle among " + ", ".join(component) + ":\n" + "\n".join(edges)


def test_no_import_cycles() -> None:
    graph = import_graph()
    cycles = find_cycles(graph)
    assert not cycles, "\n".join(_describe(component, graph) for component in cycles)


def _write_package(root: Path, files: dict[str, str]) -> None:
    """The package ``pkg`` under ``root``: ``files`` maps paths inside it (``sub/`` allowed) to their text."""
    for relative, text in files.items():
        path = root / "pkg" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_graph_sees_the_imports_a_cycle_can_hide_behind(tmp_path: Path) -> None:
    """The checker finds cycles through function-level, end-of-file and ``from . import`` imports."""
    _write_package(
        tmp_path,
        {
            "__init__.py": "from .a import A\n",
            "a.py": "class A:\n    def f(self):\n        from .b import B\n        return B\n",
            "b.py": "class B:\n    pass\n\nfrom pkg.a import A  # end of file\n",
            "c.py": "from . import A\n",  # a name from the package's __init__
            "d.py": "import pkg.sub.e\n",
            "sub/__init__.py": "",
            "sub/e.py": "from .. import d\n",  # ``d`` is a module: an edge to pkg.d, not to pkg
            "f.py": "from pkg import sub\n",  # a subpackage
        },
    )
    graph = import_graph(tmp_path, ("pkg",))
    assert graph["pkg"] == {"pkg.a": 1}
    assert graph["pkg.a"] == {"pkg.b": 3}
    assert graph["pkg.b"] == {"pkg.a": 4}
    assert graph["pkg.c"] == {"pkg": 1}
    assert graph["pkg.sub.e"] == {"pkg.d": 1}
    assert graph["pkg.f"] == {"pkg.sub": 1}
    assert find_cycles(graph) == [["pkg.a", "pkg.b"], ["pkg.d", "pkg.sub.e"]]
    # c imports from __init__, but __init__ does not import c: no cycle there.
    (tmp_path / "pkg" / "__init__.py").write_text("from .a import A\nfrom . import c\n", encoding="utf-8")
    assert ["pkg", "pkg.c"] in find_cycles(import_graph(tmp_path, ("pkg",)))


IMPORT_FUNCTIONS = ("importlib.import_module", "import_module", "__import__")


def experiment_imports(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """``file:line name`` for every module of the packages that is an experiment (a module of an ``experiments``
    subpackage) or imports one: the top-level ``experiments`` tree or a package's ``experiments``, by absolute or
    relative import, at module level or inside a function, or by ``importlib.import_module("...")``."""
    found = []
    for name, (path, is_package) in _modules(root, packages).items():
        where = path.relative_to(root)
        if "experiments" in name.split("."):
            found.append(f"{where}:1 {name}")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve_relative(name, is_package, node.level, node.module) if node.level else node.module or ""
                targets = [f"{base}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Call) and _dotted(node.func) in IMPORT_FUNCTIONS and node.args:
                argument = node.args[0]
                if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
                    targets = [argument.value]
            found += [f"{where}:{node.lineno} {target}" for target in targets if "experiments" in target.split(".")]
    return found


def test_no_module_of_the_packages_imports_the_experiments() -> None:
    """The packages are what the wheel installs; the experiments run from a checkout only, so the core (the main demo
    included) imports nothing from them."""
    assert experiment_imports() == []


def test_experiment_import_check_sees_every_kind_of_import(tmp_path: Path) -> None:
    _write_package(
        tmp_path,
        {
            "__init__.py": "",
            "__main__.py": "def main():\n    from .experiments import online\n",  # lazy, relative
            "a.py": "import experiments.hippo.online as runner\n",
            "b.py": "from experiments.hippo import online\n",
            "c.py": "import importlib\n\n\ndef load():\n    return importlib.import_module('experiments.hippo.online')\n",
            "d.py": "from pkg import experiments\n",
            "e.py": "import experiments_helper\nfrom .a import runner\n",  # neither is an experiment
            "experiments/__init__.py": "",
        },
    )
    assert experiment_imports(tmp_path, ("pkg",)) == [
        "pkg/__main__.py:2 pkg.experiments.online",
        "pkg/a.py:1 experiments.hippo.online",
        "pkg/b.py:1 experiments.hippo.online",
        "pkg/c.py:5 experiments.hippo.online",
        "pkg/d.py:1 pkg.experiments",
        "pkg/experiments/__init__.py:1 pkg.experiments",
    ]


def test_the_botorch_package_exports_its_modules_names() -> None:
    """The package gives its modules' objects, and the pathwise samplers are registered on
    ``import gpytorch_hippo.botorch``."""
    from botorch.sampling.pathwise.posterior_samplers import DrawMatheronPaths

    import gpytorch_hippo.botorch as package
    from gpytorch_hippo.botorch import models, variational

    assert package.OnlineGPModel is models.OnlineGPModel
    assert package.OnlineVariationalGPModel is variational.OnlineVariationalGPModel
    assert all(hasattr(package, name) for name in package.__all__)
    registered = set(DrawMatheronPaths.funcs)
    assert (models.OnlineGPModel,) in registered


def private_name_imports(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """``file:line name`` for every import of a private name defined in another project module.

    A private name starts with one underscore (not a dunder).  Every ``from ... import``
    counts, relative or absolute, at module level or inside a function or class.  Importing a
    private *module* (``from . import _helpers``, where ``_helpers`` is a submodule) is fine:
    only private names defined inside another module are reported.
    """
    modules = _modules(root, packages)
    found: list[str] = []
    for name, (path, is_package) in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = _resolve_relative(name, is_package, node.level, node.module) if node.level else node.module or ""
            if base not in modules or base == name:
                continue
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                if private and f"{base}.{alias.name}" not in modules:
                    found.append(f"{path.relative_to(root).as_posix()}:{node.lineno} {alias.name}")
    return sorted(found)


def test_no_module_imports_a_private_name_of_another_module() -> None:
    """What modules share is public within its package (in a private module if it should stay
    off the documentation site); no module reaches into another's private names."""
    offenders = private_name_imports()
    assert not offenders, "private names imported from another module:\n" + "\n".join(f"    {item}" for item in offenders)


def test_private_name_check_sees_every_kind_of_import(tmp_path: Path) -> None:
    """The check finds nested, absolute and multi-line imports, and lets private submodules,
    dunders, a module's own names and other libraries' names pass."""
    _write_package(
        tmp_path,
        {
            "__init__.py": "from ._private import helper\n",
            "_private.py": "def helper():\n    pass\n\n_hidden = 1\n",
            "a.py": "from . import _private\nfrom ._private import helper, __doc__\nfrom os import _exit\n",
            "b.py": "def f():\n    from ._private import _hidden\n    return _hidden\n",
            "c.py": "from pkg._private import (\n    helper,\n    _hidden,\n)\n",
            "sub/__init__.py": "",
            "sub/d.py": "class C:\n    from .. import _hidden\n",
            "sub/e.py": "from .. import _private as _p\nfrom pkg.sub import d\n",
        },
    )
    assert private_name_imports(tmp_path, ("pkg",)) == ["pkg/b.py:2 _hidden", "pkg/c.py:1 _hidden", "pkg/sub/d.py:2 _hidden"]


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for a chain of names and attributes, else ``None``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _annotation_names(annotation: ast.expr | None) -> list[str]:
    """The dotted names an annotation names: ``A``, ``a.A``, ``"A"``, ``A | None``."""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return _annotation_names(ast.parse(annotation.value, mode="eval").body)
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        return _annotation_names(annotation.left) + _annotation_names(annotation.right)
    name = _dotted(annotation) if annotation is not None else None
    return [name] if name else []


def private_attribute_uses(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """``file:line receiver._name`` for every private attribute read through a receiver that the module itself shows
    to come from another project module.

    A receiver comes from another module when it is a name bound by an import of that module or of a name it defines
    (``from . import models`` then ``models._helper()``, ``import pkg.a`` then ``pkg.a._x``, ``from .models import
    Model`` then ``Model._check()``), or a function's parameter or annotated variable whose annotation is such an
    imported name (``def f(model: Model): model._step()``; ``Model | None`` and quoted annotations count), unless the
    module defines or assigns that private name itself (a subclass's own method on an object it checked with
    ``isinstance``).  What needs type inference is out of scope: ``self._x``, ``cls._x`` and ``super()._x`` (a class
    using what it inherits), ``self.model._x``, and names bound by assignment (``model = self.model``).  Private: one
    leading underscore, not a dunder.
    """
    modules = _modules(root, packages)
    found: list[str] = []
    for name, (path, is_package) in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        imported: dict[str, str] = {}  # local name -> the dotted name it stands for
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    local = alias.asname or alias.name.partition(".")[0]
                    imported[local] = alias.name if alias.asname else local
            elif isinstance(node, ast.ImportFrom):
                base = _resolve_relative(name, is_package, node.level, node.module) if node.level else node.module or ""
                for alias in node.names:
                    imported[alias.asname or alias.name] = f"{base}.{alias.name}"

        def origin(dotted: str | None) -> str | None:
            """The other project module ``dotted`` (a chain rooted at an imported name) comes from, if any."""
            if dotted is None or dotted.partition(".")[0] not in imported:
                return None
            root_name, _, rest = dotted.partition(".")
            owner = _deepest_module(imported[root_name] + (f".{rest}" if rest else ""), modules)
            return owner if owner is not None and owner != name else None

        own = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
        own |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)}
        own |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        typed: dict[ast.AST, set[str]] = {}  # function -> its names annotated with another module's class
        for function in ast.walk(tree):
            if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                arguments = function.args
                annotated = [(a.arg, a.annotation) for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs]
                annotated += [
                    (n.target.id, n.annotation)
                    for n in ast.walk(function)
                    if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                ]
                typed[function] = {arg for arg, annotation in annotated if any(origin(a) for a in _annotation_names(annotation))}
        for scope in [tree, *typed]:
            names = typed.get(scope, set())
            for node in ast.walk(scope):
                if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
                    continue
                receiver = _dotted(node.value)
                by_type = isinstance(node.value, ast.Name) and node.value.id in names and node.attr not in own
                if (scope is tree and origin(receiver)) or by_type:
                    found.append(f"{path.relative_to(root).as_posix()}:{node.lineno} {receiver}.{node.attr}")
    return sorted(set(found))


def test_no_module_reads_a_private_attribute_of_another_module() -> None:
    """No module calls another module's private functions or methods, nor reads its private attributes, through a
    receiver whose origin the module shows (:func:`private_attribute_uses`): it gets a public name instead."""
    offenders = private_attribute_uses()
    assert not offenders, "private attributes of another module:\n" + "\n".join(f"    {item}" for item in offenders)


def test_private_attribute_check_sees_what_the_module_shows(tmp_path: Path) -> None:
    """The check finds private reads through imported modules and classes and through annotated parameters, and lets
    a module's own privates, ``self``, other libraries, dunders and unannotated receivers pass."""
    _write_package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "class Model:\n    def _step(self):\n        return self._step\n\n    @classmethod\n"
            "    def _check(cls):\n        pass\n",
            "b.py": "from . import a\nfrom .a import Model\n\na._helper()\nModel._check()\n",
            "c.py": "import pkg.a\nimport os\n\n\ndef f(model: pkg.a.Model, other: 'Model | None', plain):\n"
            "    os._exit\n    plain._step()\n    model.__dict__\n    return model._step(), other._step()\n\n\n"
            "from pkg.a import Model\n\n\ndef g(self):\n    self._step()\n    pkg.a._hidden\n",
            "d.py": "from .a import Model\n\n\nclass Own(Model):\n    def _x(self, other: Model):\n        return other._x\n\n\nOwn._x\n",
        },
    )
    assert private_attribute_uses(tmp_path, ("pkg",)) == [
        "pkg/b.py:4 a._helper",
        "pkg/b.py:5 Model._check",
        "pkg/c.py:17 pkg.a._hidden",
        "pkg/c.py:9 model._step",
        "pkg/c.py:9 other._step",
    ]


#: Private names that GPyTorch's own classes define and the project's subclasses set as upstream does: upstream API,
#: not another project module's private member (each is checked to be in its class's source below).
UPSTREAM_PRIVATE = {"_variational_distribution": "gpytorch.variational._variational_strategy._VariationalStrategy"}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _class_members(tree: ast.Module) -> set[str]:
    """The private names a module's classes define: methods, class-body assignments, ``self._x = ...``/``cls._x = ...``."""
    names: set[str] = set()
    for cls in ast.walk(tree):
        if not isinstance(cls, ast.ClassDef):
            continue
        for statement in cls.body:
            if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
                names.add(statement.name)
            elif isinstance(statement, ast.Assign):
                names |= {target.id for target in statement.targets if isinstance(target, ast.Name)}
            elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                names.add(statement.target.id)
        for node in ast.walk(cls):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name):
                if node.value.id in ("self", "cls"):
                    names.add(node.attr)
    return {name for name in names if _is_private(name)}


def foreign_private_member_uses(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """``file:line receiver._name`` for every private member of another project module's class used through any
    receiver but ``self``, ``cls`` and ``super()``.

    The rule needs no type inference: ``_name`` counts when a class of another project module defines it (a method, a
    class-body assignment, or ``self._name = ...`` in its methods) and the module itself defines it nowhere (none of
    its classes, functions or assigned names: a subclass overriding a hook may use it on other instances of its
    hierarchy).  So ``layer._split(x)``, ``self.online._stored_task()`` and ``strategy._flag = True`` count, reads and
    writes alike; a name no project class defines (another library's) does not, nor the private names GPyTorch's own
    classes define that the project's subclasses set as upstream does (:data:`UPSTREAM_PRIVATE`).
    """
    modules = _modules(root, packages)
    trees = {name: ast.parse(path.read_text(encoding="utf-8"), filename=str(path)) for name, (path, _) in modules.items()}
    members = {name: _class_members(tree) for name, tree in trees.items()}
    found: list[str] = []
    for name, tree in trees.items():
        own = members[name] | {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
        own |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        foreign = set().union(*(names for other, names in members.items() if other != name)) - own - set(UPSTREAM_PRIVATE)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr in foreign):
                continue
            receiver = node.value
            if isinstance(receiver, ast.Name) and receiver.id in ("self", "cls"):
                continue
            if isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Name) and receiver.func.id == "super":
                continue
            found.append(f"{modules[name][0].relative_to(root).as_posix()}:{node.lineno} {ast.unparse(receiver)}.{node.attr}")
    return sorted(set(found))


def test_no_module_uses_a_private_member_of_another_modules_class() -> None:
    """No module calls another module's classes' private methods or reads or writes their private attributes, whatever
    the receiver (:func:`foreign_private_member_uses`): the owning class gives the member a public name instead."""
    offenders = foreign_private_member_uses()
    assert not offenders, "private members of another module's class:\n" + "\n".join(f"    {item}" for item in offenders)


def test_upstream_private_names_are_upstream() -> None:
    """Each name the member check leaves to upstream is set by the upstream class it names."""
    for member, qualified in UPSTREAM_PRIVATE.items():
        module, _, cls = qualified.rpartition(".")
        assert f"self.{member} =" in inspect.getsource(getattr(importlib.import_module(module), cls))


def test_private_member_check_sees_any_receiver(tmp_path: Path) -> None:
    """The check finds another module's class's private methods and attributes through any receiver, read or written,
    and lets ``self``/``cls``/``super()``, a module's own (overriding) members, other libraries' and upstream names pass."""
    _write_package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "class Layer:\n    _flag = False\n\n    def _split(self, x):\n"
            "        self._cache = self._variational_distribution = x\n        return self._split(x), self._cache\n",
            "b.py": "def f(layer, holder, x):\n    holder.layer._flag = True\n    return layer._split(x), holder.layer._cache\n",
            "c.py": "from .a import Layer\n\n\nclass Own(Layer):\n    def _split(self, x):\n"
            "        return super()._split(x), x._split(x)\n",
            "d.py": "def g(model, torch):\n    return model._variational_distribution, torch._C, model.split, model.__dict__\n",
        },
    )
    assert foreign_private_member_uses(tmp_path, ("pkg",)) == [
        "pkg/b.py:2 holder.layer._flag",
        "pkg/b.py:3 holder.layer._cache",
        "pkg/b.py:3 layer._split",
    ]
