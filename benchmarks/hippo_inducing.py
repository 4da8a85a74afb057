"""HiPPO inducing-variable backends: cost of one online task and error, as the stream grows.

For each stream length t/ℓ and number of inducing variables M (LegS, ℓ = 1; ``--kernel``: RBF or
Matérn ν = 1/2, 3/2, 5/2), the bases
are advanced from 0.9 t to t (one task of ten) and we time what the online update needs: ``Kuu``
and ``Kuf`` at 100 inputs of the new task.  Backends, timed interleaved in one run (median of
``--repeats``):

* ``spectral``   exact, the default: frequency-domain quadrature for RBF, banded time-domain
                 product quadrature for Matérn;
* ``quadrature`` exact, Gauss-Legendre in time (the reference where it fits in memory);
* ``rec-random`` the thesis's recurrence with R random Fourier features (state carried across tasks);
* ``rec-quad``   the same recurrence with R deterministic quadrature features.

Errors are relative Frobenius errors of ``Kuu`` and ``Kuf`` against the quadrature, or, where the
quadrature's O((t/ℓ)^2) matrix does not fit (``--max-quadrature-nodes``), against the spectral
backend with a twice wider frequency band (marked ``*``).  For Matérn kernels the time-domain
quadrature is not a reference (its panels straddle the kernel's kink, so it converges only
algebraically): errors of every backend, the quadrature's included (column ``err quad``), are
against the banded backend refined (half-width panels, 12 more nodes each; marked ``†``).

    python benchmarks/hippo_inducing.py              # t/ℓ in 8 32 128 512 2048, M in 50 150
    python benchmarks/hippo_inducing.py --quick      # t/ℓ in 8 32, M = 50
    python benchmarks/hippo_inducing.py --kernel matern12
    python benchmarks/hippo_inducing.py --device cuda
"""

import argparse
import statistics

import gpytorch
import torch
from devices import add_device_argument, describe, device_from_args, elapsed

from gpytorch_hippo import HiPPOInducingVariables
from gpytorch_hippo.inducing import banded

KERNELS = {
    "rbf": gpytorch.kernels.RBFKernel,
    "matern12": lambda: gpytorch.kernels.MaternKernel(nu=0.5),
    "matern32": lambda: gpytorch.kernels.MaternKernel(nu=1.5),
    "matern52": lambda: gpytorch.kernels.MaternKernel(nu=2.5),
}


def make(method, M, t, args, **kwargs):
    return HiPPOInducingVariables(M, "legs", t=0.9 * t, method=method, **kwargs).to(args.torch_device)


def timed_task(ivars, kernel, t, x_new):
    """Advance the (warmed) variables to t, then time Kuu + Kuf of the new task's inputs."""
    ivars.advance(t)
    seconds, (Kuu, Kuf) = elapsed(lambda: (ivars.Kuu(kernel).to_dense(), ivars.Kuf(kernel, x_new)), x_new.device)
    return seconds, Kuu, Kuf


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ratios", type=float, nargs="+", default=[8, 32, 128, 512, 2048], help="t / lengthscale")
    parser.add_argument("--M", type=int, nargs="+", default=[50, 150])
    parser.add_argument("--num-rff", type=int, default=1000, help="R features of the recurrence")
    parser.add_argument("--steps-per-lengthscale", type=float, default=10.0, help="recurrence grid: dt = l / this")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-quadrature-nodes", type=int, default=13000)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--kernel", choices=sorted(KERNELS), default="rbf")
    parser.add_argument("--quick", action="store_true")
    add_device_argument(parser)
    args = parser.parse_args()
    args.torch_device = device_from_args(parser, args)
    if args.quick:
        args.ratios, args.M, args.repeats = [8, 32], [50], 1
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.set_default_dtype(torch.float64)
    kernel = gpytorch.kernels.ScaleKernel(KERNELS[args.kernel]())
    kernel.base_kernel.lengthscale = 1.0
    kernel.requires_grad_(False)
    kernel.to(args.torch_device)
    dt = 1.0 / args.steps_per_lengthscale
    print(
        f"LegS, {args.kernel} l = 1, recurrence dt = {dt:g}, R = {args.num_rff}; "
        "seconds for Kuu + Kuf(100 inputs) of the task ending at t"
        f" (device {describe(args.torch_device)})"
    )
    header = (
        f"{'t/l':>6} {'M':>4} | {'spectral':>9} {'quadrature':>10} {'rec-random':>10} {'rec-quad':>9} | {'q/spec':>7} | "
        f"{'err spec':>9} {'err rec-rand':>12} {'err rec-quad':>12} {'err quad':>9}"
    )
    print(header)
    with torch.no_grad():
        for M in args.M:
            for ratio in args.ratios:
                t = float(ratio)
                x_new = torch.linspace(0.9 * t, t, 100, device=args.torch_device)[:, None]
                run_quadrature = 24 * ratio <= args.max_quadrature_nodes  # 2 panels of 12 nodes per lengthscale
                methods = {"spectral": {}, "rec-random": dict(features="random"), "rec-quad": dict(features="quadrature")}
                if run_quadrature:
                    methods["quadrature"] = {}
                times = {name: [] for name in methods}
                results = {}
                for _ in range(args.repeats):
                    for name, kwargs in methods.items():
                        method = name if name in ("spectral", "quadrature") else "recurrence"
                        extra = dict(kwargs, num_rff=args.num_rff, dt=dt) if method == "recurrence" else {}
                        ivars = make(method, M, t, args, **extra)
                        ivars.Kuu(kernel)  # the previous task: warms the carried recurrence state
                        elapsed, Kuu, Kuf = timed_task(ivars, kernel, t, x_new)
                        times[name].append(elapsed)
                        results[name] = (Kuu, Kuf)
                if args.kernel != "rbf":
                    reference, mark = _refined_banded(M, t, args, kernel, x_new), "†"
                elif run_quadrature:
                    reference, mark = results["quadrature"], " "
                else:
                    wide = make("spectral", M, t, args)
                    wide.advance(t)
                    reference = (wide.Kuu(kernel).to_dense(), _wide_kuf(wide.backends["spectral"], wide, kernel, x_new))
                    mark = "*"

                def error(name):
                    Kuu, Kuf = results[name]
                    return max(
                        ((Kuu - reference[0]).norm() / reference[0].norm()).item(),
                        ((Kuf - reference[1]).norm() / reference[1].norm()).item(),
                    )

                median = {name: statistics.median(values) for name, values in times.items()}
                quad = f"{median['quadrature']:10.4f}" if run_quadrature else f"{'(skip)':>10}"
                ratio_q = f"{median['quadrature'] / median['spectral']:7.1f}" if run_quadrature else f"{'-':>7}"
                print(
                    f"{ratio:6g} {M:4d} | {median['spectral']:9.4f} {quad} {median['rec-random']:10.4f} {median['rec-quad']:9.4f} | "
                    f"{ratio_q} | {error('spectral'):8.1e}{mark} {error('rec-random'):11.1e}{mark} {error('rec-quad'):11.1e}{mark} "
                    f"{error('quadrature') if run_quadrature and mark != ' ' else float('nan'):8.1e}{mark}",
                    flush=True,
                )


def _refined_banded(M, t, args, kernel, x):
    """Kuu, Kuf of the banded backend with half-width panels and 12 more nodes per panel (Matérn reference)."""
    ivars = make("spectral", M, t, args)
    ivars.advance(t)
    width, base = banded.PANEL_WIDTH, banded.BASE_NODES
    banded.PANEL_WIDTH, banded.BASE_NODES = width / 2, base + 12
    try:
        return ivars.Kuu(kernel).to_dense(), ivars.Kuf(kernel, x)
    finally:
        banded.PANEL_WIDTH, banded.BASE_NODES = width, base


def _wide_kuf(backend, ivars, kernel, x):
    """Kuf with a frequency band twice the one the backend picks (a self-consistency reference)."""
    original = backend._bucket
    backend._bucket = lambda half_width, needed: 2 * original(half_width, needed)
    try:
        return ivars.Kuf(kernel, x)
    finally:
        backend._bucket = original


if __name__ == "__main__":
    main()
