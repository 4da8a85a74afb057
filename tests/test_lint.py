"""The code meets the ruff configuration in pyproject.toml (``ruff check .``) and is formatted by ``ruff format``, as CI runs it."""

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def ruff(*arguments: str) -> subprocess.CompletedProcess:
    """``ruff <arguments>`` over the tracked Python files (the whole tree where git is not available), without a cache."""
    pytest.importorskip("ruff", reason="ruff is in the test extra: pip install 'probseq[test]'")
    files = [str(ROOT)]
    if shutil.which("git") and (ROOT / ".git").exists():  # the tracked files only, not build outputs
        files = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return subprocess.run([sys.executable, "-m", "ruff", *arguments, "--no-cache", *files], cwd=ROOT, capture_output=True, text=True)


def test_ruff_check_passes():
    result = ruff("check")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_leaves_every_file_as_it_is():
    result = ruff("format", "--check")
    assert result.returncode == 0, "run `ruff format` on:\n" + result.stdout + result.stderr


def test_mypy_reports_no_errors_in_the_packages():
    """The three packages type-check under the ``[tool.mypy]`` configuration of pyproject.toml (the packages and the
    third-party libraries typed ``Any`` because they ship no type information are listed there)."""
    pytest.importorskip("mypy", reason="mypy is in the test extra: pip install 'probseq[test]'")
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(ROOT / ".mypy_cache")], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success: no issues found" in result.stdout, result.stdout
