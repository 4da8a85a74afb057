"""EWC (Kirkpatrick et al. 2017): penalty zero at the anchor, the closed-form quadratic away from
it, and the empirical Fisher diagonal against per-sample gradients written out by hand and against
the true Fisher of a linear-Gaussian model (Monte Carlo)."""

import pytest
import torch

from gpytorch_hippo.gpvae import ElasticWeightConsolidation, fisher_diagonal

DT = torch.float64


SIGMA = 0.5


def linear_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Linear(3, 1).to(DT)


def sample_log_likelihoods(model, x, y):
    for xn, yn in zip(x, y):
        residual = yn - model(xn).squeeze()
        yield -0.5 * residual**2 / SIGMA**2


def data(model, n, seed=1):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=generator, dtype=DT) * torch.tensor([1.0, 2.0, 0.5], dtype=DT)
    with torch.no_grad():
        y = model(x).squeeze(-1) + SIGMA * torch.randn(n, generator=generator, dtype=DT)
    return x, y


def test_fisher_diagonal_equals_the_sum_of_squared_per_sample_scores():
    model = linear_model()
    x, y = data(model, 50)
    with torch.no_grad():
        model.weight.add_(0.1)  # away from the data-generating parameters: scores are not tiny
    fisher_w, fisher_b = fisher_diagonal([model.weight, model.bias], sample_log_likelihoods(model, x, y))
    with torch.no_grad():
        residual = y - model(x).squeeze(-1)
    score_w = residual.unsqueeze(-1) * x / SIGMA**2  # d log p / dw for each sample, by hand
    score_b = residual / SIGMA**2
    assert torch.allclose(fisher_w.squeeze(0), score_w.square().sum(0), rtol=1e-12)
    assert torch.allclose(fisher_b, score_b.square().sum(0, keepdim=True), rtol=1e-12)


def test_fisher_diagonal_estimates_the_true_fisher_information():
    """At the data-generating parameters E[score^2] = E[x_j^2] / σ² per sample (x_j's variances
    1, 4, 0.25 here) and 1/σ² for the bias. With Gaussian residual r and input x the score² r²x²/σ⁴
    has relative variance E[r⁴]E[x⁴]/(E[r²]E[x²])² - 1 = 8, so 4000 samples give a relative standard
    error of sqrt(8/4000) ≈ 4.5% (2.2% for the bias); the 12% tolerance is 2.7 of them (fixed seed)."""
    model = linear_model()
    n = 4000
    x, y = data(model, n)
    fisher_w, fisher_b = fisher_diagonal([model.weight, model.bias], sample_log_likelihoods(model, x, y))
    expected_w = torch.tensor([1.0, 4.0, 0.25], dtype=DT) / SIGMA**2
    assert torch.allclose(fisher_w.squeeze(0) / n, expected_w, rtol=0.12)
    assert fisher_b.item() / n == pytest.approx(1 / SIGMA**2, rel=0.12)


def test_penalty_is_zero_at_the_anchor_and_the_weighted_quadratic_away_from_it():
    model = linear_model()
    ewc = ElasticWeightConsolidation([model], strength=3.0)
    assert ewc.penalty().item() == 0.0  # nothing consolidated yet
    x, y = data(model, 20)
    fisher = fisher_diagonal(list(model.parameters()), sample_log_likelihoods(model, x, y))
    ewc.consolidate(fisher)
    penalty = ewc.penalty()
    assert penalty.item() == 0.0
    (gradient,) = torch.autograd.grad(penalty, [model.weight])
    assert torch.equal(gradient, torch.zeros_like(gradient))
    anchor = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        model.weight.add_(torch.tensor([[0.3, -0.2, 0.1]], dtype=DT))
        model.bias.sub_(0.4)
    expected = 0.5 * 3.0 * sum((f * (p.detach() - a) ** 2).sum() for f, p, a in zip(fisher, model.parameters(), anchor))
    assert ewc.penalty().item() == pytest.approx(expected.item(), rel=1e-12)
    assert ewc.penalty().item() > 0


def test_consolidate_sums_fishers_and_moves_the_anchor():
    model = linear_model()
    ewc = ElasticWeightConsolidation([model], strength=1.0)
    first = [torch.full_like(p, 2.0) for p in model.parameters()]
    ewc.consolidate(first)
    with torch.no_grad():
        model.bias.add_(1.0)
    second = [torch.full_like(p, 0.5) for p in model.parameters()]
    ewc.consolidate(second)
    assert all(torch.equal(f, torch.full_like(f, 2.5)) for f in ewc.fisher)
    assert all(torch.equal(a, p.detach()) for a, p in zip(ewc.anchors, model.parameters()))
    assert ewc.num_consolidated.item() == 2
    # the state (anchors, Fisher) travels with state_dict
    other = linear_model(seed=5)
    reloaded = ElasticWeightConsolidation([other], strength=1.0)
    reloaded.load_state_dict(ewc.state_dict())
    with torch.no_grad():
        other.bias.add_(3.0)
    expected = 0.5 * sum((f * (p.detach() - a) ** 2).sum() for f, p, a in zip(ewc.fisher, other.parameters(), ewc.anchors))
    assert reloaded.penalty().item() == pytest.approx(expected.item(), rel=1e-12)


def test_bad_input_names_the_argument():
    model = linear_model()
    with pytest.raises(ValueError, match="strength"):
        ElasticWeightConsolidation([model], strength=-1.0)
    with pytest.raises(ValueError, match="modules"):
        ElasticWeightConsolidation([torch.nn.ReLU()])
    ewc = ElasticWeightConsolidation([model])
    with pytest.raises(ValueError, match="task_fisher"):
        ewc.consolidate([torch.ones(3)])
    with pytest.raises(ValueError, match="non-negative"):
        ewc.consolidate([-torch.ones_like(p) for p in model.parameters()])
    with pytest.raises(ValueError, match="at least one sample"):
        fisher_diagonal(list(model.parameters()), [])
    with pytest.raises(ValueError, match="scalar"):
        fisher_diagonal(list(model.parameters()), [model(torch.ones(2, 3, dtype=DT)).squeeze()])
