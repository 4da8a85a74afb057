"""Chapter 5 experiments: pseudo videos with diffusion, HVAE and VQ-token models."""

import argparse


def add_seed_arguments(parser: argparse.ArgumentParser) -> None:
    """``--seeds S --first-seed K`` run seeds ``K, ..., K+S-1``; every model is seeded by its seed alone,
    so one seed's rows do not depend on which other seeds run (seeds can be split across processes).

    :param parser: the runner's argument parser, to which ``--seeds`` and ``--first-seed`` are added.
    """
    parser.add_argument("--seeds", type=int, default=1, help="number of seeds (first-seed .. first-seed+S-1)")
    parser.add_argument("--first-seed", type=int, default=0, help="first seed (default 0)")


def seed_range(args: argparse.Namespace, parser: argparse.ArgumentParser) -> range:
    """The seeds ``args`` asks for; a clear parser error for ``--seeds < 1`` or ``--first-seed < 0``.

    :param args: the parsed arguments (``seeds`` and ``first_seed``).
    :param parser: the parser whose ``error`` reports invalid values.
    """
    if args.seeds < 1:
        parser.error(f"--seeds must be >= 1, got {args.seeds}")
    if args.first_seed < 0:
        parser.error(f"--first-seed must be >= 0, got {args.first_seed}")
    return range(args.first_seed, args.first_seed + args.seeds)


def add_ema_argument(parser: argparse.ArgumentParser) -> None:
    """``--ema-decay D``: evaluate an exponential moving average of the weights (diffusers' ``EMAModel``).

    :param parser: the runner's argument parser, to which ``--ema-decay`` is added.
    """
    parser.add_argument(
        "--ema-decay",
        type=float,
        default=0.0,
        help="sample from an exponential moving average of the weights with this decay (diffusers' "
        "EMAModel: the first step copies the weights, step k > 1 averages with decay min(D, k / (9 + k))); "
        "0 (default): the trained weights",
    )


def announce_processes(processes) -> None:
    """Print, on the main process, how many processes this run trains on (``accelerate launch --cpu`` starts one
    whatever ``--num_processes`` says; ``torchrun --nproc-per-node N`` or ``accelerate launch --multi_gpu
    --num_processes N`` start ``N``, also on a machine without a GPU).

    :param processes: the run's ``accelerate.PartialState``.
    """
    if processes.is_main_process:
        count = processes.num_processes
        kind = "data-parallel" if count > 1 else "no data parallelism"
        print(f"processes: {count} ({kind}, {processes.distributed_type.value}, {processes.device})", flush=True)
