"""Runners of the chapter-5 experiments (diffusion, HVAE, VQ tokens) and their shared options."""
import argparse


def add_seed_arguments(parser: argparse.ArgumentParser) -> None:
    """``--seeds S --first-seed K`` run seeds ``K, ..., K+S-1``; every model is seeded by its seed alone,
    so one seed's rows do not depend on which other seeds run (seeds can be split across processes)."""
    parser.add_argument("--seeds", type=int, default=1, help="number of seeds (first-seed .. first-seed+S-1)")
    parser.add_argument("--first-seed", type=int, default=0, help="first seed (default 0)")


def seed_range(args: argparse.Namespace, parser: argparse.ArgumentParser) -> range:
    """The seeds ``args`` asks for; a clear parser error for ``--seeds < 1`` or ``--first-seed < 0``."""
    if args.seeds < 1:
        parser.error(f"--seeds must be >= 1, got {args.seeds}")
    if args.first_seed < 0:
        parser.error(f"--first-seed must be >= 0, got {args.first_seed}")
    return range(args.first_seed, args.first_seed + args.seeds)
