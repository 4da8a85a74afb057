"""HiPPO inducing variables: "quadrature" vs "recurrence" backends, cost and accuracy per task (issue 3).

A stream of unit-length tasks (100 points each) is absorbed with fixed hyperparameters; after each
advance we time what an online update needs, ``Kuu`` and ``Kuf`` of the new task's inputs, and
measure the recurrence's error against quadrature (exact to round-off for the RBF kernel).

    python benchmarks/hippo_inducing.py            # tasks up to t = 64
    python benchmarks/hippo_inducing.py --quick    # up to t = 8
"""
import argparse
import time

import gpytorch
import torch

from gpytorch_hippo import HiPPOInducingVariables


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--M", type=int, default=32)
    parser.add_argument("--lengthscale", type=float, default=0.5)
    parser.add_argument("--num-rff", type=int, default=1000)
    parser.add_argument("--dt", type=float, default=0.01)
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.tasks = 8
    torch.set_default_dtype(torch.float64)
    torch.ones(2**28).sum()  # touch memory once (first-touch page cost on a fresh VM)
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())
    kernel.base_kernel.lengthscale = args.lengthscale
    kernel.requires_grad_(False)
    backends = {
        "quadrature": HiPPOInducingVariables(args.M, "legs", t=1.0),
        "recurrence": HiPPOInducingVariables(args.M, "legs", t=1.0, method="recurrence", dt=args.dt, num_rff=args.num_rff),
    }
    report_at = {1, 2, 4, 8, 16, 32, 64, 128}
    print(f"LegS, M={args.M}, RBF lengthscale {args.lengthscale}, recurrence dt={args.dt}, R={args.num_rff} RFF; "
          f"seconds for Kuu + Kuf(100 new inputs) after advancing to t")
    print(f"{'t':>5} {'quadrature s':>13} {'recurrence s':>13} {'ratio q/r':>10} {'rel. err Kuu':>13} {'rel. err Kuf':>13}")
    with torch.no_grad():
        for task in range(1, args.tasks + 1):
            x_new = torch.linspace(task - 1, task, 100)[:, None]
            results = {}
            for name, ivars in backends.items():
                if task > 1:
                    ivars.advance(float(task))
                start = time.perf_counter()
                Kuu = ivars.Kuu(kernel).to_dense()
                Kuf = ivars.Kuf(kernel, x_new)
                results[name] = (time.perf_counter() - start, Kuu, Kuf)
            if task in report_at:
                (tq, Kq, Fq), (tr, Kr, Fr) = results["quadrature"], results["recurrence"]
                err_kuu = ((Kr - Kq).norm() / Kq.norm()).item()
                err_kuf = ((Fr - Fq).norm() / Fq.norm()).item()
                print(f"{task:5d} {tq:13.4f} {tr:13.4f} {tq / tr:10.2f} {err_kuu:13.2e} {err_kuf:13.2e}")


if __name__ == "__main__":
    main()
