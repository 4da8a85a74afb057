"""The model classes stay small: each does one job, and the pieces around it live in their own modules.

A class's size is counted from its ``class`` line to the next top-level statement of its module (docstring,
comments and blank lines included), as a reader scrolls it."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: (module path, class name, most lines)
LIMITS = [("gpytorch_hippo/online.py", "OnlineSGPR", 300)]


def class_lines(path: pathlib.Path, name: str) -> int:
    """Lines from the ``class name`` line to the next top-level statement (or the end of the file)."""
    text = path.read_text(encoding="utf-8")
    body = ast.parse(text).body
    for index, node in enumerate(body):
        if isinstance(node, ast.ClassDef) and node.name == name:
            decorated = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            end = body[index + 1].lineno if index + 1 < len(body) else len(text.splitlines()) + 1
            return end - decorated
    raise LookupError(f"{path} defines no top-level class {name}")


@pytest.mark.parametrize("path, name, limit", LIMITS)
def test_model_class_stays_within_its_size(path, name, limit):
    lines = class_lines(ROOT / path, name)
    assert lines <= limit, f"{name} has {lines} lines (at most {limit}): move a piece that is not the model into its own module"


def test_class_lines_counts_to_the_next_top_level_statement(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import os\n\n\nclass A:\n    x = 1\n\n    def f(self):\n        return 2\n\n\nB = 3\n", encoding="utf-8")
    assert class_lines(module, "A") == 7
    with pytest.raises(LookupError):
        class_lines(module, "C")
