"""NegativeBinomialLikelihood against scipy's pmf and a Monte-Carlo expected log-likelihood."""

import gpytorch
import numpy as np
import pytest
import torch
from scipy import stats

from gpytorch_hippo.likelihoods import NegativeBinomialLikelihood

DT = torch.float64


def test_log_prob_matches_scipy_nbinom():
    likelihood = NegativeBinomialLikelihood().to(DT)
    likelihood.dispersion = 2.5
    f = torch.tensor([-1.0, 0.0, 0.7, 2.0, 3.5], dtype=DT)
    y = torch.tensor([0.0, 1.0, 4.0, 7.0, 40.0], dtype=DT)
    dist = likelihood(f)
    mu = np.exp(f.numpy())
    expected = stats.nbinom.logpmf(y.numpy(), 2.5, 2.5 / (2.5 + mu))
    np.testing.assert_allclose(dist.log_prob(y).detach().numpy(), expected, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(dist.mean.detach().numpy(), mu, rtol=1e-12)
    np.testing.assert_allclose(dist.variance.detach().numpy(), mu + mu**2 / 2.5, rtol=1e-12)


def test_expected_log_prob_matches_monte_carlo():
    likelihood = NegativeBinomialLikelihood().to(DT)
    likelihood.dispersion = 1.7
    mean = torch.tensor([-0.5, 0.8, 2.0], dtype=DT)
    var = torch.tensor([0.3, 0.1, 0.5], dtype=DT)
    y = torch.tensor([0.0, 3.0, 12.0], dtype=DT)
    q = gpytorch.distributions.MultivariateNormal(mean, torch.diag(var))
    quad = likelihood.expected_log_prob(y, q)
    g = torch.Generator().manual_seed(0)
    samples = mean + var.sqrt() * torch.randn(200_000, 3, generator=g, dtype=DT)
    log_probs = likelihood(samples).log_prob(y)
    mc, se = log_probs.mean(0), log_probs.std(0) / np.sqrt(len(samples))
    assert ((quad - mc).abs() < 4 * se + 1e-4).all(), (quad, mc, se)


def test_dispersion_is_positive_learnable_and_validated():
    likelihood = NegativeBinomialLikelihood().to(DT)
    assert [n for n, _ in likelihood.named_parameters()] == ["raw_dispersion"]
    likelihood.raw_dispersion.data.fill_(-30.0)
    assert likelihood.dispersion.item() > 0
    with pytest.raises(ValueError, match="dispersion must be positive"):
        likelihood.dispersion = -1.0
    # maximum likelihood on over-dispersed counts recovers the dispersion
    true = torch.distributions.NegativeBinomial(total_count=torch.tensor(3.0, dtype=DT), logits=torch.tensor(np.log(5.0 / 3.0), dtype=DT))
    torch.manual_seed(1)
    y = true.sample((1500,))
    likelihood.dispersion = 1.0
    f = torch.full((1500,), np.log(5.0), dtype=DT)
    optimizer = torch.optim.Adam(likelihood.parameters(), lr=0.2)
    for _ in range(60):
        optimizer.zero_grad()
        (-likelihood(f).log_prob(y).mean()).backward()
        optimizer.step()
    assert abs(likelihood.dispersion.item() - 3.0) < 0.6
    q = gpytorch.distributions.MultivariateNormal(torch.zeros(2, dtype=DT), torch.eye(2, dtype=DT))
    with pytest.raises(ValueError, match="observations contains NaN"):
        likelihood.expected_log_prob(torch.tensor([1.0, float("nan")], dtype=DT), q)
    with pytest.raises(ValueError, match="non-negative integer"):
        likelihood.expected_log_prob(torch.tensor([1.5, 2.0], dtype=DT), q)
