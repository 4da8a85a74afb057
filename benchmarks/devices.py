"""What every benchmark script shares: the ``--device {cpu,cuda}`` option and a clock
that waits for the device.

CUDA kernels run asynchronously: reading ``time.perf_counter()`` right after launching them would
time the launches, not the work.  :func:`elapsed` therefore synchronises the device before
starting and before stopping the clock (a no-op on the CPU).

    from devices import add_device_argument, device_from_args, elapsed
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch

DEVICES = ("cpu", "cuda")


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--device {cpu,cuda}`` (default ``cpu``) to ``parser``."""
    parser.add_argument(
        "--device",
        choices=DEVICES,
        default="cpu",
        help="where models and data live (default: cpu); cuda needs a GPU and a CUDA build of torch",
    )


def device_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> torch.device:
    """``args.device`` as a ``torch.device``; exits with a clear message if CUDA is asked for but unavailable."""
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error(
            f"--device cuda: torch.cuda.is_available() is False (torch {torch.__version__}, "
            f"CUDA build: {torch.version.cuda or 'none'}); use a machine with a GPU or --device cpu"
        )
    return torch.device(args.device)


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (CUDA); nothing to wait for on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def elapsed(fn: Callable[[], Any], device: torch.device) -> tuple[float, Any]:
    """``(seconds, fn())`` with the device synchronised before the clock starts and before it stops."""
    synchronize(device)
    start = time.perf_counter()
    result = fn()
    synchronize(device)
    return time.perf_counter() - start, result


def describe(device: torch.device) -> str:
    """``"cpu"`` or the GPU's name, for the header of a benchmark's output."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
