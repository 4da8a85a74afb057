"""Statically: library code never pins tensors or modules to CUDA itself (no ``.cuda()``
call and no ``torch.set_default_device``); tensors follow the user's device (see the
``test_*_devices.py`` files for the behaviour on each device)."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("gpytorch_hippo", "gpytorch_sgpa", "pseudovideo")
FORBIDDEN = ("cuda", "set_default_device")


def calls_of(path: pathlib.Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in FORBIDDEN:
            yield f"{path.relative_to(ROOT)}:{node.lineno}: .{node.func.attr}(...)"


@pytest.mark.parametrize("package", PACKAGES)
def test_library_code_does_not_move_things_to_cuda_by_itself(package):
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no Python files found under {package}"
    offending = [call for path in files for call in calls_of(path)]
    assert not offending, "move tensors with .to(device) of the user's inputs instead:\n" + "\n".join(offending)
