"""The API site builds with warnings as errors (what `make docs` builds, without executing the
tutorials: tests/docs/test_tutorials.py runs them), and holds the pages the README links to."""
import os
import pathlib
import subprocess
import sys

import pytest

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"


def test_sphinx_builds_without_warnings(tmp_path):
    pytest.importorskip("myst_nb")
    env = dict(os.environ, PROBSEQ_DOCS_EXECUTE="off")
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS), str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stderr[-5000:]
    tutorials = sorted(p.name for p in (tmp_path / "tutorials").glob("*.html"))
    assert tutorials == sorted(p.stem + ".html" for p in (DOCS / "tutorials").glob("[0-9][0-9]_*.py"))
    api = (tmp_path / "api.html").read_text()
    for name in ("OnlineGPModel", "OnlineSGPR", "HiPPOInducingVariables", "SGPAttention", "make_pseudo_video"):
        assert name in api, name
    assert (tmp_path / "tutorials" / "01_hippo_memory.html").read_text().count("cell_input") >= 3  # the code cells are there
