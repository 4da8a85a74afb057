import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """The CI CPU has 2 shared cores: small convolutions run fastest on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
