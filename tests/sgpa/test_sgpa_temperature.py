"""Temperature scaling (thesis ch. 3's calibration baseline), against a grid search of the NLL."""

import math

import pytest
import torch
import torch.nn.functional as F

from gpytorch_sgpa.baselines import TemperatureScaling


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
