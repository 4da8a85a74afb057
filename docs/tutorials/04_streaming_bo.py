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
# # 4. Streaming Bayesian optimisation with `OnlineGPModel`
#
# `gpytorch_hippo.botorch.OnlineGPModel` is a BoTorch `Model` whose posterior is an online sparse
# GP (`OnlineSGPR`): each new observation is absorbed by one online update, without refitting and
# without revisiting the old data (with `keep_data=False`, as here, without storing it either), so a
# step costs the same at step 10 and at step 10,000. Any BoTorch acquisition function works with it.
#
# The task: every daylight hour, choose the tilt and azimuth of a solar panel to catch the most
# irradiance in that hour (pvlib's transposition of the TMY3 hour's measured irradiance). The best
# angles move with the sun and the clouds, so the surrogate models `f(tilt, azimuth, time)`.

# %%
import os
import warnings

import matplotlib.pyplot as plt
import numpy as np
import torch
from botorch.acquisition import UpperConfidenceBound, qKnowledgeGradient
from botorch.acquisition.logei import qLogNoisyExpectedImprovement
from botorch.models.transforms import Standardize
from botorch.optim import optimize_acqf
from botorch.sampling import SobolQMCNormalSampler

from gpytorch_hippo.botorch import OnlineGPModel
from gpytorch_hippo.data import IrradianceObjective
from gpytorch_hippo.inducing import CapturedVarianceWarning, HiPPOInducingVariables

SMALL = os.environ.get("PROBSEQ_TUTORIAL_SIZE") == "small"
torch.set_num_threads(1)
torch.manual_seed(0)  # the acquisition optimisers' random restarts and the fantasies' samples
STEPS, INIT = (16, 10) if SMALL else (120, 20)
objective = IrradianceObjective()
hours = objective.hours[:STEPS]
time_of = lambda k: (hours[k] - hours[0]) / (hours[-1] - hours[0])  # noqa: E731  time input in [0, 1]
rng = np.random.default_rng(0)

# %% [markdown]
# ## The first batch: a model and its hyperparameters
# The constructor fits the hyperparameters of the first batch with `fit_gpytorch_mll` on the
# collapsed bound and absorbs it. Inputs are `(tilt, azimuth, time)` in the unit cube.

# %%
x0 = rng.random((INIT, 2))
X = torch.tensor(np.c_[x0, [time_of(k) for k in range(INIT)]])
Y = torch.tensor([objective(x0[k : k + 1], hours[k])[0] for k in range(INIT)]).unsqueeze(-1)
inducing = HiPPOInducingVariables(32, "legs", input_dim=3, num_rff=1000)  # OHSGPR
with warnings.catch_warnings(record=True) as caught:  # printed below, with the loop's
    warnings.simplefilter("always", CapturedVarianceWarning)
    model = OnlineGPModel(X, Y, inducing, outcome_transform=Standardize(m=1), fit_maxiter=50, keep_data=False)
print("length scales (tilt, azimuth, time):", model.covar_module.lengthscale.detach().numpy().round(3))

# %% [markdown]
# ## The loop: acquire, observe, update
# `condition_on_observations` returns the updated model (the old one is left as it was, which
# is what BoTorch's fantasies rely on). The acquisition is maximised over the angles with the time
# fixed at the next hour. The cell ends with the model's `CapturedVarianceWarning`s, if any: a model whose
# inducing variables keep too little of the prior variance over the inputs seen so far says so
# (`InducingVariables.captured_variance`).

# %%
bounds = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
chosen, best_angles, regret = [], [], []
for k in range(INIT, STEPS):
    acquisition = UpperConfidenceBound(model, beta=4.0)
    candidate, _ = optimize_acqf(
        acquisition, bounds, q=1, num_restarts=2, raw_samples=64, fixed_features={2: time_of(k)}, options={"maxiter": 30}
    )
    x = candidate.detach().numpy()[:, :2]
    value = objective(x, hours[k])[0]
    grid_values = objective(objective.grid, hours[k])
    chosen.append(x[0])
    best_angles.append(objective.grid[grid_values.argmax()])
    regret.append(max(grid_values.max(), value) - value)
    with warnings.catch_warnings(record=True) as step_warnings:
        warnings.simplefilter("always", CapturedVarianceWarning)
        model = model.condition_on_observations(candidate.detach(), torch.tensor([[value]]))
    caught += step_warnings
print(f"{model.num_updates} updates; mean regret {np.mean(regret):.3f} kW/m^2")
for warning in caught:
    print("warning:", warning.message)
# the fantasy models of the look-ahead acquisitions below run the same check; their warnings are left out
warnings.simplefilter("ignore", CapturedVarianceWarning)

# %%
chosen, best_angles = np.array(chosen), np.array(best_angles)
fig, axes = plt.subplots(1, 3, figsize=(13, 3.2))
steps = np.arange(INIT, STEPS)
for ax, column, name, scale, offset in ((axes[0], 0, "tilt (°)", 90, 0), (axes[1], 1, "azimuth (°)", 180, 90)):
    ax.plot(steps, offset + scale * best_angles[:, column], "k.", label="best on the grid")
    ax.plot(steps, offset + scale * chosen[:, column], "C0x", label="chosen")
    ax.set(xlabel="step (daylight hour)", ylabel=name)
axes[0].legend(fontsize=8)
axes[2].plot(steps, regret)
axes[2].set(xlabel="step (daylight hour)", ylabel="regret (kW/m²)")
fig.tight_layout()
plt.show()

# %% [markdown]
# ## Other acquisition functions, fantasies
# Monte-Carlo acquisition functions and look-ahead ones work too: `qLogNoisyExpectedImprovement`
# evaluates the joint posterior of `q` candidates with the baseline points; `qKnowledgeGradient`
# conditions the model on sampled (fantasy) observations through `condition_on_observations`,
# which then takes a t-batch of data and returns a batched model. This model keeps no data,
# so the baseline points are passed explicitly.

# %% [markdown]
# BoTorch's optimiser may report that it added jitter to the joint posterior covariance of close
# candidates and restarted: with HiPPO variables on a path, `Kuu` and `Kuf` come from random
# Fourier features while the prior term `k(x, x')` is the exact kernel, so where the features are
# least accurate the covariance of nearly coincident points can be slightly indefinite. The cell
# prints those reports.

# %%
t_next = time_of(STEPS - 1)
baseline = torch.tensor(np.c_[chosen[-5:], np.full(5, t_next)])
with warnings.catch_warnings(record=True) as optimiser_reports:
    warnings.simplefilter("always", RuntimeWarning)
    qlognei = qLogNoisyExpectedImprovement(model, X_baseline=baseline, prune_baseline=False)
    batch, value = optimize_acqf(qlognei, bounds, q=2, num_restarts=1, raw_samples=32, fixed_features={2: t_next}, options={"maxiter": 10})
    print("qLogNEI batch of 2:", batch.numpy().round(3), "value", float(value))
    fantasy = model.fantasize(batch, SobolQMCNormalSampler(torch.Size([8])))
    print("fantasy model batch shape:", tuple(fantasy.batch_shape))
    kg = qKnowledgeGradient(model, num_fantasies=4)
    candidate, value = optimize_acqf(kg, bounds, q=1, num_restarts=1, raw_samples=16, fixed_features={2: t_next}, options={"maxiter": 5})
assert np.isfinite(float(value))
for report in optimiser_reports:
    if str(report.message).startswith("Optimization failed"):
        print("optimiser:", str(report.message).splitlines()[0])

# %% [markdown]
# Inducing points instead of HiPPO variables give OSGPR: `OnlineGPModel(X, Y, InducingPoints(Z))`;
# move them between steps with `model.inducing_variables = InducingPoints(new_Z)`. The comparison
# with BoTorch's refitted `SingleTaskGP` and `SingleTaskVariationalGP` over 200 steps is
# `python -m experiments.hippo.streaming_bo`, from a checkout of the repository (table in `docs/project_results.md`).
