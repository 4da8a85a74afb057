"""OHSVGP (HiPPO inducing variables + InterdomainVariationalStrategy + OnlineELBO) against OHSGPR's
closed form: with a Gaussian likelihood one natural-gradient step of size 1 reaches the optimum of
the online ELBO, whose optimal q(u) is the collapsed bound's (Bui et al. 2017).  Covers the whole
chain: HiPPO covariances, their cross-covariance across time (advance), the strategy and the
online objective."""

import gpytorch
import torch

from gpytorch_hippo import HiPPOInducingVariables, InterdomainVariationalStrategy, OnlineELBO, OnlineSGPR

DT = torch.float64


def kernel():
    k = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).to(DT)
    k.base_kernel.lengthscale = 0.6
    k.outputscale = 1.2
    return k


def likelihood():
    lik = gpytorch.likelihoods.GaussianLikelihood().to(DT)
    lik.noise = 0.05
    return lik


class OHSVGP(gpytorch.models.ApproximateGP):
    def __init__(self, inducing_variables):
        q = gpytorch.variational.NaturalVariationalDistribution(inducing_variables.num_inducing)
        super().__init__(InterdomainVariationalStrategy(self, inducing_variables, q, whitened=False))
        self.mean_module = gpytorch.means.ZeroMean()
        self.covar_module = kernel()

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def test_ohsvgp_reaches_the_ohsgpr_posterior_over_two_tasks():
    generator = torch.Generator().manual_seed(0)
    x = torch.sort(torch.rand(80, generator=generator, dtype=DT) * 4).values
    y = torch.sin(2 * x) + 0.2 * torch.randn(80, generator=generator, dtype=DT)
    tasks = [(x[x < 2], y[x < 2]), (x[x >= 2], y[x >= 2])]

    closed_form = OnlineSGPR(HiPPOInducingVariables(12, "legs", t=2.0), kernel(), likelihood())
    closed_form.update(*tasks[0])
    closed_form.inducing_variables.advance(4.0)
    closed_form.update(*tasks[1])

    model = OHSVGP(HiPPOInducingVariables(12, "legs", t=2.0)).to(DT).train()
    elbo = OnlineELBO(likelihood(), model, num_data=tasks[0][0].shape[0])
    for index, (xs, ys) in enumerate(tasks):
        if index == 1:
            elbo.end_task(num_data=xs.shape[0])
            model.variational_strategy.advance(4.0)  # carries q(u) forward; refused before end_task
        optimizer = gpytorch.optim.NGD(model.variational_parameters(), num_data=xs.shape[0], lr=1.0)
        for _ in range(2):
            optimizer.zero_grad()
            (-elbo(model(xs), ys)).backward()
            optimizer.step()
    model.eval()
    closed_form.eval()
    grid = torch.linspace(0, 4, 41, dtype=DT)
    with torch.no_grad():
        ours, reference = model(grid), closed_form(grid)
    assert (ours.mean - reference.mean).abs().max() < 1e-9
    assert (ours.covariance_matrix - reference.covariance_matrix).abs().max() < 1e-9
    # and the posterior still fits task 1 after task 2 (long-term memory)
    assert (ours.mean[grid < 2] - torch.sin(2 * grid[grid < 2])).abs().max() < 0.3
