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
# # 2. Online GP regression: OHSGPR vs OSGPR, forgetting made visible
#
# The daily solar irradiance series arrives in tasks (consecutive blocks of days), each seen
# **once**. After each task the model keeps only a summary `q(u)` of `M` inducing variables
# (Bui et al. 2017, thesis §4.2.2):
#
# * **OHSGPR**: `u` are HiPPO-LegS projections of `f` over `[0, t]`; moving the bases forward
#   (`advance`) keeps the whole past in the `M` numbers;
# * **OSGPR**: `u = f(Z)` at `M` inducing points, here spread over the current task (the usual
#   choice when the domain moves); the old points are absorbed into the new ones, and what they
#   cannot represent is forgotten.
#
# Both are the same `OnlineSGPR` class with a different `InducingVariables` object.

# %%
import os
import warnings

import gpytorch
import matplotlib.pyplot as plt
import torch

from gpytorch_hippo import HiPPOInducingVariables, InducingPoints, OnlineSGPR
from gpytorch_hippo.data import load_solar_ghi
from gpytorch_hippo.inducing import CapturedVarianceWarning

SMALL = os.environ.get("PROBSEQ_TUTORIAL_SIZE") == "small"
times, ghi = load_solar_ghi("daily")
y = (ghi - ghi.mean()) / ghi.std()
num_tasks = 4 if SMALL else 8
span = len(times) / num_tasks
M = 24 if SMALL else 40


def make_kernel_and_likelihood():
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).double()
    kernel.base_kernel.lengthscale, kernel.outputscale = 10.0, 0.3
    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    likelihood.noise = 0.6
    return kernel, likelihood


def task(k):
    return (times >= span * k) & (times < span * (k + 1))


# %% [markdown]
# ## Streaming the tasks
# Hyperparameters are trained on the first task only (`num_iter` Adam steps), then fixed. Before each later
# task OHSGPR moves its bases to the task's end; OSGPR moves its points into the task.
# A model whose inducing variables keep too little of the prior variance over the inputs seen so
# far says so with a `CapturedVarianceWarning` (`InducingVariables.captured_variance`); the cell prints it.

# %%
models = {
    "OHSGPR": OnlineSGPR(HiPPOInducingVariables(M, "legs", t=span), *make_kernel_and_likelihood()),
    "OSGPR": OnlineSGPR(InducingPoints(torch.linspace(0, span, M, dtype=torch.float64), learn=False), *make_kernel_and_likelihood()),
}
snapshots = {name: [] for name in models}
for k in range(num_tasks):
    for name, model in models.items():
        if k > 0:
            if name == "OHSGPR":
                model.inducing_variables.advance(span * (k + 1))
            else:
                model.inducing_variables = InducingPoints(torch.linspace(span * k, span * (k + 1), M, dtype=torch.float64), learn=False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", CapturedVarianceWarning)
            model.update(times[task(k)], y[task(k)], num_iter=(10 if SMALL else 30) if k == 0 else 0)
        for warning in caught:
            print(f"{name}, task {k + 1}: {warning.message}")
        model.eval()
        with torch.no_grad():
            predictive = model.likelihood(model(times))
        snapshots[name].append((predictive.mean, predictive.variance.sqrt()))

# %% [markdown]
# ## Predictive bands after each task
# Each row is the state after one task (grey: the tasks seen so far). OSGPR's band snaps back to
# the prior (mean 0, wide band) on old tasks; OHSGPR still follows them.

# %%
rows = list(range(num_tasks))
fig, axes = plt.subplots(len(rows), 2, figsize=(11, 1.9 * len(rows)), sharex=True, sharey=True)
for row, k in enumerate(rows):
    for col, name in enumerate(models):
        ax = axes[row, col]
        mean, sd = snapshots[name][k]
        seen = times < span * (k + 1)
        ax.axvspan(0, span * (k + 1), color="0.92")
        ax.plot(times[seen], y[seen], "k.", ms=2)
        ax.plot(times, mean, color="C0" if col == 0 else "C3")
        ax.fill_between(times, mean - 2 * sd, mean + 2 * sd, alpha=0.25, color="C0" if col == 0 else "C3")
        if row == 0:
            ax.set_title(name)
        ax.set_ylabel(f"after task {k + 1}", fontsize=8)
axes[-1, 0].set_xlabel("day")
axes[-1, 1].set_xlabel("day")
fig.tight_layout()
plt.show()

# %% [markdown]
# ## Error on the first task as the stream goes on

# %%
first = task(0)
for name in models:
    errors = [(mean[first] - y[first]).pow(2).mean().sqrt().item() for mean, _ in snapshots[name]]
    print(f"{name:7s} RMSE on task 1 after each task:", " ".join(f"{e:.2f}" for e in errors))
ohsgpr_final = (snapshots["OHSGPR"][-1][0][first] - y[first]).pow(2).mean().sqrt()
osgpr_final = (snapshots["OSGPR"][-1][0][first] - y[first]).pow(2).mean().sqrt()
assert ohsgpr_final < osgpr_final  # OHSGPR remembers the first task, OSGPR with moved points does not

# %% [markdown]
# The same comparison on several data sets and with more baselines (OVC, OVFF, OSGPR with trained
# inducing inputs) is `python -m experiments.hippo.online --dataset irradiance` (from a checkout of the repository).
