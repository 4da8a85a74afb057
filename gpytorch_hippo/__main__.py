"""Main demo: stream a real series through HiPPO memories (``python -m gpytorch_hippo``).

1. Streams a year of daily solar irradiance (pvlib's TMY3 file) through LegS, LegT, LagT and FouT
   memories, prints the reconstruction error at ``t = T/2`` and ``t = T`` over the whole history
   and over the last ``window`` days, and saves a figure like the thesis's HiPPO figure
   (fig. ``hippo_deterministic``): basis functions, memory state over time, reconstructions.
2. Learns the same series online in 10 tasks with OHSGPR (HiPPO inducing variables) against the
   baselines OSGPR (trained inducing points), OVC (pivoted Cholesky) and OVFF (variational Fourier
   features), printing test NLPD/RMSE over all learned tasks and training time (thesis fig.
   ``time_series_regression``, table ``wall_time_time_series_prediction``;
   :mod:`gpytorch_hippo.experiments.online`).
"""
from __future__ import annotations

import argparse
import os

import torch

from ._optional import require
from .data import load_solar_ghi
from .hippo import MEASURES, HiPPO


def build_memories(M: int, window: float):
    """One memory per measure; FouT needs odd ``M`` (a constant plus cos/sin pairs)."""
    return {
        measure: HiPPO(measure, M + (measure == "fout" and M % 2 == 0), theta=window)
        for measure in MEASURES
    }


def reconstruct_on_support(memory, state, x, t):
    """Reconstruction where the measure has mass; the series mean (0) where the memory holds nothing."""
    fit = memory.reconstruct(state, x, t)
    return torch.where(memory.measure_density(x, t) > 0, fit, torch.zeros_like(fit))


def reconstruction_errors(memories, times, values, window):
    """RMSE of the reconstruction at ``t = T/2`` and ``t = T``: whole history and last ``window``."""
    rows = {}
    for measure, memory in memories.items():
        states = memory.scan(values, times)
        row = []
        for k in (times.shape[0] // 2 - 1, times.shape[0] - 1):
            t = times[k]
            past, past_values = times[: k + 1], values[: k + 1]
            fit = reconstruct_on_support(memory, states[k], past, t)
            recent = past > t - window
            row.append((fit - past_values).pow(2).mean().sqrt().item())
            row.append((fit[recent] - past_values[recent]).pow(2).mean().sqrt().item())
        rows[measure] = (row, states)
    return rows


def plot(memories, rows, times, values, path):
    matplotlib = require("matplotlib", "plots", "the figures")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 7.5))
    legs = memories["legs"]
    T = times[-1].item()
    for t, style in ((T / 2, "--"), (T, "-")):
        grid = torch.linspace(0, t, 300, dtype=times.dtype)
        basis = legs.basis(grid, t)
        for m in range(4):
            axes[0, 0].plot(grid, basis[:, m], style, color=f"C{m}", label=f"m={m}, t={t:.0f}" if m < 4 else None)
    axes[0, 0].set(title="(a) LegS basis $g_m^{(t)}(x)$ at t = T/2 (dashed) and T", xlabel="x (days)")
    axes[0, 0].legend(fontsize=7, ncol=2)
    states = rows["legs"][1]
    for m in range(6):
        axes[0, 1].plot(times, states[:, m], label=f"$c_{m}(t)$")
    axes[0, 1].set(title="(b) LegS memory state over time", xlabel="t (days)")
    axes[0, 1].legend(fontsize=7)
    for ax, k, label in ((axes[1, 0], times.shape[0] // 2 - 1, "(c) t = T/2"), (axes[1, 1], times.shape[0] - 1, "(d) t = T")):
        past = times[: k + 1]
        ax.plot(times, values, color="0.6", lw=1, label="data")
        for i, (measure, memory) in enumerate(memories.items()):
            fit = reconstruct_on_support(memory, rows[measure][1][k], past, times[k])
            ax.plot(past, fit, color=f"C{i}", lw=1.2, label=measure)
        ax.axvline(times[k].item(), color="k", lw=0.5)
        ax.set(title=f"{label}: reconstructions $\\hat y^{{(t)}}(x)$", xlabel="x (days)", ylim=(values.min().item() - 1, values.max().item() + 1))
        ax.legend(fontsize=7, ncol=5)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="out/demo", help="folder for the PNG")
    parser.add_argument("--M", type=int, default=32, help="memory size (FouT uses M+1 if M is even)")
    parser.add_argument("--window", type=float, default=60.0, help="LegT/FouT window and LagT time scale, days")
    parser.add_argument("--no-online", action="store_true", help="skip part 2 (online sparse GPs)")
    args = parser.parse_args(argv)
    require("matplotlib", "plots", "the demo's figures")

    times, ghi = load_solar_ghi("daily")
    values = (ghi - ghi.mean()) / ghi.std()
    memories = build_memories(args.M, args.window)
    rows = reconstruction_errors(memories, times, values, args.window)

    print(f"Daily solar irradiance (pvlib TMY3, Greensboro NC), T = {times.shape[0]} days, standardised; "
          f"M = {args.M}, window = {args.window:g} days, bilinear")
    print("reconstruction RMSE (outside a measure's support the memory predicts the mean, 0)")
    print("                           t = T/2: history  last window |  t = T: history  last window")
    for measure, (row, _) in rows.items():
        print(f"  {measure:5s}                           {row[0]:7.3f}  {row[1]:11.3f} |          {row[2]:7.3f}  {row[3]:11.3f}")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "hippo_memory.png")
    plot(memories, rows, times, values, path)
    print(f"figure: {path}")
    if not args.no_online:
        from .experiments import online

        print("\nOnline regression of the same series, 10 tasks seen once, 50 inducing variables, seed 0")
        rows, finals = online.run("irradiance", ("ohsgpr", "osgpr", "ovc", "ovff"), 50, [0], progress=False)
        online.write_csv(rows, args.out)
        print(online.summary(rows))
        print(f"figures: {', '.join(online.plot(rows, finals, args.out))}")


if __name__ == "__main__":
    main()
