"""Every tutorial notebook (jupytext percent script in docs/tutorials/) runs at small size; each
checks its own figures against a reference inside (assert statements), so a notebook that rots fails here."""

import os
import pathlib
import subprocess
import sys

import pytest

TUTORIALS = sorted((pathlib.Path(__file__).resolve().parents[2] / "docs" / "tutorials").glob("[0-9][0-9]_*.py"))


def test_the_eight_tutorials_are_there():
    assert [p.name[:2] for p in TUTORIALS] == ["01", "02", "03", "04", "05", "06", "07", "08"]


@pytest.mark.parametrize("path", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_is_a_notebook_with_prose_and_plots(path):
    jupytext = pytest.importorskip("jupytext")
    notebook = jupytext.read(path)
    kinds = [cell.cell_type for cell in notebook.cells]
    assert kinds[0] == "markdown" and kinds.count("markdown") >= 3 and kinds.count("code") >= 3
    assert any("plt.show()" in cell.source for cell in notebook.cells if cell.cell_type == "code")


@pytest.mark.parametrize("path", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_runs_at_small_size(path, tmp_path):
    env = dict(os.environ, PROBSEQ_TUTORIAL_SIZE="small", MPLBACKEND="Agg", OMP_NUM_THREADS="1")
    result = subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
