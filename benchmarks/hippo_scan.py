"""HiPPO memory speed, measured side by side in one run.

(a) ``HiPPO.scan`` (per-step matrices precomputed once per grid, batched) against a plain
    per-step Python loop over the same math (``HiPPO.step``, which builds each step's matrices
    when it is taken), in states x steps per second.
(b) ``HiPPO.final_state`` (one product with the T x M HiPPO kernel) against ``scan`` (run in
    batch chunks so peak memory stays at a few GB), with the FLOP ratio it should approach
    (``2 M^2`` per state-step for the scan vs ``2 M`` per sample for the kernel product: ``M``).

    python benchmarks/hippo_scan.py            # full sizes from the issue
    python benchmarks/hippo_scan.py --quick    # small sizes, a few seconds
    python benchmarks/hippo_scan.py --device cuda
"""

import argparse

import torch
from devices import add_device_argument, describe, device_from_args, elapsed

from gpytorch_hippo import HiPPO


def timed(fn, repeats, device):
    """Best wall time of ``repeats`` calls (the minimum is the least noisy estimate), device synchronised."""
    best, result = float("inf"), None
    for _ in range(repeats):
        seconds, result = elapsed(fn, device)
        best = min(best, seconds)
    return best, result


def python_loop(hippo, signal, times):
    c = hippo.initial_state(signal[:, 0], times[0].item())
    t = times.tolist()
    for k in range(1, len(t)):
        c = hippo.step(c, signal[:, k], t[k - 1], t[k], f_prev=signal[:, k - 1])
    return c


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measure", default="legs")
    parser.add_argument("--discretization", default="bilinear")
    parser.add_argument("--M", type=int, default=64)
    parser.add_argument("--T", type=int, default=10_000)
    parser.add_argument("--scan-batch", type=int, default=256)
    parser.add_argument("--final-batch", type=int, default=4096)
    parser.add_argument("--chunk", type=int, default=256, help="batch chunk for the scan baseline in (b)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="T=1000, batches 64/512")
    add_device_argument(parser)
    args = parser.parse_args()
    device = device_from_args(parser, args)
    if args.quick:
        args.T, args.scan_batch, args.final_batch, args.chunk = 1000, 64, 512, 64
    torch.manual_seed(0)
    # Touch a few GB once: on a fresh (micro)VM the first write to each page of guest memory is
    # far slower than later ones and would otherwise be charged to whichever step runs first.
    torch.ones(2**30).sum()
    print("each figure is the best of --repeats runs (the loop and the chunked scan: one run)")
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, float32, "
        f"measure={args.measure}, discretization={args.discretization}, M={args.M}, T={args.T}, "
        f"device {describe(device)}"
    )

    times = torch.linspace(0.0, 1.0, args.T, dtype=torch.float64, device=device)

    def fresh():
        return HiPPO(args.measure, args.M, discretization=args.discretization).to(device)

    hippo = fresh()

    # (a) scan vs per-step Python loop -------------------------------------------------------
    signal = torch.randn(args.scan_batch, args.T).to(device)
    # "cold" = a fresh module that must discretise the grid first; best of `repeats` like the others
    t_setup, _ = timed(lambda: fresh()._grid_steps(times), args.repeats, device)
    t_scan_cold, _ = timed(lambda: fresh().scan(signal, times), args.repeats, device)
    t_scan, states = timed(lambda: hippo.scan(signal, times), args.repeats, device)
    t_loop, last = timed(lambda: python_loop(hippo, signal, times), 1, device)
    err = (last - states[:, -1]).abs().max().item()
    work = args.scan_batch * args.T
    print(f"\n(a) scan, batch {args.scan_batch}")
    print(f"  per-step matrices for the grid (once): {t_setup:8.3f} s")
    print(f"  scan, cold (incl. matrices)          : {t_scan_cold:8.3f} s  {work / t_scan_cold:12.3e} states*steps/s")
    print(f"  scan, warm (matrices cached)         : {t_scan:8.3f} s  {work / t_scan:12.3e} states*steps/s")
    print(f"  per-step Python loop (step)          : {t_loop:8.3f} s  {work / t_loop:12.3e} states*steps/s")
    print(f"  speed-up scan/loop: warm {t_loop / t_scan:6.1f}x, cold {t_loop / t_scan_cold:6.1f}x   (max |difference| {err:.1e})")
    del states

    # (b) final_state vs chunked scan -------------------------------------------------------
    signal = torch.randn(args.final_batch, args.T).to(device)
    memory = fresh()
    t_kernel, _ = timed(lambda: fresh().kernel(times), args.repeats, device)
    memory.kernel(times)
    t_final, final = timed(lambda: memory.final_state(signal, times), args.repeats, device)

    def chunked_scan():
        # keep only a copy of each chunk's last state, so each chunk's states are freed before the next
        return torch.cat([memory.scan(chunk, times)[:, -1].clone() for chunk in signal.split(args.chunk)])

    t_chunked, reference = timed(chunked_scan, 1, device)
    err = ((final - reference).abs().max() / reference.abs().max()).item()
    print(f"\n(b) final state only, batch {args.final_batch}")
    print(f"  HiPPO kernel T x M (once per grid)   : {t_kernel:8.3f} s")
    print(f"  final_state (kernel cached)          : {t_final:8.3f} s")
    print(f"  scan in chunks of {args.chunk:<5d}              : {t_chunked:8.3f} s")
    print(
        f"  speed-up final_state/scan: {t_chunked / t_final:6.1f}x warm, "
        f"{t_chunked / (t_final + t_kernel):6.1f}x incl. kernel; FLOP ratio {args.M}x"
        f"   (max relative difference {err:.1e})"
    )


if __name__ == "__main__":
    main()
