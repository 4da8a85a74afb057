"""Look-ahead and entropy acquisitions on ``OnlineGPModel`` against ``SingleTaskGP``: time and peak memory.

Both models are built on the same data (``--function``'s values at ``n`` uniform points of the unit cube),
as a user gets them: ``SingleTaskGP`` fitted by ``fit_gpytorch_mll``, ``OnlineGPModel(X, Y)`` with its
defaults (``--num-inducing`` sets the number of inducing points). For each model and ``n``:

* ``qKnowledgeGradient`` (one-shot, ``--fantasies`` fantasies, seeded sampler): the time of one value +
  gradient at a seeded ``--batch x (1 + fantasies) x d`` tensor, and of one seeded ``optimize_acqf``
  (``q = 1``, ``--restarts`` restarts, ``--raw-samples`` raw samples, ``--maxiter`` L-BFGS-B iterations);
* ``qPredictiveEntropySearch`` and ``qJointEntropySearch`` (lower bound): ``get_optimal_samples``
  (``--optima`` optima), the acquisition and one value + gradient at ``--batch`` candidates.

Each case runs in its own forked process (the model is built before the fork), so that its peak
resident memory (``resource.getrusage`` ``ru_maxrss``; torch's CPU allocations do not show in
``tracemalloc``) is its own: printed is the rise of the peak above the resident memory at the fork. One
torch thread. The last columns are the ratios online / ``SingleTaskGP`` in this run.

    python benchmarks/bo_acquisition_cost.py                       # Hartmann-6, n = 200 and 1,000
    python benchmarks/bo_acquisition_cost.py --num-inducing 512    # the streaming setting
    python benchmarks/bo_acquisition_cost.py --smoke               # the smallest setting, seconds
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for a checkout

MODELS = ("SingleTaskGP", "OnlineGPModel")
CASES = ("qKG", "qPES", "qJES")
#: a case that would take more address space than this fails with a MemoryError instead of swapping the machine
MEMORY_LIMIT_BYTES = 16 * 2**30


def test_function(name: str):
    from botorch.test_functions import Ackley, Hartmann

    return {"hartmann6": Hartmann(dim=6, negate=True), "ackley20": Ackley(dim=20, negate=True)}[name]


def build(model_name: str, n: int, args: argparse.Namespace):
    """The model of ``model_name`` on ``n`` seeded points of ``args.function`` (inputs in the unit cube)."""
    from botorch.fit import fit_gpytorch_mll
    from botorch.models import SingleTaskGP
    from gpytorch.mlls import ExactMarginalLogLikelihood

    from gpytorch_hippo.botorch import OnlineGPModel

    function = test_function(args.function)
    bounds = function.bounds.to(torch.float64)
    X = torch.rand(n, function.dim, generator=torch.Generator().manual_seed(args.seed), dtype=torch.float64)
    Y = function(bounds[0] + (bounds[1] - bounds[0]) * X).unsqueeze(-1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # few inducing points for the data: the model says so once
        if model_name == "SingleTaskGP":
            model = SingleTaskGP(X, Y)
            fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
            return model.eval()
        return OnlineGPModel(X, Y, num_inducing=args.num_inducing)


def run_case(model, case: str, args: argparse.Namespace) -> dict:
    """Time and peak-memory rise of one acquisition case on ``model`` (in the calling process)."""
    from botorch.acquisition import qKnowledgeGradient
    from botorch.acquisition.joint_entropy_search import qJointEntropySearch
    from botorch.acquisition.predictive_entropy_search import qPredictiveEntropySearch
    from botorch.acquisition.utils import get_optimal_samples
    from botorch.optim import optimize_acqf
    from botorch.sampling import SobolQMCNormalSampler

    d = model.train_inputs[0].shape[-1]
    bounds = torch.stack([torch.zeros(d), torch.ones(d)]).to(torch.float64)
    generator = torch.Generator().manual_seed(args.seed + 1)
    start_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    torch.manual_seed(args.seed)
    result: dict = {}
    begin = time.perf_counter()
    if case == "qKG":
        acquisition = qKnowledgeGradient(
            model, num_fantasies=args.fantasies, sampler=SobolQMCNormalSampler(torch.Size([args.fantasies]), seed=args.seed)
        )
        X = torch.rand(args.batch, 1 + args.fantasies, d, generator=generator, dtype=torch.float64).requires_grad_(True)
        acquisition(X).sum().backward()
        result["value_grad_s"] = time.perf_counter() - begin
        begin = time.perf_counter()
        optimize_acqf(acquisition, bounds, q=1, num_restarts=args.restarts, raw_samples=args.raw_samples, options={"maxiter": args.maxiter})
        result["optimize_s"] = time.perf_counter() - begin
    else:
        optimal_inputs, optimal_outputs = get_optimal_samples(model, bounds=bounds, num_optima=args.optima)
        if case == "qPES":
            acquisition = qPredictiveEntropySearch(model, optimal_inputs=optimal_inputs)
        else:
            acquisition = qJointEntropySearch(model, optimal_inputs=optimal_inputs, optimal_outputs=optimal_outputs, estimation_type="LB")
        X = torch.rand(args.batch, 1, d, generator=generator, dtype=torch.float64).requires_grad_(True)
        acquisition(X).sum().backward()
        result["value_grad_s"] = time.perf_counter() - begin
    result["peak_mb"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - start_rss) / 1024
    return result


def _child(model, case: str, args: argparse.Namespace, connection) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            connection.send(run_case(model, case, args))
    except MemoryError:
        connection.send({"error": f"over {MEMORY_LIMIT_BYTES / 2**30:.0f} GiB"})


def measure(model, case: str, args: argparse.Namespace) -> dict:
    """:func:`run_case` in a forked process (its own peak memory)."""
    context = mp.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(model, case, args, send))
    process.start()
    result = receive.recv() if receive.poll(args.timeout_s) else {"error": f"no result in {args.timeout_s} s"}
    process.join(5)
    if process.is_alive():
        process.kill()
    return result


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--function", choices=("hartmann6", "ackley20"), default="hartmann6")
    parser.add_argument("--n", type=int, nargs="+", default=[200, 1000])
    parser.add_argument("--num-inducing", type=int, default=None, help="OnlineGPModel's num_inducing (default: the model's default)")
    parser.add_argument("--fantasies", type=int, default=16)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--restarts", type=int, default=2)
    parser.add_argument("--raw-samples", type=int, default=16)
    parser.add_argument("--maxiter", type=int, default=10)
    parser.add_argument("--optima", type=int, default=8)
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=900)
    parser.add_argument("--smoke", action="store_true", help="the smallest setting (n = 30, 4 fantasies, 2 optima): seconds")
    args = parser.parse_args(argv)
    if args.smoke:
        args.n, args.fantasies, args.batch, args.restarts, args.raw_samples, args.maxiter, args.optima = [30], 4, 2, 1, 4, 2, 2
        args.num_inducing = args.num_inducing or 16
    torch.set_num_threads(1)
    rows = []
    for n in args.n:
        models = {name: build(name, n, args) for name in MODELS}
        for case in args.cases:
            row = {"n": n, "case": case, **{name: measure(model, case, args) for name, model in models.items()}}
            rows.append(row)
            print_row(row)
    return rows


def print_row(row: dict) -> None:
    """One line per case: each model's numbers, then the ratios online / SingleTaskGP."""
    exact, online = row["SingleTaskGP"], row["OnlineGPModel"]
    parts = [f"n={row['n']:5d} {row['case']:5s}"]
    for key, unit in (("value_grad_s", "s value+grad"), ("optimize_s", "s optimize_acqf"), ("peak_mb", "MB peak")):
        if key in exact and key in online:
            parts.append(f"{unit}: {exact[key]:8.2f} vs {online[key]:8.2f} (x{online[key] / max(exact[key], 1e-9):.2f})")
    for name in MODELS:
        if "error" in row[name]:
            parts.append(f"{name}: {row[name]['error']}")
    print(" | ".join(parts), flush=True)


if __name__ == "__main__":
    main()
