"""What an online model keeps of its past tasks (gpytorch_hippo.stored): frozen copies, the check that the mean
function can still be followed, whether a task is stored, and the allocation that lets a fresh model load one.

References: the original modules' own values and GPyTorch's state_dict; each rule written out case by case.
"""

import gpytorch
import pytest
import torch

from gpytorch_hippo import HiPPOInducingVariables, InducingPoints
from gpytorch_hippo.stored import allocate_stored, check_mean_unchanged, frozen_copy, is_stored

DT = torch.float64


def test_a_frozen_copy_has_the_same_values_no_gradients_and_no_tie_to_the_original():
    points = InducingPoints(torch.linspace(0, 1, 4, dtype=DT).unsqueeze(-1))
    mean = gpytorch.means.LinearMean(1).double()
    for module in (points, mean):
        copied = frozen_copy(module)
        assert copied is not module
        for (name, value), (_, original) in zip(copied.state_dict().items(), module.state_dict().items()):
            assert torch.equal(value, original), name
        assert not any(parameter.requires_grad for parameter in copied.parameters())
        assert all(parameter.requires_grad for parameter in module.parameters())  # the original still learns
        for parameter in module.parameters():
            parameter.data.add_(1.0)  # an optimiser step on the original leaves the copy as it was
        assert not any(torch.equal(a, b) for a, b in zip(copied.parameters(), module.parameters()))
    assert frozen_copy(points).variational_owner is None


def test_the_mean_may_change_only_where_the_old_variables_store_their_prior_mean():
    mean = gpytorch.means.ConstantMean().double()
    old_mean = frozen_copy(mean)
    hippo = HiPPOInducingVariables(6, "legs", t=1.0)  # projections of f - m: no stored prior mean
    points = InducingPoints(torch.linspace(0, 1, 4, dtype=DT).unsqueeze(-1))  # f(Z): m_new(Z) is known
    check_mean_unchanged(hippo, old_mean, mean)  # unchanged: fine
    mean.constant.data.fill_(0.5)
    check_mean_unchanged(points, old_mean, mean)
    with pytest.raises(RuntimeError, match="keep the mean fixed after the first task"):
        check_mean_unchanged(hippo, old_mean, mean)


def test_a_task_is_stored_wholly_or_not_at_all():
    assert not is_stored([None, None], "the model")
    assert is_stored([torch.zeros(2), torch.zeros(2, 2)], "the model")
    with pytest.raises(RuntimeError, match="the model: load a complete state_dict"):
        is_stored([torch.zeros(2), None], "the model")


class Holder(torch.nn.Module):
    """A model before its first task: the stored tensor and copy do not exist yet."""

    def __init__(self, template):
        super().__init__()
        self.template = template
        self.stored_precision = None
        self.stored_variables = None


def test_a_fresh_model_gets_the_saved_shapes_to_load_a_stored_task():
    saved = {
        "model.stored_precision": torch.eye(5, dtype=DT),
        "model.stored_variables.points": torch.linspace(0, 1, 5, dtype=DT).unsqueeze(-1),  # M = 5 then, 4 today
    }
    fresh = Holder(InducingPoints(torch.linspace(0, 1, 4, dtype=DT).unsqueeze(-1)))
    allocate_stored(fresh, saved, "model.", ["stored_precision"], {"stored_variables": fresh.template}, marker="stored_precision")
    assert fresh.stored_precision.shape == (5, 5) and fresh.stored_variables.points.shape == (5, 1)
    assert fresh.template.points.shape == (4, 1)  # today's variables keep their own shape
    assert not any(parameter.requires_grad for parameter in fresh.stored_variables.parameters())
    before = Holder(fresh.template)  # nothing saved: nothing allocated
    allocate_stored(before, {}, "model.", ["stored_precision"], {"stored_variables": before.template}, marker="stored_precision")
    assert before.stored_precision is None and before.stored_variables is None
