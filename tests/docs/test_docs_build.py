"""The API site builds offline with warnings as errors, documents every exported name, and renders
the executed tutorials without stderr output.

The default build renders the tutorials without executing them (tests/docs/test_tutorials.py runs
every one); the executed build (what `make docs` does) is the slow test at the end."""

import html
import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def build(out: pathlib.Path, execute: bool) -> pathlib.Path:
    pytest.importorskip("myst_nb")
    env = dict(os.environ, PROBSEQ_DOCS_EXECUTE="force" if execute else "off", PROBSEQ_TUTORIAL_SIZE="small", OMP_NUM_THREADS="1")
    env.pop("MPLBACKEND", None)  # as in `make docs`: the kernel shows the plots inline
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-E", "-q", "-b", "html", str(DOCS), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert result.returncode == 0, result.stderr[-5000:]
    return out


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    return build(tmp_path_factory.mktemp("html"), execute=False)


def load_conf():
    spec = importlib.util.spec_from_file_location("probseq_docs_conf", DOCS / "conf.py")
    conf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf)
    return conf


def test_sphinx_builds_without_warnings(site):
    tutorials = sorted(p.name for p in (site / "tutorials").glob("*.html"))
    assert tutorials == sorted(p.stem + ".html" for p in (DOCS / "tutorials").glob("[0-9][0-9]_*.py"))
    assert (site / "tutorials" / "01_hippo_memory.html").read_text().count("cell_input") >= 3  # the code cells are there
    # one page per public module, the package pages listing what they export
    for page in (
        "gpytorch_hippo",
        "gpytorch_hippo.hippo",
        "gpytorch_hippo.botorch",
        "gpytorch_hippo.data.series",
        "gpytorch_sgpa",
        "gpytorch_sgpa.transformer",
        "pseudovideo",
        "pseudovideo.metrics",
        "pseudovideo.models.diffusion",
        "pseudovideo.models.hvae",
    ):
        assert (site / "api" / f"{page}.html").exists(), page
    package = (site / "api" / "gpytorch_hippo.html").read_text()
    for target in (
        "hippo.HiPPO",
        "online.OnlineSGPR",
        "inducing.hippo_variables.HiPPOInducingVariables",
        "likelihoods.NegativeBinomialLikelihood",
    ):
        module, name = target.rsplit(".", 1)
        assert f'href="gpytorch_hippo.{module}.html#gpytorch_hippo.{target}"' in package, target


def test_every_exported_name_is_documented(site):
    """Each name in the ``__all__`` of every public module is an object of the site's inventory,
    under the module that defines it (where the package pages link)."""
    from sphinx.util.inventory import InventoryFile

    with open(site / "objects.inv", "rb") as f:
        inventory = InventoryFile.load(f, "", lambda base, uri: uri)
    documented = (
        {name for objects in inventory.data.values() for name in objects}
        if hasattr(inventory, "data")
        else {name for objects in inventory.values() for name in objects}
    )
    conf = load_conf()
    missing = [
        f"{module.__name__}.{name} (documented as {conf._canonical(module, name)})"
        for module in conf._public_modules()
        for name in getattr(module, "__all__", ())
        if conf._canonical(module, name) not in documented
    ]
    assert not missing, "exported but not in the API pages:\n" + "\n".join(missing)


def test_classes_show_their_methods_and_no_private_bases(site):
    transformer = (site / "api" / "gpytorch_sgpa.transformer.html").read_text()
    for method in ("SGPAViT.predict_proba", "SGPAViT.global_kl", "SGPADecoder.generate", "SGPADecoder.forward_step"):
        assert f'id="gpytorch_sgpa.transformer.{method}"' in transformer, method
    attention = (site / "api" / "gpytorch_sgpa.attention.html").read_text()
    assert 'id="gpytorch_sgpa.attention.SGPAttention.forward_step"' in attention
    variational = (site / "api" / "gpytorch_hippo.variational.html").read_text()
    for method in ("advance", "replace_inducing_variables"):
        assert f'id="gpytorch_hippo.variational.InterdomainVariationalStrategy.{method}"' in variational, method
    for page in (site / "api").glob("*.html"):
        bases = re.findall(r"Bases: (.*?)</p>", page.read_text(), flags=re.S)
        private = [b for b in bases if re.search(r">_[A-Za-z]|\._[A-Za-z]", b)]
        assert not private, (page.name, private)


def test_math_and_cross_references_need_no_network(site):
    assert (site / "_static" / "mathjax" / "tex-chtml.js").exists()
    hippo = (site / "api" / "gpytorch_hippo.hippo.html").read_text()
    assert "_static/mathjax/tex-chtml.js" in hippo and "cdn.jsdelivr" not in hippo
    assert r"\frac{\mathrm{d}}{\mathrm{d}t} c(t)" in html.unescape(hippo)  # the ODE, written out
    # intersphinx links from the bundled inventories (docs/_intersphinx/)
    transformer = (site / "api" / "gpytorch_sgpa.transformer.html").read_text()
    assert "https://docs.pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module" in transformer
    variational = (site / "api" / "gpytorch_hippo.variational.html").read_text()
    assert "https://docs.gpytorch.ai/en/stable/" in variational


# Docstrings still citing LaTeX labels of the thesis, to be rewritten like the others.
LABELLED = {"gpytorch_sgpa/dropin.py", "gpytorch_sgpa/adapters.py"}


def test_docstrings_name_no_thesis_labels():
    """Equations are cited by number ("thesis eq. (4.6)") or written out, not by LaTeX label."""
    pattern = re.compile(r"(?:eqs?\.|Figs?\.|Table|§[0-9.]+,?|App\. [A-C])\s*``[a-z_: ]+``")
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for package in ("gpytorch_hippo", "gpytorch_sgpa", "pseudovideo")
        for path in sorted((ROOT / package).rglob("*.py"))
        if path.relative_to(ROOT).as_posix() not in LABELLED
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found, found


@pytest.mark.slow
def test_executed_tutorials_show_no_stderr_and_no_build_paths(tmp_path):
    """What `make docs` builds (at the small size): no cell writes to stderr (warnings, progress
    bars), and no output names a path of the machine that built the site."""
    out = build(tmp_path / "html", execute=True)
    machine_paths = re.compile("|".join(re.escape(str(p)) for p in {ROOT, pathlib.Path.home(), tmp_path}) + r"|/tmp/ipykernel")
    for page in sorted((out / "tutorials").glob("*.html")):
        text = page.read_text()
        stderr = re.findall(r'<div class="output stderr.*?</pre>', text, flags=re.S)
        assert not stderr, (page.name, html.unescape(re.sub("<[^>]+>", "", stderr[0]))[:2000])
        assert not machine_paths.search(text), (page.name, machine_paths.search(text).group(0))
