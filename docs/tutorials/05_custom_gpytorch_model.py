# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 5. Your own GPyTorch model with `InterdomainVariationalStrategy`
#
# `InterdomainVariationalStrategy(model, inducing_variables, variational_distribution)` is a
# GPyTorch variational strategy: it goes wherever `gpytorch.variational.VariationalStrategy` goes,
# with any `InducingVariables` object in place of a tensor of inducing points. This notebook
#
# 1. shows that with `InducingPoints` it *is* GPyTorch's `VariationalStrategy` (same numbers),
# 2. swaps in HiPPO inducing variables without touching the rest of the model,
# 3. wraps it in GPyTorch's `LMCVariationalStrategy` for two correlated outputs (daily global
#    horizontal and direct normal irradiance from pvlib's TMY3 file).

# %%
import os

import gpytorch
import matplotlib.pyplot as plt
import pvlib
import torch

from gpytorch_hippo import HiPPOInducingVariables, InducingPoints, InterdomainVariationalStrategy
from gpytorch_hippo.data import load_solar_ghi

SMALL = os.environ.get("PROBSEQ_TUTORIAL_SIZE") == "small"
torch.set_num_threads(1)
STEPS = 60 if SMALL else 300
DT = torch.float64
times, ghi = load_solar_ghi("daily")
tmy3 = os.path.join(os.path.dirname(pvlib.__file__), "data", "723170TYA.CSV")
frame, _ = pvlib.iotools.read_tmy3(tmy3, map_variables=True)
dni = torch.tensor(frame["dni"].to_numpy(dtype=float), dtype=DT).reshape(365, 24).mean(1)
Y = torch.stack([ghi, dni], -1)
Y = (Y - Y.mean(0)) / Y.std(0)
x = times.unsqueeze(-1)

# %% [markdown]
# ## A model written once, inducing variables passed in


# %%
class SVGP(gpytorch.models.ApproximateGP):
    def __init__(self, strategy_factory, num_inducing):
        distribution = gpytorch.variational.CholeskyVariationalDistribution(num_inducing)
        super().__init__(strategy_factory(self, distribution))
        self.mean_module = gpytorch.means.ZeroMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())
        self.covar_module.base_kernel.lengthscale = 10.0

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


z = torch.linspace(0, 364, 30, dtype=DT).unsqueeze(-1)
ours = SVGP(lambda m, q: InterdomainVariationalStrategy(m, InducingPoints(z), q), 30).to(DT)
theirs = SVGP(lambda m, q: gpytorch.variational.VariationalStrategy(m, z, q), 30).to(DT)
g = torch.Generator().manual_seed(0)
q_mean = torch.randn(30, generator=g, dtype=DT)
q_chol = 0.3 * torch.randn(30, 30, generator=g, dtype=DT).tril() + 0.5 * torch.eye(30, dtype=DT)
for model in (ours, theirs):  # the same (whitened) q(u) in both
    strategy = model.variational_strategy
    strategy._variational_distribution.variational_mean.data.copy_(q_mean)
    strategy._variational_distribution.chol_variational_covar.data.copy_(q_chol)
    strategy.variational_params_initialized.fill_(1)
ours.eval(), theirs.eval()
with torch.no_grad():
    difference = (ours(x).mean - theirs(x).mean).abs().max().item()
print(f"largest difference between the two strategies' predictive means: {difference:.1e}")
assert difference < 1e-8

# %% [markdown]
# ## Swap in HiPPO inducing variables and train as usual
# `VariationalELBO`, `Adam`, `likelihood(model(x))`: nothing else changes.


# %%
def train(model, likelihood, x, y, steps):
    elbo = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=y.shape[0])
    optimizer = torch.optim.Adam(list(model.parameters()) + list(likelihood.parameters()), lr=0.05)
    model.train(), likelihood.train()
    for _ in range(steps):
        optimizer.zero_grad()
        (-elbo(model(x), y)).backward()
        optimizer.step()
    model.eval(), likelihood.eval()


hippo = SVGP(lambda m, q: InterdomainVariationalStrategy(m, HiPPOInducingVariables(30, "legs", t=365.0), q), 30).to(DT)
likelihood = gpytorch.likelihoods.GaussianLikelihood().to(DT)
train(hippo, likelihood, x, Y[:, 0], STEPS)
with torch.no_grad():
    predictive = likelihood(hippo(x))
rmse = (predictive.mean - Y[:, 0]).pow(2).mean().sqrt().item()
print(f"HiPPO SVGP, 30 inducing variables: RMSE {rmse:.3f} (standardised GHI)")
assert rmse < 0.9

# %% [markdown]
# ## Two outputs: HiPPO inducing variables inside `LMCVariationalStrategy`
# Two latent GPs (a batch of two kernels) mixed into two outputs. The HiPPO variables are shared
# by the latents; each latent gets its own `q(u)` through the batch shape.


# %%
class LMCModel(gpytorch.models.ApproximateGP):
    def __init__(self, num_inducing=30, num_latents=2, num_tasks=2):
        batch = torch.Size([num_latents])
        distribution = gpytorch.variational.CholeskyVariationalDistribution(num_inducing, batch_shape=batch)
        base = InterdomainVariationalStrategy(self, HiPPOInducingVariables(num_inducing, "legs", t=365.0), distribution)
        super().__init__(gpytorch.variational.LMCVariationalStrategy(base, num_tasks=num_tasks, num_latents=num_latents, latent_dim=-1))
        self.mean_module = gpytorch.means.ZeroMean(batch_shape=batch)
        self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(batch_shape=batch), batch_shape=batch)
        self.covar_module.base_kernel.lengthscale = 10.0

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


lmc = LMCModel().to(DT)
multitask_likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=2).to(DT)
train(lmc, multitask_likelihood, x, Y, STEPS)
with torch.no_grad():
    predictive = multitask_likelihood(lmc(x))
    mean, sd = predictive.mean, predictive.variance.sqrt()
fig, axes = plt.subplots(2, 1, figsize=(9, 5), sharex=True)
for k, name in enumerate(("GHI", "DNI")):
    axes[k].plot(times, Y[:, k], "k.", ms=2)
    axes[k].plot(times, mean[:, k])
    axes[k].fill_between(times, mean[:, k] - 2 * sd[:, k], mean[:, k] + 2 * sd[:, k], alpha=0.3)
    axes[k].set_ylabel(f"{name} (standardised)")
axes[1].set_xlabel("day")
fig.suptitle("LMC with HiPPO inducing variables: two outputs, two latent GPs")
plt.show()
rmse = (mean - Y).pow(2).mean(0).sqrt()
print("RMSE per output:", rmse.tolist())
assert (rmse < 1.0).all()
