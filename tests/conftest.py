import importlib.util
import pathlib
import re

import pytest
import torch

#: the project's own warning classes, errors in every test (a test that provokes one says so: pytest.warns or a marked
#: filter), with the package each needs (a wheel installed without the video extra has no pseudovideo.metrics)
PROJECT_WARNINGS = {
    "pseudovideo.metrics.MetricReliabilityWarning": "torchmetrics",
    "gpytorch_hippo.inducing.base.CapturedVarianceWarning": "gpytorch",
    "gpytorch_hippo.inducing.base.InconsistentCovarianceWarning": "gpytorch",
    "gpytorch_hippo.botorch.models.OnlineGPModelWarning": "botorch",
}


def pytest_configure(config):
    for warning, needs in PROJECT_WARNINGS.items():
        if importlib.util.find_spec(needs) is not None:
            config.addinivalue_line("filterwarnings", f"error::{warning}")


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
    """Each device test runs on the CPU and, where a GPU is available, on CUDA.

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
def device_dtype(device):
    """The floating dtype of the device tests' run on ``device``: float64 on CUDA, float32 on the CPU.

    Each device test compares that run with the same computation in float64 on the CPU. On CUDA this
    checks the device plumbing at float64 round-off; on the CPU (and so on a machine without a GPU)
    it checks that the results follow the inputs' dtype and agree with the float64 reference to
    float32's precision, instead of comparing the CPU with itself."""
    return torch.float64 if device.type == "cuda" else torch.float32


@pytest.fixture
def assert_matches_cpu(device, device_dtype):
    """``check(result, reference, rtol, atol, float32=None, dtype=None)``: every tensor of ``result``
    (nested tuples, lists and dicts of tensors and numbers) lives on ``device``, has the reference's
    dtype with float64 replaced by ``dtype`` (default :func:`device_dtype`), and equals the float64
    CPU ``reference`` within ``rtol``/``atol``, or within ``float32`` (a dict of ``rtol`` and ``atol``)
    when the result was computed in float32; numbers are compared with the same tolerances."""

    def check(result, reference, rtol: float, atol: float, float32: dict | None = None, dtype: torch.dtype | None = None) -> None:
        dtype = device_dtype if dtype is None else dtype
        tolerance = float32 if dtype == torch.float32 and float32 is not None else dict(rtol=rtol, atol=atol)
        got, expected = _leaves(result), _leaves(reference)
        assert len(got) == len(expected)
        for value, want in zip(got, expected):
            if isinstance(value, torch.Tensor):
                assert value.device.type == device.type, f"result on {value.device}, expected {device}"
                assert value.dtype == (dtype if want.dtype == torch.float64 else want.dtype)
                torch.testing.assert_close(value.cpu().to(want.dtype), want, **tolerance)
            else:
                assert value == pytest.approx(want, rel=tolerance["rtol"], abs=tolerance["atol"])

    return check


README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
#: the README and the guides it links to: their python blocks are the usage examples users copy
USAGE_PAGES = (README, *sorted((README.parent / "docs" / "guide").glob("*.md")))


@pytest.fixture
def run_readme_block():
    """``run(marker)``: execute the one python block of the README or a guide page that contains
    ``marker``; its namespace."""

    def run(marker: str) -> dict:
        blocks = [
            (page, b) for page in USAGE_PAGES for b in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S) if marker in b
        ]
        assert len(blocks) == 1, f"expected one python block containing {marker!r} in the README and guides, found {len(blocks)}"
        namespace = {}
        exec(compile(blocks[0][1], str(blocks[0][0]), "exec"), namespace)
        return namespace

    return run


# Markers (registered in setup.cfg) by location, so that the fast loop
#     pytest -m "not slow and not docs and not distributed"
# leaves out the Sphinx build and tutorials, the torchrun tests and the slowest tests; `make test` runs all.
TESTS = pathlib.Path(__file__).resolve().parent
DISTRIBUTED_MODULES = {"sgpa/test_sgpa_distributed.py"}
# The slowest tests of a full run (pytest --durations, 2 s or more on one core of a shared machine), as
# "<module relative to tests/>::<test name without parameters>", and the tests that share an expensive
# module-scoped fixture (its cost moves to whichever of them runs first).
SLOW_TESTS = {
    "test_readme.py::test_readme_examples_run_and_are_accurate",
    "hippo/test_online_experiment.py::test_first_task_fit_reaches_the_marginal_likelihood_of_the_true_hyperparameters",
    "hippo/test_online_experiment.py::test_the_hourly_irradiance_runner_runs_at_m_1000_on_a_short_stream",
    "hippo/test_streaming_bo.py::test_tiny_run_writes_csv_and_table",
    "hippo/test_bad_inputs_hippo.py::test_oversized_evaluations_raise_at_once_with_advice_and_far_forecasts_cost_nothing",
    "sgpa/test_sgpa_compile.py::test_padded_sequences_and_eval_compile_without_graph_breaks",
    "sgpa/test_sgpa_compile.py::test_vit_training_loss_compiles_without_graph_breaks",
    "pseudovideo/test_tokens_experiment.py::test_quick_run_writes_the_csv_contract",
    "pseudovideo/test_prior.py::test_masked_prior_learns_the_chain_conditionals_under_random_masks",
    "pseudovideo/test_readme_pseudovideo.py::test_guide_pipeline_example",
    "pseudovideo/test_readme_pseudovideo.py::test_readme_tokenizer_example",
    "pseudovideo/test_diffusion.py::test_conditioning_is_learned",
    "hippo/test_fleet.py::test_the_demo_writes_its_csv_and_its_batched_fleet_equals_the_loop",
    "hippo/test_fleet.py::test_a_new_process_restores_the_fleet_from_its_checkpoints",
    "hippo/test_inducing_batched.py::test_online_elbo_with_batched_streams_equals_each_streams_own_model",
    "sgpa/test_sgpa_pretrained.py::test_without_the_package_imported_transformers_refuses_the_checkpoint",
}
# hippo/test_continual.py, hippo/test_gpvae_continual.py, pseudovideo/test_diffusion_sampling.py, hippo/test_fleet.py (Ray)
SLOW_FIXTURES = {"moons_results", "two_task_runs", "trained", "ray_instance"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        try:
            module = item.path.resolve().relative_to(TESTS).as_posix()
        except ValueError:
            continue
        if module.startswith("docs/"):
            item.add_marker(pytest.mark.docs)
        if module in DISTRIBUTED_MODULES:
            item.add_marker(pytest.mark.distributed)
        name = f"{module}::{item.nodeid.split('::', 1)[-1].split('[')[0]}"
        if name in SLOW_TESTS or SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
