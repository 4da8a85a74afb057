"""Deep ensembles (thesis ch. 3's baseline): the mean of the members' probabilities, computed one by one."""

import pytest
import torch
from classifier_fixtures import _classifier, _DropoutNet

from gpytorch_sgpa.baselines import EnsembleClassifier, predict_proba


def test_ensemble_averages_member_probabilities():
    torch.manual_seed(1)
    members = [_DropoutNet(p=0.1) for _ in range(3)]
    x = torch.randn(5, 4)
    ensemble = EnsembleClassifier(members)
    expected = torch.stack([m.eval()(x)[0].softmax(-1) for m in members]).mean(0)
    assert torch.allclose(ensemble.predict_proba(x), expected, atol=1e-6)
    assert torch.allclose(predict_proba(ensemble, x), expected, atol=1e-6)
    with pytest.raises(ValueError, match="members"):
        EnsembleClassifier([])


def test_ensemble_uses_member_predict_proba_with_samples():
    class Stochastic(torch.nn.Module):
        def __init__(self, value):
            super().__init__()
            self.value = value
            self.calls = []

        def predict_proba(self, x, num_samples=10):
            self.calls.append(num_samples)
            return torch.full((x.shape[0], 2), 0.5) + torch.tensor([self.value, -self.value])

    members = [Stochastic(0.1), Stochastic(0.3)]
    probs = EnsembleClassifier(members).predict_proba(torch.zeros(3, 1), num_samples=4)
    assert torch.allclose(probs, torch.tensor([0.7, 0.3]).expand(3, 2))
    assert [m.calls for m in members] == [[4], [4]]


def test_deep_ensemble_equals_the_mean_of_the_members_softmax_computed_one_by_one():
    members = [_classifier(seed) for seed in range(5)]
    for member in members:
        member.train()  # left in training mode: the ensemble must predict with dropout off
    inputs = torch.randn(7, 4)
    with torch.no_grad():
        expected = torch.stack([member.eval()(inputs).softmax(-1) for member in members]).mean(0)
    for member in members:
        member.train()
    ensemble = EnsembleClassifier(members)
    probs = ensemble.predict_proba(inputs)
    torch.testing.assert_close(probs, expected, rtol=0, atol=1e-7)
    torch.testing.assert_close(ensemble.predict_proba(inputs), probs, rtol=0, atol=0)  # deterministic
    torch.testing.assert_close(predict_proba(ensemble, inputs), expected, rtol=0, atol=1e-7)
    torch.testing.assert_close(probs.sum(-1), torch.ones(7))
    assert all(member.training for member in members)  # modes restored
    assert not torch.allclose(probs, members[0].eval()(inputs).softmax(-1).detach(), atol=1e-3)
