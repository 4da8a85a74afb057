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
