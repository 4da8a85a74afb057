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
# # 1. HiPPO memory of a time series
#
# A HiPPO memory (thesis §2.1.2) compresses the *whole history* of a signal `f` into `M` numbers
# `c(t)`: the coefficients of the projection of `f` on `[0, t]` onto `M` orthogonal polynomials
# `g_m^{(t)}` under a measure `ω^{(t)}`. The coefficients obey a linear ODE, so they can be updated
# one observation at a time. This notebook streams a year of daily solar irradiance (the TMY3
# file bundled with pvlib) through the memory and looks at
#
# * the basis functions of the LegS measure (uniform over the whole past),
# * the memory state over time,
# * reconstructions of the past from the final state, for several `M` and measures.

# %%
import os

import matplotlib.pyplot as plt
import torch

from gpytorch_hippo import HiPPO
from gpytorch_hippo.data import load_solar_ghi

SMALL = os.environ.get("PROBSEQ_TUTORIAL_SIZE") == "small"  # the test suite runs a short version
times, ghi = load_solar_ghi("daily")  # 365 daily means in W/m^2
if SMALL:
    times, ghi = times[:120], ghi[:120]
print(f"{len(ghi)} days, mean {ghi.mean():.0f} W/m^2")

# %% [markdown]
# ## The basis at the end of the stream
# `basis(x, t)` evaluates `g_m^{(t)}(x)`: for LegS these are Legendre polynomials stretched over
# `[0, t]`. Low orders capture the seasonal trend, high orders the day-to-day weather.

# %%
memory = HiPPO("legs", M=32)
basis = memory.basis(times, times[-1])  # (N, M)
fig, ax = plt.subplots(figsize=(8, 3))
for m in range(5):
    ax.plot(times, basis[:, m], label=f"g_{m}")
ax.set(xlabel="day", title="LegS basis functions at t = T")
ax.legend(ncol=5, fontsize=8)
plt.show()

# %% [markdown]
# ## The memory state over time
# `scan` returns `c(t_k)` for every step; `final_state` computes only `c(T)` with one matrix
# product. The two agree.

# %%
states = memory.scan(ghi, times)  # (N, M)
c_T = memory.final_state(ghi, times)
torch.testing.assert_close(states[-1], c_T, rtol=1e-8, atol=1e-8)
fig, ax = plt.subplots(figsize=(8, 3))
ax.plot(times, states[:, :6])
ax.set(xlabel="day", ylabel="c_m(t)", title="First six memory coefficients while the year streams in")
plt.show()

# %% [markdown]
# ## Reconstructing the past from `M` numbers
# `reconstruct(c, x, t)` evaluates `Σ_m c_m g_m^{(t)}(x)`. More coefficients keep more detail;
# LegT keeps only a recent window (`theta` days) and LagT weights the recent past exponentially.

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 3.2))
errors = {}
for M in (4, 16, 32):
    memory_M = HiPPO("legs", M=M)
    fit = memory_M.reconstruct(memory_M.final_state(ghi, times), times, times[-1])
    errors[M] = (fit - ghi).pow(2).mean().sqrt().item()
    axes[0].plot(times, fit, label=f"LegS, M = {M}")
axes[0].plot(times, ghi, "k.", ms=2, label="data")
axes[0].set(xlabel="day", ylabel="W/m^2", title="LegS reconstructions from c(T)")
axes[0].legend(fontsize=8)
window = 60.0
for measure in ("legs", "legt", "lagt"):
    memory_m = HiPPO(measure, M=32, theta=window if measure == "legt" else 1.0 / 30)
    fit = memory_m.reconstruct(memory_m.final_state(ghi, times), times, times[-1])
    axes[1].plot(times, fit, label=measure)
axes[1].plot(times, ghi, "k.", ms=2)
axes[1].set_ylim(0, 1.2 * float(ghi.max()))
axes[1].set(xlabel="day", title="Measures: the whole past, a 60-day window, a decaying past")
axes[1].legend(fontsize=8)
plt.show()
print({M: round(e, 1) for M, e in errors.items()})
assert errors[32] < errors[16] < errors[4] < ghi.std().item()  # more coefficients, less error

# %% [markdown]
# The error falls slowly: most of what is left is day-to-day weather, which no smooth summary of
# a few dozen numbers keeps (with daily steps the ODE also resolves only moderate orders: at
# `M = 64` the discretisation error starts to dominate).
#
# The same memory, with `f` replaced by a Gaussian process, gives the HiPPO inducing variables
# of the next tutorials: `u_m = ∫ f(x) g_m^{(t)}(x) ω^{(t)}(x) dx`.
