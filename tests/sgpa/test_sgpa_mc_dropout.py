"""MC dropout (thesis ch. 3's baseline), against Monte Carlo over the same dropout masks drawn by hand."""

import pytest
import torch
import torch.nn.functional as F
from classifier_fixtures import _DropoutNet

from gpytorch_sgpa.baselines import dropout_enabled, mc_dropout_predict_proba, predict_proba


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
