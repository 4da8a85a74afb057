"""What OnlineSGPR's captured-variance check costs per task, for every HiPPO measure and the baselines.

The same stream (a stationary RBF-GP draw, ``--tasks`` tasks of ``--size`` unit-spaced samples,
ℓ = ``--lengthscale``; OVFF uses a Matérn-5/2 kernel) is learned twice per inducing-variable set, with the check
(``captured_variance_warning=0.9``) and without (``None``), alternating task by task on the same
machine; printed: seconds per update without the check, the check's extra time as a fraction of
that over the first and the last ten tasks and over all of them, side by side with the target (≤ 5 %: the check
over the inputs seen so far is paced by counts of work to ``monitor.CHECK_COST_FRACTION``, 5 %; the check at each
task's inputs reuses the update's factor), and the warnings it raised (LegT/FouT: a window of two tasks; LagT:
time scale of a quarter task). The pacing is by counts, so the warnings are the same on every run.

    python benchmarks/captured_variance_cost.py                 # 100 tasks x 1,000 samples, M = 100
    python benchmarks/captured_variance_cost.py --tasks 20 --size 200
"""

from __future__ import annotations

import argparse
import gc
import math
import time
import warnings

import gpytorch
import torch

from gpytorch_hippo import HiPPOInducingVariables, InducingPoints, OnlineSGPR
from gpytorch_hippo.inducing import FourierInducingVariables
from gpytorch_hippo.monitor import CHECK_COST_FRACTION

DT = torch.float64


def stream(args):
    generator = torch.Generator().manual_seed(0)
    omega = torch.randn(1024, generator=generator, dtype=DT) / args.lengthscale
    phase = 2 * math.pi * torch.rand(1024, generator=generator, dtype=DT)
    weights = torch.randn(1024, generator=generator, dtype=DT)
    x = torch.arange(args.tasks * args.size, dtype=DT) + 0.5
    f = torch.cat([math.sqrt(2.0 / 1024) * (torch.cos(c[:, None] * omega + phase) @ weights) for c in x.split(8192)])
    return x, f + 0.1 * torch.randn(len(x), generator=generator, dtype=DT)


def variables(name, args):
    t, M = float(args.size), args.num_inducing
    if name.startswith("ohsgpr"):
        measure = name.split("-")[1]
        method = "lyapunov" if measure == "legs" else "auto"
        theta = 2.0 * args.size if measure in ("legt", "fout") else args.size / 4  # a window of two tasks; LagT's time scale
        return HiPPOInducingVariables(M if measure != "fout" else M + 1, measure, t=t, theta=theta, method=method)
    if name == "ovff":
        return FourierInducingVariables(M // 2, 0.0, float(args.tasks * args.size))
    return InducingPoints(torch.linspace(0.0, t, M, dtype=DT), learn=False)


def move(model, name, k, args):
    if name.startswith("ohsgpr"):
        model.inducing_variables.advance(float(args.size * (k + 1)))
    elif name == "osgpr-fixed-grid":
        points = torch.linspace(args.size * k, args.size * (k + 1.0), args.num_inducing, dtype=DT)
        model.inducing_variables = InducingPoints(points, learn=False)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--lengthscale", type=float, default=50.0)
    parser.add_argument("--num-inducing", type=int, default=100)
    parser.add_argument("--methods", default="ohsgpr-legs,ohsgpr-legt,ohsgpr-lagt,ohsgpr-fout,osgpr-fixed-grid,ovff")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    x, y = stream(args)
    print(f"{args.tasks} tasks x {args.size} samples, RBF lengthscale {args.lengthscale:g}, M = {args.num_inducing}, one thread")
    print(
        f"{'method':18s} {'s/update first 10':>17s} {'check first 10':>14s} {'s/update last 10':>16s} {'check last 10':>13s} "
        f"{'check, all':>10s} {'target':>6s}  warnings"
    )
    fractions = {}
    for name in args.methods.split(","):
        models, times = {}, {None: [], 0.9: []}
        messages = []
        for threshold in times:
            base = gpytorch.kernels.MaternKernel(nu=2.5) if name == "ovff" else gpytorch.kernels.RBFKernel()
            kernel = gpytorch.kernels.ScaleKernel(base).to(DT)
            kernel.base_kernel.lengthscale, kernel.outputscale = args.lengthscale, 1.0
            likelihood = gpytorch.likelihoods.GaussianLikelihood().to(DT)
            likelihood.noise = 0.01
            models[threshold] = OnlineSGPR(variables(name, args), kernel, likelihood, captured_variance_warning=threshold)
        gc.collect()
        gc.disable()  # as timeit does: a cyclic-GC pass of the whole process (0.2 s after other benchmarks) is no update's cost
        for k in range(args.tasks):
            task = slice(k * args.size, (k + 1) * args.size)
            for threshold, model in models.items():
                with warnings.catch_warnings(record=True) as record:
                    warnings.simplefilter("always", RuntimeWarning)
                    start = time.perf_counter()
                    if k > 0:
                        move(model, name, k, args)
                    model.update(x[task], y[task])
                    times[threshold].append(time.perf_counter() - start)
                messages += [str(w.message)[:60] for w in record]
        gc.enable()
        base, check = torch.tensor(times[None]), torch.tensor(times[0.9])
        first, last = slice(0, 10), slice(-10, None)
        extra = lambda part: (check[part].sum() - base[part].sum()) / base[part].sum()
        fractions[name] = float(extra(slice(None)))
        print(
            f"{name:18s} {base[first].mean():17.4f} {extra(first):14.1%} {base[last].mean():16.4f} {extra(last):13.1%} "
            f"{fractions[name]:10.1%} {'≤ ' + format(CHECK_COST_FRACTION, '.0%'):>6s}  {len(messages)}: {'; '.join(messages)[:100]}"
        )
    return fractions  # the check's extra time over all tasks, as a fraction of the updates without it


if __name__ == "__main__":
    main()
