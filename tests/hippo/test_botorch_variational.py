"""OnlineVariationalGPModel (OSVGP / OHSVGP in BoTorch's model API) against BoTorch's
SingleTaskVariationalGP refitted on all the data, with the same inducing points and hyperparameters."""

import gpytorch
import pytest
import torch
from botorch.models import SingleTaskVariationalGP

from gpytorch_hippo import HiPPOInducingVariables, InducingPoints, NegativeBinomialLikelihood
from gpytorch_hippo.botorch import OnlineVariationalGPModel

DOUBLE = torch.float64


def kernel():
    k = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).to(DOUBLE)
    k.base_kernel.lengthscale, k.outputscale = 0.3, 4.0
    return k.requires_grad_(False)


def batches():
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(3, 40, 1, generator=generator, dtype=DOUBLE)
    y = torch.bernoulli(torch.sigmoid(4 * torch.sin(6 * x)), generator=generator)
    return x, y


def test_online_bernoulli_surrogate_matches_a_refitted_single_task_variational_gp():
    """Three batches absorbed online against one fit on all 120 points: the latent means agree to 3 % of
    their range (measured 0.7 %: online VI approximates old batches by q_old(u)/p(u), so not to
    round-off), the decisions (signs) agree where the reference is confident, the variances to 25 %."""
    x, y = batches()
    Z = torch.linspace(0, 1, 15, dtype=DOUBLE).unsqueeze(-1)
    model = OnlineVariationalGPModel(
        x[0],
        y[0],
        InducingPoints(Z, learn=False),
        gpytorch.likelihoods.BernoulliLikelihood(),
        covar_module=kernel(),
        num_steps=300,
        lr=0.05,
        fit_hyperparameters=False,
    )
    for k in (1, 2):
        model = model.observe(x[k], y[k])
    reference = SingleTaskVariationalGP(
        x.reshape(-1, 1),
        y.reshape(-1, 1),
        likelihood=gpytorch.likelihoods.BernoulliLikelihood(),
        covar_module=kernel(),
        inducing_points=Z,
        learn_inducing_points=False,
    ).to(DOUBLE)
    reference.model.mean_module = gpytorch.means.ZeroMean()
    elbo = gpytorch.mlls.VariationalELBO(reference.likelihood, reference.model, num_data=120)
    optimizer = torch.optim.Adam(reference.model.variational_parameters(), lr=0.05)
    reference.train()
    for _ in range(900):
        optimizer.zero_grad()
        (-elbo(reference.model(x.reshape(-1, 1)), y.reshape(-1))).backward()
        optimizer.step()
    reference.eval()
    test = torch.linspace(0.05, 0.95, 30, dtype=DOUBLE).unsqueeze(-1)
    with torch.no_grad():
        ours, theirs = model.posterior(test), reference.posterior(test)
    assert (ours.mean - theirs.mean).abs().max() < 0.03 * theirs.mean.abs().max()
    assert ((ours.variance - theirs.variance).abs() / theirs.variance).max() < 0.25  # measured up to 16 %
    confident = theirs.mean.abs() > 0.5
    assert torch.equal(torch.sign(ours.mean[confident]), torch.sign(theirs.mean[confident]))
    assert (ours.variance > 0).all() and (ours.variance <= 4.0 + 1e-6).all()


def test_count_stream_with_hippo_variables_and_the_botorch_contract():
    generator = torch.Generator().manual_seed(1)
    t = torch.arange(60, dtype=DOUBLE).unsqueeze(-1)
    counts = torch.poisson(torch.exp(1.5 + torch.sin(t / 8)), generator=generator)
    model = OnlineVariationalGPModel(
        t[:20], counts[:20], HiPPOInducingVariables(12, "legs", t=19.0), NegativeBinomialLikelihood(), num_steps=100
    )
    for k in (1, 2):
        model = model.observe(t[20 * k : 20 * (k + 1)], counts[20 * k : 20 * (k + 1)])
    assert model.gp.variational_strategy.inducing_variables.t == pytest.approx(59.0)
    with torch.no_grad():
        posterior = model.posterior(t.unsqueeze(0))
    assert posterior.mean.shape == (1, 60, 1) and torch.isfinite(posterior.mean).all()
    # the latent mean follows log-intensity 1.5 + sin(t / 8) on the data it has seen
    assert (posterior.mean[0, :, 0] - (1.5 + torch.sin(t[:, 0] / 8))).abs().mean() < 0.4
    with pytest.raises(ValueError, match="observation_noise"):
        model.posterior(t, observation_noise=True)
    with pytest.raises(ValueError, match="Y must have shape"):
        model.observe(t[:5], counts[:4])
