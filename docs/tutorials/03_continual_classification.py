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
# # 3. Continual classification with input ordering (two moons, OHSVGP)
#
# For inputs in more than one dimension, HiPPO inducing variables need a *time*: thesis §4.4
# orders each task's inputs into a path and places them at times `Δt, 2Δt, ...`, continuing across
# tasks. The inducing variables project `f` along that path, and their random-feature memory
# keeps earlier tasks without storing their inputs. The order matters:
#
# * **k-max**: start next to the previous task's last input, then always go to the most similar
#   (largest kernel value) remaining input: a smooth path;
# * **k-min**: always go to the *least* similar input: a path that jumps around.
#
# We learn the two-moons classes in three tasks (split along the first coordinate) with OHSVGP:
# a GPyTorch `ApproximateGP` with `InterdomainVariationalStrategy`, trained on the online ELBO
# (`OnlineELBO`) with a Bernoulli likelihood.

# %%
import os

import gpytorch
import matplotlib.pyplot as plt
import torch
from sklearn.datasets import make_moons

from gpytorch_hippo import HiPPOInducingVariables, InterdomainVariationalStrategy, OnlineELBO, order_inputs

SMALL = os.environ.get("PROBSEQ_TUTORIAL_SIZE") == "small"
torch.set_num_threads(1)  # many small operations: one thread is fastest
STEPS = 60 if SMALL else 200
DT = torch.float64


def moons_tasks(n, seed):
    x, y = make_moons(n_samples=n, noise=0.1, random_state=seed)
    x, y = torch.as_tensor(x, dtype=DT), torch.as_tensor(y, dtype=DT)
    task = torch.bucketize(x[:, 0].contiguous(), torch.tensor([0.0, 1.0], dtype=DT))
    return [(x[task == j], y[task == j]) for j in range(3)]


train, test = moons_tasks(240, seed=0), moons_tasks(600, seed=1)


class HiPPOClassifier(gpytorch.models.ApproximateGP):
    def __init__(self, num_inducing=20):
        inducing = HiPPOInducingVariables(num_inducing, "legs", input_dim=2, num_rff=500)
        distribution = gpytorch.variational.CholeskyVariationalDistribution(num_inducing)
        super().__init__(InterdomainVariationalStrategy(self, inducing, distribution))
        self.mean_module = gpytorch.means.ZeroMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2))
        self.covar_module.base_kernel.lengthscale = 0.5

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


# %% [markdown]
# ## One task at a time
# Per task: order the inputs, extend the path (`append_path` carries `q(u)` forward), maximise the
# online ELBO, then `end_task()` stores `q(u)` as the prior knowledge for the next task. The kernel
# is trained on task 1 only.

# %%
grid_x, grid_y = torch.meshgrid(torch.linspace(-1.5, 2.5, 60, dtype=DT), torch.linspace(-1.0, 1.5, 40, dtype=DT), indexing="xy")
grid = torch.stack([grid_x.ravel(), grid_y.ravel()], -1)


def run(criterion):
    torch.manual_seed(0)
    model, likelihood = HiPPOClassifier().to(DT), gpytorch.likelihoods.BernoulliLikelihood()
    elbo = OnlineELBO(likelihood, model, num_data=len(train[0][1]))
    last, maps, accuracies = None, [], []
    for index, (x, y) in enumerate(train):
        order = order_inputs(x, criterion, kernel=model.covar_module, start=last)
        x, y = x[order], y[order]
        last = x[-1]
        model.variational_strategy.append_path(x)
        elbo.num_data = len(y)
        if index > 0:
            model.covar_module.requires_grad_(False)
        optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.05)
        model.train()
        for _ in range(STEPS):
            optimizer.zero_grad()
            (-elbo(model(x), y)).backward()
            optimizer.step()
        elbo.end_task()
        model.eval()
        with torch.no_grad():
            maps.append(likelihood(model(grid)).mean.reshape(grid_x.shape))
            accuracies.append([((likelihood(model(xt)).mean > 0.5).to(DT) == yt).to(DT).mean().item() for xt, yt in test[: index + 1]])
    return maps, accuracies


results = {criterion: run(criterion) for criterion in ("kernel_max", "kernel_min")}

# %% [markdown]
# ## Class probability after each task
# Grey points: the tasks seen so far. A model that forgets loses the moons of the earlier tasks.

# %%
fig, axes = plt.subplots(2, 3, figsize=(12, 5.5), sharex=True, sharey=True)
for row, criterion in enumerate(results):
    maps, _ = results[criterion]
    for k in range(3):
        ax = axes[row, k]
        ax.contourf(grid_x, grid_y, maps[k], levels=20, cmap="RdBu_r", vmin=0, vmax=1)
        for x, y in train[: k + 1]:
            ax.scatter(x[:, 0], x[:, 1], c=y, cmap="RdBu_r", s=6, edgecolors="k", linewidths=0.2)
        ax.set_title(f"{criterion}, after task {k + 1}", fontsize=9)
fig.tight_layout()
plt.show()
for criterion, (_, accuracies) in results.items():
    print(criterion, "held-out accuracy per task after the last task:", [round(a, 3) for a in accuracies[-1]])
assert min(results["kernel_max"][1][-1]) > 0.8  # k-max keeps all three tasks

# %% [markdown]
# In our runs both orderings keep all three tasks (the thesis reports k-min forgetting; at this
# size we do not see it, see `docs/results.md`). The ordering is one function,
# `order_inputs(x, criterion, kernel, start)`, so other orders are easy to try.
