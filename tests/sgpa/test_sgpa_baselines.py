"""Calibration baselines of thesis ch. 3: temperature scaling, MC dropout, ensembles."""

import math

import pytest
import torch
import torch.nn.functional as F

from gpytorch_sgpa.baselines import (
    EnsembleClassifier,
    TemperatureScaling,
    dropout_enabled,
    mc_dropout_predict_proba,
    predict_proba,
)


def _overconfident_logits(n=2000, c=5, seed=0, factor=3.0):
    gen = torch.Generator().manual_seed(seed)
    true_logits = torch.randn(n, c, generator=gen, dtype=torch.float64)
    labels = torch.multinomial(true_logits.softmax(-1), 1, generator=gen).squeeze(-1)
    return factor * true_logits, labels


def test_temperature_scaling_matches_grid_search():
    logits, labels = _overconfident_logits(n=1000)
    scaler = TemperatureScaling().fit(logits, labels)
    grid = torch.linspace(math.log(0.5), math.log(10.0), 2001, dtype=torch.float64)
    scaled = logits[None] / grid.exp()[:, None, None]
    grid_nll = -scaled.log_softmax(-1).gather(-1, labels.expand(len(grid), -1)[..., None]).squeeze(-1).mean(-1)
    best = grid[grid_nll.argmin()].exp()
    assert scaler.temperature == pytest.approx(float(best), rel=3e-3)
    fitted_nll = F.cross_entropy(scaler(logits).detach(), labels)
    assert float(fitted_nll) <= float(grid_nll.min()) + 1e-9
    # The data were generated from logits / 3, so the fitted temperature is close to 3.
    assert 2.5 < scaler.temperature < 3.5
    assert torch.allclose(scaler.predict_proba(logits), (logits / scaler.temperature).softmax(-1))


def test_temperature_scaling_bad_input():
    logits, labels = _overconfident_logits(n=10)
    with pytest.raises(ValueError, match="labels"):
        TemperatureScaling().fit(logits, labels[:5])
    with pytest.raises(ValueError, match="logits"):
        TemperatureScaling().fit(logits[:, :1], labels)
    with pytest.raises(ValueError, match="max_iter"):
        TemperatureScaling().fit(logits, labels, max_iter=0)


class _DropoutNet(torch.nn.Module):
    def __init__(self, p=0.5):
        super().__init__()
        self.hidden = torch.nn.Linear(4, 16)
        self.dropout = torch.nn.Dropout(p)
        self.out = torch.nn.Linear(16, 3)

    def forward(self, x):
        return self.out(self.dropout(torch.relu(self.hidden(x)))), torch.zeros(())


def test_mc_dropout_equals_manual_monte_carlo_with_same_seed():
    torch.manual_seed(0)
    model = _DropoutNet()
    x = torch.randn(6, 4)
    torch.manual_seed(123)
    got = mc_dropout_predict_proba(model, x, num_samples=7)
    torch.manual_seed(123)
    hidden = torch.relu(model.hidden(x))
    manual = torch.stack([model.out(F.dropout(hidden, 0.5, training=True)).softmax(-1) for _ in range(7)]).mean(0)
    assert torch.allclose(got, manual, atol=1e-6)
    # Distinct samples: the MC average differs from the deterministic prediction.
    assert not torch.allclose(got, predict_proba(model, x), atol=1e-4)


def test_dropout_enabled_restores_modes_and_rejects_models_without_dropout():
    model = _DropoutNet().train()
    with dropout_enabled(model):
        assert model.dropout.training and not model.hidden.training
    assert all(m.training for m in model.modules())
    with pytest.raises(ValueError, match="dropout"):
        mc_dropout_predict_proba(_DropoutNet(p=0.0), torch.randn(2, 4))
    with pytest.raises(ValueError, match="num_samples"):
        mc_dropout_predict_proba(model, torch.randn(2, 4), num_samples=0)


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


def test_predict_proba_restores_training_mode():
    model = _DropoutNet().train()
    probs = predict_proba(model, torch.randn(3, 4), num_samples=2)
    assert model.training
    assert torch.allclose(probs.sum(-1), torch.ones(3))


def test_mc_dropout_samples_pytorch_transformer_layers():
    """nn.TransformerEncoderLayer's eval-mode fast path skips its dropout: MC dropout must still sample
    (before, every pass of an nn.TransformerEncoder classifier returned the deterministic prediction)."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.2, batch_first=True)
    encoder = torch.nn.TransformerEncoder(layer, 2).eval()
    x = torch.randn(3, 5, 16)
    with torch.no_grad():
        deterministic = encoder(x)
        with dropout_enabled(encoder):
            first, second = encoder(x), encoder(x)
    assert not torch.allclose(first, second) and not torch.allclose(first, deterministic)
    assert not encoder.training and not encoder.layers[0].training and not encoder.layers[0].self_attn.training
