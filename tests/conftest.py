import pathlib
import re

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """The suite runs thousands of small tensor operations: on a 2-core (often shared) CI machine two
    OpenMP threads made them 7-25x slower than one (measured in the SGPA, SVGPVAE and HiPPO tests)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


@pytest.fixture
def run_readme_block():
    """``run(marker)``: execute the one README python block containing ``marker``; its namespace."""

    def run(marker: str) -> dict:
        blocks = [b for b in re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S) if marker in b]
        assert len(blocks) == 1, f"expected one README python block containing {marker!r}, found {len(blocks)}"
        namespace = {}
        exec(compile(blocks[0], str(README), "exec"), namespace)
        return namespace

    return run
