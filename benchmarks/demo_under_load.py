"""The demo's online part on an idle machine and beside competing CPU-bound processes, side by side.

For each torch thread count (``--threads``, default ``1,2``) the online part of ``python -m
gpytorch_hippo`` (:func:`gpytorch_hippo.__main__.run_online`: OHSGPR, OSGPR, OVC and OVFF through
the daily irradiance series, ``--seeds`` seeds) runs in a fresh interpreter, first alone, then while
``--competitors`` processes spin a pure-Python busy loop (each holds one core).  Prints the wall and
CPU time of each run and the ratio loaded / idle::

    python benchmarks/demo_under_load.py                 # threads 1 and 2, one competitor, seed 0
    python benchmarks/demo_under_load.py --seeds 5       # the demo's five seeds

On a machine with ``C`` cores and ``k`` competitors a single-threaded run should slow by about
``max(1, (k + 1) / C)``; a run with more threads than the cores left to it waits at every small
operation for the thread that was descheduled.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import time

CHILD = """
import json, sys, time, torch
torch.set_num_threads({threads})
from gpytorch_hippo.__main__ import run_online
wall, cpu = time.perf_counter(), time.process_time()
run_online(range({seeds}))
print(json.dumps(dict(wall=time.perf_counter() - wall, cpu=time.process_time() - cpu, threads=torch.get_num_threads())))
"""


def busy(stop):
    """A CPU-bound competitor: a pure-Python loop until ``stop`` is set."""
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x += 1


def time_online_part(threads: int, seeds: int, timeout: float) -> dict:
    """Wall and CPU seconds of the online part in a fresh interpreter; a run stopped at ``timeout``
    gives ``wall = timeout`` and ``cpu = nan`` (printed as ``> timeout``)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    try:
        result = subprocess.run(
            [sys.executable, "-c", CHILD.format(threads=threads, seeds=seeds)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return dict(wall=timeout, cpu=float("nan"), stopped=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def _seconds(run: dict, key: str) -> str:
    if run.get("stopped"):
        return f"> {run['wall']:.0f} (stopped)" if key == "wall" else "-"
    return f"{run[key]:.1f}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", default="1,2", help="comma-separated torch thread counts")
    parser.add_argument("--seeds", type=int, default=1, help="seeds of the online part (the demo runs 5)")
    parser.add_argument("--competitors", type=int, default=1, help="CPU-bound processes beside the loaded run")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds after which a run is stopped")
    args = parser.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",") if t]
    print(
        f"{os.cpu_count()} cores; load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}; "
        f"online part of the demo, {args.seeds} seed(s); loaded: {args.competitors} busy-loop process(es) beside it"
    )
    table = []
    for count in threads:
        idle = time_online_part(count, args.seeds, args.timeout)
        stop = multiprocessing.Event()
        competitors = [multiprocessing.Process(target=busy, args=(stop,), daemon=True) for _ in range(args.competitors)]
        for process in competitors:
            process.start()
        time.sleep(0.5)
        try:
            loaded = time_online_part(count, args.seeds, args.timeout)
        finally:
            stop.set()
            for process in competitors:
                process.join(5)
                if process.is_alive():
                    process.terminate()
        table.append((count, idle, loaded))
    print(
        f"\n| torch threads | idle: wall (s) | idle: CPU (s) | + {args.competitors} busy: wall (s) | "
        f"+ {args.competitors} busy: CPU (s) | wall loaded / idle |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for count, idle, loaded in table:
        ratio = loaded["wall"] / idle["wall"]
        ratio = f"> {ratio:.0f}" if loaded.get("stopped") else f"{ratio:.2f}"
        print(
            f"| {count} | {_seconds(idle, 'wall')} | {_seconds(idle, 'cpu')} | {_seconds(loaded, 'wall')} | "
            f"{_seconds(loaded, 'cpu')} | {ratio} |"
        )
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    return {count: (float("inf") if loaded.get("stopped") else loaded["wall"] / idle["wall"]) for count, idle, loaded in table}


if __name__ == "__main__":
    main()
