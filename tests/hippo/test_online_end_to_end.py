"""OHSVGP with a NegativeBinomialLikelihood through two tasks (vs a Monte-Carlo estimate of the
expected log-likelihood, with the negative binomial pmf written out here), and OnlineSGPR in
float32 vs float64 (same jitter in both, so that only float32 arithmetic differs)."""

import math

import gpytorch
import pytest
import torch

from gpytorch_hippo import (
    HiPPOInducingVariables,
    InducingPoints,
    InterdomainVariationalStrategy,
    NegativeBinomialLikelihood,
    OnlineELBO,
    OnlineSGPR,
)

DT = torch.float64


def negative_binomial_log_pmf(y, f, r):
    """log p(y | f) with mean e^f and dispersion r: Γ(y+r)/(Γ(r) y!) (r/(r+μ))^r (μ/(r+μ))^y."""
    log_mu = f
    log_r_plus_mu = torch.logaddexp(torch.full_like(f, math.log(r)), f)
    return torch.lgamma(y + r) - math.lgamma(r) - torch.lgamma(y + 1) + r * (math.log(r) - log_r_plus_mu) + y * (log_mu - log_r_plus_mu)


class CountGP(gpytorch.models.ApproximateGP):
    def __init__(self):
        inducing_variables = HiPPOInducingVariables(8, "legs", t=2.0)
        q = gpytorch.variational.CholeskyVariationalDistribution(8)
        super().__init__(InterdomainVariationalStrategy(self, inducing_variables, q))
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def test_negative_binomial_ohsvgp_elbo_matches_monte_carlo():
    g = torch.Generator().manual_seed(0)
    x = torch.sort(4 * torch.rand(60, generator=g, dtype=DT)).values
    rate = torch.exp(1.5 + torch.sin(2 * x))
    y = torch.distributions.NegativeBinomial(total_count=torch.tensor(5.0, dtype=DT), logits=rate.log() - math.log(5.0)).sample()
    tasks = [(x[x < 2], y[x < 2]), (x[x >= 2], y[x >= 2])]
    torch.manual_seed(1)
    model = CountGP().to(DT)
    model.mean_module.constant.data.fill_(1.5)
    model.covar_module.base_kernel.lengthscale = torch.tensor(0.8, dtype=DT)
    model.mean_module.requires_grad_(False)  # interdomain variables project f - m: keep m fixed across tasks
    model.covar_module.requires_grad_(False)  # (fixed kernel: keeps the test fast; q(u) and r are trained)
    likelihood = NegativeBinomialLikelihood().to(DT)
    likelihood.dispersion = torch.tensor(5.0, dtype=DT)
    elbo = OnlineELBO(likelihood, model, num_data=len(tasks[0][1]))
    for index, (xs, ys) in enumerate(tasks):
        if index == 1:
            elbo.end_task(num_data=len(ys))
            model.variational_strategy.advance(4.0)
        optimizer = torch.optim.Adam(list(model.parameters()) + list(likelihood.parameters()), lr=0.1)
        for _ in range(4):
            optimizer.zero_grad()
            (-elbo(model(xs), ys)).backward()
            optimizer.step()
    xs, ys = tasks[1]
    with torch.no_grad():
        value = elbo(model(xs), ys).item() * len(ys)
        online_kl = elbo.online_kl_divergence().item()
        q_f = model(xs)
        r = likelihood.dispersion.item()
        samples = q_f.mean + q_f.stddev * torch.randn(20000, len(ys), generator=g, dtype=DT)
        log_pmf = negative_binomial_log_pmf(ys, samples, r)
    ell, standard_error = log_pmf.mean(0).sum().item(), math.sqrt((log_pmf.var(0) / samples.shape[0]).sum().item())
    assert abs(online_kl) > 1.0  # the old task contributes
    # 5 Monte-Carlo standard errors (~0.1 nats here); GPyTorch's 20-node Gauss-Hermite rule is far more accurate
    assert abs(value - (ell - online_kl)) < 5 * standard_error
    assert abs(value - (ell - 0.0)) > 5 * standard_error  # an ELBO without the online term would fail


@pytest.mark.parametrize("kind", ["points", "hippo"])
def test_online_sgpr_float32_matches_float64(kind):
    """Two tasks, hyperparameters and inducing variables changing. The jitter is 1e-4 in both dtypes
    (the default policy differs per dtype; its accuracy is tested with the policy itself), so the
    difference is float32 round-off: eps 6e-8 times cond(K_uu + jitter) <~ 1e4 at worst, measured
    <= 3e-5 on means and 1.5e-5 relative on bounds."""
    g = torch.Generator().manual_seed(0)
    x = torch.sort(4 * torch.rand(80, generator=g, dtype=DT)).values
    y = torch.sin(2.5 * x) + 0.2 * torch.randn(80, generator=g, dtype=DT)
    xs = torch.linspace(0, 4, 41, dtype=DT)
    results = []
    for dtype in (torch.float32, torch.float64):
        if kind == "points":
            inducing_variables = InducingPoints(torch.linspace(0, 2, 8), learn=False, jitter=1e-4)
        else:
            inducing_variables = HiPPOInducingVariables(12, "legs", t=2.0, jitter=1e-4)
        kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())
        likelihood = gpytorch.likelihoods.GaussianLikelihood()
        model = OnlineSGPR(inducing_variables, kernel, likelihood).to(dtype)
        kernel.base_kernel.lengthscale, kernel.outputscale, likelihood.noise = 0.7, 1.3, 0.05
        bounds = [model.update(x[x < 2].to(dtype), y[x < 2].to(dtype))]
        kernel.base_kernel.lengthscale, kernel.outputscale, likelihood.noise = 0.5, 0.9, 0.08
        if kind == "points":
            model.inducing_variables = InducingPoints(torch.linspace(1.5, 4, 8), learn=False, jitter=1e-4).to(dtype)
        else:
            model.inducing_variables.advance(4.0)
        bounds.append(model.update(x[x >= 2].to(dtype), y[x >= 2].to(dtype)))
        with torch.no_grad():
            prediction = model(xs.to(dtype))
        assert prediction.mean.dtype == dtype and bounds[-1].dtype == dtype
        results.append((torch.stack(bounds).double(), prediction.mean.double(), prediction.variance.double()))
    (bounds32, mean32, var32), (bounds64, mean64, var64) = results
    assert ((bounds32 - bounds64).abs() / (1 + bounds64.abs())).max() < 1e-4
    assert (mean32 - mean64).abs().max() < 2e-4
    assert (var32 - var64).abs().max() < 2e-5
