"""Statically: library code never pins tensors or modules to CUDA itself (no ``.cuda()`` call, no
``torch.set_default_device`` and no ``"cuda"`` passed as a device); tensors follow the user's device
(see the ``test_*_devices.py`` files for the behaviour on each device and dtype)."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("probseq", "gpytorch_hippo", "gpytorch_sgpa", "pseudovideo")
FORBIDDEN = ("cuda", "set_default_device")


def _names_cuda(node) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.split(":")[0] == "cuda"


def calls_of(source: str, name: str):
    """``name:line: ...`` of each call in ``source`` that moves things to CUDA by itself."""
    for node in ast.walk(ast.parse(source, filename=name)):
        if not isinstance(node, ast.Call):
            continue
        if isinstance(node.func, ast.Attribute) and node.func.attr in FORBIDDEN:
            yield f"{name}:{node.lineno}: .{node.func.attr}(...)"
        elif any(_names_cuda(argument) for argument in [*node.args, *(keyword.value for keyword in node.keywords)]):
            yield f"{name}:{node.lineno}: a call given the device 'cuda'"


@pytest.mark.parametrize(
    "line",
    ["x = torch.zeros(3).cuda()", 'torch.set_default_device("cuda")', 'x = torch.zeros(3, device="cuda")', 'model.to("cuda:0")'],
)
def test_each_way_of_pinning_cuda_is_found(line):
    assert len(list(calls_of(line, "example.py"))) == 1
    assert not list(calls_of('x = torch.zeros(3, device=y.device)\nif y.device.type == "cuda":\n    pass', "example.py"))


@pytest.mark.parametrize("package", PACKAGES)
def test_library_code_does_not_move_things_to_cuda_by_itself(package):
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no Python files found under {package}"
    offending = [call for path in files for call in calls_of(path.read_text(), str(path.relative_to(ROOT)))]
    assert not offending, "move tensors with .to(device) of the user's inputs instead:\n" + "\n".join(offending)
