"""Online regression of a long stream: per-task time and peak memory of OHSGPR's backends vs OSGPR.

A stream of ``--samples`` consecutive samples of the LibriVox speech clip (Debian
``pocketsphinx-testdata``, 16 kHz; ``--series irradiance-hourly`` uses pvlib's 8,760 hours
instead) is cut into ``--tasks`` equal tasks and learned once, in closed form for OHSGPR
(hyperparameters fitted by an exact GP on the first ``--fit-points`` samples, then fixed) and with
``--osgpr-iters`` Adam steps on the inducing inputs per task for OSGPR. Each method runs in its
own process (so its peak resident memory is its own) with one torch thread, and stops when its
cumulative time exceeds ``--budget-s``: where that happens is where it stops being practical.
Printed: seconds per task over the first and last 10 completed tasks, their ratio, total time,
peak RSS, and the mean time per task relative to the first OHSGPR backend of ``--methods``, in this run.

    nice -n 10 python benchmarks/online_scaling.py                      # 100,000 samples, 100 tasks
    nice -n 10 python benchmarks/online_scaling.py --samples 20000 --tasks 20 --budget-s 60
    python benchmarks/online_scaling.py --methods ohsgpr-lyapunov --captured-variance-warning 0.9  # with the check
    python benchmarks/online_scaling.py --device cuda      # also prints each method's peak CUDA memory
"""

import argparse
import json
import multiprocessing as mp
import resource
import sys
import time
import warnings
from pathlib import Path

import gpytorch
import torch
from devices import add_device_argument, describe, device_from_args, synchronize

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: the experiments/ tree

METHODS = ("ohsgpr-spectral", "ohsgpr-quadrature", "ohsgpr-recurrence", "ohsgpr-lyapunov", "osgpr")


def load(args):
    from experiments.hippo.datasets import load_speech
    from gpytorch_hippo.data import load_dataset

    if args.series == "speech":
        y = load_speech(num_samples=args.samples, offset=0)
    else:
        y = load_dataset(args.series).y[: args.samples]
    y = (y - y.mean()) / y.std()
    device = torch.device(args.device)
    return torch.arange(y.shape[0], dtype=torch.float64).unsqueeze(-1).to(device), y.to(device)


def fitted_hyperparameters(x, y, args):
    from gpytorch_hippo.hyperparameters import fit_exact_hyperparameters

    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).double().to(x.device)
    kernel.base_kernel.lengthscale = 5.0
    # start="given" (ℓ = 5, noise 0.1), as in the recorded runs (docs/performance.md, "Long streams")
    likelihood = fit_exact_hyperparameters(kernel, x[: args.fit_points], y[: args.fit_points], 50, 0.1, start="given")
    return kernel.requires_grad_(False), likelihood.requires_grad_(False)


def run_one(method, args, queue):
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", RuntimeWarning)  # the captured-variance warnings (--captured-variance-warning)
    from gpytorch_hippo import HiPPOInducingVariables, OnlineSGPR
    from gpytorch_hippo.baselines import RandomPointsSchedule, learn_task

    x, y = load(args)
    kernel, likelihood = fitted_hyperparameters(x, y, args)
    chunks = torch.tensor_split(torch.arange(x.shape[0]), args.tasks)
    times, model = [], None
    schedule = RandomPointsSchedule(args.num_inducing, num_iter=args.osgpr_iters)
    for k, chunk in enumerate(chunks):
        xt, yt, t_end = x[chunk], y[chunk], float(x[chunk[-1]]) + 0.5
        synchronize(x.device)
        start = time.perf_counter()
        if model is None:
            if method == "osgpr":
                ivs = schedule.first(xt, t_end, kernel, torch.Generator().manual_seed(0))
            else:
                backend = method.split("-")[1]
                options = {"dt": 1.0, "num_rff": 1000, "kuf": "rff"} if backend == "recurrence" else {}
                ivs = HiPPOInducingVariables(args.num_inducing, "legs", t=t_end, method=backend, **options)
            model = OnlineSGPR(ivs.double().to(x.device), kernel, likelihood, captured_variance_warning=args.captured_variance_warning)
            model.update(xt, yt, num_iter=args.osgpr_iters if method == "osgpr" else 0, lr=0.05)
        else:
            if method == "osgpr":
                learn_task(model, schedule, xt, yt, t_end, lr=0.05)
            else:
                model.inducing_variables.advance(t_end)
                model.update(xt, yt)
        synchronize(x.device)
        times.append(time.perf_counter() - start)
        if sum(times) > args.budget_s:
            break
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    captured = model.inducing_variables.captured_variance(kernel, x[chunks[-1 if len(times) == args.tasks else len(times) - 1]])
    peak_cuda_mib = torch.cuda.max_memory_allocated(x.device) / 2**20 if x.device.type == "cuda" else None
    queue.put(
        {
            "method": method,
            "times": times,
            "peak_mib": peak_mib,
            "lengthscale": kernel.base_kernel.lengthscale.item(),
            "captured_last_task": captured.item(),
            "peak_cuda_mib": peak_cuda_mib,
        }
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--series", default="speech", choices=("speech", "irradiance-hourly"))
    parser.add_argument("--samples", type=int, default=100_000)
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--num-inducing", type=int, default=100)
    parser.add_argument("--osgpr-iters", type=int, default=100)
    parser.add_argument("--fit-points", type=int, default=1000)
    parser.add_argument("--budget-s", type=float, default=300.0, help="stop a method once its cumulative time exceeds this")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument(
        "--captured-variance-warning",
        type=float,
        default=None,
        help="OnlineSGPR's warning threshold (its default is 0.9; here off unless given): "
        "times the check's cost, the warnings themselves are not shown",
    )
    parser.add_argument("--json", default=None, help="also write the raw per-task times here")
    add_device_argument(parser)
    args = parser.parse_args(argv)
    device = device_from_args(parser, args)
    context = mp.get_context("spawn")
    results = []
    for method in args.methods.split(","):
        if method not in METHODS:
            parser.error(f"--methods: unknown {method!r}; choose from {', '.join(METHODS)}")
        queue = context.Queue()
        process = context.Process(target=run_one, args=(method, args, queue))
        process.start()
        results.append(queue.get())
        process.join()
    print(
        f"{args.series}: {args.samples} samples in {args.tasks} tasks, M = {args.num_inducing}, "
        f"RBF ℓ = {results[0]['lengthscale']:.2f} samples (t/ℓ at the end = {args.samples / results[0]['lengthscale']:.0f}), "
        f"OSGPR {args.osgpr_iters} Adam steps per task, budget {args.budget_s:g} s per method"
    )
    print(
        f"{'method':20s} {'tasks done':>10s} {'s/task first 10':>16s} {'s/task last 10':>15s} {'last/first':>10s} "
        f"{'total s':>9s} {'peak RSS MiB':>12s} {'captured var':>12s}"
    )
    reference = next((r for r in results if r["method"].startswith("ohsgpr")), None)  # the first OHSGPR backend run
    for r in results:
        t = r["times"]
        first, last = sum(t[:10]) / len(t[:10]), sum(t[-10:]) / len(t[-10:])
        print(
            f"{r['method']:20s} {len(t):10d} {first:16.3f} {last:15.3f} {last / first:10.2f} {sum(t):9.1f} "
            f"{r['peak_mib']:12.0f} {r['captured_last_task']:12.3f}"
        )
    if device.type == "cuda":
        print(f"peak CUDA memory on {describe(device)}: " + ", ".join(f"{r['method']} {r['peak_cuda_mib']:.0f} MiB" for r in results))
    if reference is not None:
        per_task = sum(reference["times"]) / len(reference["times"])
        print(
            f"mean seconds per task relative to {reference['method']}: "
            + ", ".join(f"{r['method']} {sum(r['times']) / len(r['times']) / per_task:.1f}x" for r in results)
        )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle)
    return results


if __name__ == "__main__":
    main()
