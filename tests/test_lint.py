"""The code meets the ruff configuration in pyproject.toml (``ruff check .``), as CI runs it."""

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_ruff_check_passes():
    pytest.importorskip("ruff", reason="ruff is in the test extra: pip install 'probseq[test]'")
    command = [sys.executable, "-m", "ruff", "check", "--no-cache", str(ROOT)]
    if shutil.which("git") and (ROOT / ".git").exists():  # the tracked files only, not build outputs
        files = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
        command = [sys.executable, "-m", "ruff", "check", "--no-cache", *files]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
