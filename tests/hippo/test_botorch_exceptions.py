"""The online surrogate's warnings are BoTorch warnings: BoTorch's tutorials filter ``RuntimeWarning`` and still see
them, a user's ``BotorchWarning`` filter silences them, and each points at the user's own line."""

import warnings

import torch
from botorch.exceptions.warnings import BotorchWarning

from gpytorch_hippo.botorch import InducingApproximationWarning, OnlineGPModel, OnlineGPModelWarning


def _model(seed):
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(12, 2, generator=generator, dtype=torch.float64)
    return OnlineGPModel(x, torch.sin(6 * x).sum(-1, keepdim=True), fit_maxiter=0)


def test_the_warnings_are_botorch_warnings_outside_runtime_warning():
    assert issubclass(OnlineGPModelWarning, BotorchWarning) and issubclass(InducingApproximationWarning, OnlineGPModelWarning)
    assert not issubclass(OnlineGPModelWarning, RuntimeWarning)  # the tutorials' filter must not hide them


def test_a_warm_start_warns_at_the_users_line_and_a_botorch_filter_silences_it():
    model, other = _model(0), _model(1)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=RuntimeWarning)  # as BoTorch's tutorials do
        model.load_state_dict(other.state_dict())
    warm = [w for w in record if issubclass(w.category, OnlineGPModelWarning)]
    assert len(warm) == 1 and "from_state_dict" in str(warm[0].message)
    assert warm[0].filename == __file__  # stacklevel: the caller of load_state_dict, not the library
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=BotorchWarning)
        model.load_state_dict(other.state_dict())
    assert not [w for w in record if issubclass(w.category, OnlineGPModelWarning)]
