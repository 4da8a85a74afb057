"""Does OHSGPR keep an old task on a long, low-noise stream?

A stationary RBF-GP draw (4,096 random Fourier features) with known hyperparameters is observed with
noise in ``--tasks`` tasks of ``--size`` unit-spaced samples and learned online by OHSGPR (HiPPO-LegS,
``method="lyapunov"``). After selected tasks it prints task 1's test NLPD, RMSE and mean predictive
variance for

* ``smoothed``: the library's update, which averages the stored task over the jitter noise of its
  inducing variables (:func:`gpytorch_hippo.collapsed.smooth_ratio`);
* ``jitter-as-information``: the same update with that average switched off, so each step passes
  the ``Kuu`` jitter on as information about ``f`` (Bui et al.'s ratio taken literally);

and, as the reference, the exact GP's posterior on task 1 given every sample within ten length
scales of it (the rest changes it by less than ``exp(-50)``), or given the first 8,000 samples where
that window is longer (then a slightly weaker reference).

    python benchmarks/online_jitter_stream.py                      # 100 tasks, l = 500, noise 1e-4, M = 200
    python benchmarks/online_jitter_stream.py --tasks 1000 --lengthscale 5000 --noise 0.01
"""

from __future__ import annotations

import argparse
import contextlib
import math
import time

import gpytorch
import torch

from gpytorch_hippo import HiPPOInducingVariables, OnlineSGPR
from gpytorch_hippo.inducing.base import InducingVariables
from gpytorch_hippo.metrics import gaussian_nlpd, rmse

DT = torch.float64


def rff_stream(num_samples: int, size: int, lengthscale: float, noise: float, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    R = 4096
    omega = torch.randn(R, generator=generator, dtype=DT) / lengthscale
    phase = 2 * math.pi * torch.rand(R, generator=generator, dtype=DT)
    weights = torch.randn(R, generator=generator, dtype=DT)

    def f(x):
        return torch.cat([math.sqrt(2.0 / R) * (torch.cos(c[:, None] * omega + phase) @ weights) for c in x.split(8192)])

    x = torch.arange(num_samples, dtype=DT) + 0.5
    y = f(x) + math.sqrt(noise) * torch.randn(num_samples, generator=generator, dtype=DT)
    x_test = torch.rand(200, generator=generator, dtype=DT) * size
    y_test = f(x_test) + math.sqrt(noise) * torch.randn(200, generator=generator, dtype=DT)
    return x, y, x_test, y_test


def kernel_and_likelihood(lengthscale: float, noise: float):
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).to(DT)
    kernel.base_kernel.lengthscale, kernel.outputscale = lengthscale, 1.0
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(DT)
    likelihood.noise = noise
    return kernel, likelihood


def scores(predictive, y_test):
    mean, variance = predictive.mean, predictive.variance
    return gaussian_nlpd(mean, variance, y_test), rmse(mean, y_test), variance.mean().item()


def exact_reference(args, data):
    x, y, x_test, y_test = data
    kernel, likelihood = kernel_and_likelihood(args.lengthscale, args.noise)
    near = x < min(args.size + 10 * args.lengthscale, 8000)
    with torch.no_grad():
        K = kernel(x[near].unsqueeze(-1)).to_dense() + args.noise * torch.eye(int(near.sum()), dtype=DT)
        Ks = kernel(x_test.unsqueeze(-1), x[near].unsqueeze(-1)).to_dense()
        chol = torch.linalg.cholesky(K)
        A = torch.cholesky_solve(Ks.mT, chol)
        mean = (A.mT @ y[near].unsqueeze(-1)).squeeze(-1)
        variance = 1.0 - (Ks * A.mT).sum(-1) + args.noise
    return scores(gpytorch.distributions.MultivariateNormal(mean, torch.diag(variance)), y_test)


@contextlib.contextmanager
def jitter_as_information():
    """The update with the average over the jitter switched off (no unshared jitter anywhere)."""
    original = InducingVariables.unshared_jitter
    InducingVariables.unshared_jitter = lambda self, other, kuu: torch.zeros(kuu.shape[:-1], dtype=kuu.dtype)
    try:
        yield
    finally:
        InducingVariables.unshared_jitter = original


def run_streams(args, data, report_after):
    """Both updates task by task in lockstep (so that their times are comparable): rows and seconds per task."""
    x, y, x_test, y_test = data
    models = {}
    for name in ("smoothed", "literal"):
        kernel, likelihood = kernel_and_likelihood(args.lengthscale, args.noise)
        variables = HiPPOInducingVariables(args.M, "legs", t=args.size, method="lyapunov", jitter=args.jitter)
        models[name] = OnlineSGPR(variables, kernel, likelihood, captured_variance_warning=None)
    rows = {name: {} for name in models}
    elapsed = {name: 0.0 for name in models}
    for task in range(args.tasks):
        for name, model in models.items():
            with jitter_as_information() if name == "literal" else contextlib.nullcontext():
                start = time.perf_counter()
                if task > 0:
                    model.inducing_variables.advance(args.size * (task + 1))
                model.update(x[task * args.size : (task + 1) * args.size], y[task * args.size : (task + 1) * args.size])
                elapsed[name] += time.perf_counter() - start
            if task + 1 in report_after:
                with torch.no_grad():
                    rows[name][task + 1] = scores(model.likelihood(model(x_test)), y_test)
    return rows, {name: seconds / args.tasks for name, seconds in elapsed.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--size", type=int, default=1000, help="samples per task")
    parser.add_argument("--lengthscale", type=float, default=500.0)
    parser.add_argument("--noise", type=float, default=1e-4, help="noise variance")
    parser.add_argument("--M", type=int, default=200)
    parser.add_argument("--jitter", type=float, default=None, help="absolute Kuu jitter (default: relative)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    data = rff_stream(args.tasks * args.size, args.size, args.lengthscale, args.noise)
    report_after = sorted({2, *range(max(args.tasks // 10, 1), args.tasks + 1, max(args.tasks // 10, 1))})
    rows, seconds = run_streams(args, data, report_after)
    smoothed, literal = rows["smoothed"], rows["literal"]
    smoothed_time, literal_time = seconds["smoothed"], seconds["literal"]
    reference = exact_reference(args, data)
    print(
        f"stream: {args.tasks} tasks x {args.size} samples, lengthscale {args.lengthscale:g}, noise {args.noise:g}, "
        f"M = {args.M} (LegS, lyapunov), jitter {'relative' if args.jitter is None else args.jitter}"
    )
    window = min(args.size + 10 * args.lengthscale, 8000, len(data[0]))
    print(
        f"exact GP on task 1 given the first {window:,.0f} samples: "
        f"NLPD {reference[0]:.3f}  RMSE {reference[1]:.4f}  mean variance {reference[2]:.3e}"
    )
    print(
        f"{'after task':>10} | {'smoothed NLPD':>13} {'RMSE':>7} {'variance':>9} | "
        f"{'jitter-as-information NLPD':>26} {'RMSE':>7} {'variance':>9}"
    )
    for task in report_after:
        (a, b, c), (d, e, f) = smoothed[task], literal[task]
        print(f"{task:>10} | {a:>13.3f} {b:>7.4f} {c:>9.2e} | {d:>26.3f} {e:>7.4f} {f:>9.2e}")
    print(
        f"seconds per task: smoothed {smoothed_time:.4f}, jitter-as-information {literal_time:.4f} "
        f"(ratio {smoothed_time / literal_time:.2f})"
    )


if __name__ == "__main__":
    main()
