"""Online-experiment metrics against closed forms and a calibrated Monte-Carlo reference."""

import math

import pytest
import torch

from gpytorch_hippo.metrics import gaussian_nlpd, interval_ece, rmse


def test_gaussian_nlpd_matches_torch_distribution():
    torch.manual_seed(0)
    mean, y = torch.randn(50, dtype=torch.float64), torch.randn(50, dtype=torch.float64)
    variance = torch.rand(50, dtype=torch.float64) + 0.1
    expected = -torch.distributions.Normal(mean, variance.sqrt()).log_prob(y).mean().item()
    assert gaussian_nlpd(mean, variance, y) == pytest.approx(expected, rel=1e-12)
    assert rmse(mean, y) == pytest.approx(math.sqrt(((mean - y) ** 2).mean().item()), rel=1e-12)


def test_interval_ece_small_when_calibrated_and_large_when_overconfident():
    g = torch.Generator().manual_seed(1)
    y = torch.randn(4000, generator=g, dtype=torch.float64)
    calibrated = torch.randn(100, 4000, generator=g, dtype=torch.float64)
    # with 100 samples the empirical interval is slightly wide/narrow; 4000 points: coverage s.e. < 0.01
    assert interval_ece(calibrated, y) < 0.03
    # samples with sd 0.5 against data with sd 1: central c-interval covers P(|Z| < 0.5 z_c) -- closed form
    overconfident = 0.5 * calibrated
    normal = torch.distributions.Normal(0.0, 1.0)
    expected = (
        sum(abs((2 * normal.cdf(0.5 * normal.icdf(torch.tensor((1 + c) / 2))) - 1).item() - c) for c in [0.05 + 0.1 * k for k in range(10)])
        / 10
    )
    assert interval_ece(overconfident, y) == pytest.approx(expected, abs=0.03)


def test_shape_errors_name_the_problem():
    with pytest.raises(ValueError, match="shapes must match"):
        rmse(torch.zeros(3), torch.zeros(4))
    with pytest.raises(ValueError, match="samples must be"):
        interval_ece(torch.zeros(3), torch.zeros(3))
