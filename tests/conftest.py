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


CUDA_SKIP = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="CUDA is not available (torch.cuda.is_available() is False): the device tests ran on CPU only",
)


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=CUDA_SKIP)])
def device(request):
    """Each device test runs on the CPU and, where a GPU is available, on CUDA (issue 16).

    On CUDA, TF32 is switched off for matmuls and cuDNN convolutions during the test (restored
    afterwards): float32 results are then compared with the CPU's at float32 round-off, not at TF32's
    ~1e-3 relative precision."""
    if request.param == "cpu":
        yield torch.device("cpu")
        return
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield torch.device("cuda")
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _leaves(value):
    if isinstance(value, (tuple, list)):
        return [leaf for item in value for leaf in _leaves(item)]
    if isinstance(value, dict):
        return [leaf for key in sorted(value) for leaf in _leaves(value[key])]
    return [value]


@pytest.fixture
def assert_matches_cpu(device):
    """``check(result, reference, rtol, atol)``: every tensor of ``result`` (nested tuples, lists and
    dicts of tensors and numbers) lives on ``device`` and equals the CPU ``reference`` within the
    tolerances; numbers are compared with the same tolerances."""

    def check(result, reference, rtol: float, atol: float) -> None:
        got, expected = _leaves(result), _leaves(reference)
        assert len(got) == len(expected)
        for value, want in zip(got, expected):
            if isinstance(value, torch.Tensor):
                assert value.device.type == device.type, f"result on {value.device}, expected {device}"
                assert value.dtype == want.dtype
                torch.testing.assert_close(value.cpu(), want, rtol=rtol, atol=atol)
            else:
                assert value == pytest.approx(want, rel=rtol, abs=atol)

    return check


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
