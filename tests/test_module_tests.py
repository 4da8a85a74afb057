"""Tests follow the modules: each public module of ``gpytorch_sgpa``, ``pseudovideo`` and ``gpytorch_hippo`` has a test
file named after it, ``tests/sgpa/test_sgpa_<name>.py``, ``tests/pseudovideo/test_<name>.py`` and
``tests/hippo/test_<name>.py``, where ``<name>`` is the module's name, alone or after its subpackage's
(``gpytorch_sgpa/baselines/laplace.py``: ``test_sgpa_laplace.py`` or ``test_sgpa_baselines_laplace.py``).

``gpytorch_hippo`` repeats module names (``variational.py`` and ``botorch/variational.py``), so there a submodule's
file takes the long form only (``inducing/spectral.py``: ``test_inducing_spectral.py``), a module named after its
subpackage naming it once (``fleet/fleet.py``: ``test_fleet.py``); a top-level module's file may carry the
package's name (``metrics.py``: ``test_hippo_metrics.py``, as ``tests/pseudovideo/test_metrics.py`` is taken:
pytest imports test files by their file name, so no two may share one).

A module is public when no part of its path starts with an underscore (so private modules, package
``__init__`` files and ``__main__`` demos are tested through the public modules that use them); the
``experiments`` runners are not library modules.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: package -> (its tests' folder, the prefix of its test files)
TEST_FILES = {"gpytorch_sgpa": ("sgpa", "test_sgpa_"), "pseudovideo": ("pseudovideo", "test_"), "gpytorch_hippo": ("hippo", "test_")}


def public_modules(package: str) -> list[Path]:
    """The package's public module files, experiment runners left out."""
    root = ROOT / package
    return [
        path
        for path in sorted(root.rglob("*.py"))
        if not any(part.startswith("_") or part == "experiments" for part in path.relative_to(root).parts)
    ]


def expected_test_files(package: str, module: Path) -> list[Path]:
    """The test files named after ``module``: by its name, and by its subpackage's and its name (module docstring)."""
    folder, prefix = TEST_FILES[package]
    parts = module.relative_to(ROOT / package).with_suffix("").parts
    if package == "gpytorch_hippo":  # the long form only, a repeated name once; a top-level module may add "hippo_"
        names = ["_".join(dict.fromkeys(parts))] + ([f"hippo_{parts[0]}"] if len(parts) == 1 else [])
    else:
        names = [parts[-1]] + (["_".join(parts)] if len(parts) > 1 else [])
    return [ROOT / "tests" / folder / f"{prefix}{name}.py" for name in names]


def modules_without_tests(package: str) -> list[str]:
    """The dotted names of the public modules whose test file is missing, with the file expected."""
    return [
        f"{'.'.join(module.relative_to(ROOT).with_suffix('').parts)} "
        f"(expected {' or '.join(str(path.relative_to(ROOT)) for path in expected_test_files(package, module))})"
        for module in public_modules(package)
        if not any(path.is_file() for path in expected_test_files(package, module))
    ]


def test_the_walk_finds_the_modules_users_import():
    examples = (
        ("gpytorch_sgpa", "attention.py"),
        ("gpytorch_sgpa", "baselines/laplace.py"),
        ("pseudovideo", "models/prior.py"),
        ("gpytorch_hippo", "inducing/hippo_variables.py"),
        ("gpytorch_hippo", "botorch/variational.py"),
    )
    for package, module in examples:
        assert ROOT / package / module in public_modules(package)
    for package in TEST_FILES:
        assert not any("experiments" in path.parts or path.name.startswith("_") for path in public_modules(package))


def test_the_hippo_rule_names_one_file_per_module():
    def names(module):
        return [path.name for path in expected_test_files("gpytorch_hippo", ROOT / "gpytorch_hippo" / module)]

    assert names("variational.py") == ["test_variational.py", "test_hippo_variational.py"]
    assert names("botorch/variational.py") == ["test_botorch_variational.py"]
    assert names("fleet/fleet.py") == ["test_fleet.py"]
    assert names("inducing/lyapunov_batched.py") == ["test_inducing_lyapunov_batched.py"]


def test_module_names_are_unique_within_each_package():
    for package in ("gpytorch_sgpa", "pseudovideo"):
        names = [module.stem for module in public_modules(package)]
        assert len(names) == len(set(names)), f"{package}: two modules share a name, so their test files would too"


def test_no_test_file_counts_for_two_modules():
    owner: dict[Path, Path] = {}
    for package in TEST_FILES:
        for module in public_modules(package):
            for path in expected_test_files(package, module):
                if path.is_file():
                    assert owner.setdefault(path, module) == module, f"{path.name} counts for {owner[path]} and {module}"


def test_test_file_names_are_unique_across_the_folders():
    """pytest imports test files by their file name (the test folders are not packages), so no two may share one."""
    names = sorted(path.name for path in (ROOT / "tests").rglob("test_*.py"))
    assert len(names) == len(set(names)), f"pytest cannot import two test files of one name: {names}"


def test_each_public_module_has_a_test_file_named_after_it():
    missing = [module for package in TEST_FILES for module in modules_without_tests(package)]
    assert not missing, "public modules without a test file named after them:\n" + "\n".join(missing)
