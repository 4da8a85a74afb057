"""Seeded random splits of index ranges."""

from __future__ import annotations

import torch


def split_indices(num_items: int, sizes, seed: int = 0) -> list[torch.Tensor]:
    """Disjoint random index sets of the given ``sizes`` drawn from ``range(num_items)``.

    ``sizes`` is a sequence of non-negative integers whose sum is at most ``num_items``; one
    ``torch.Generator`` seeded with ``seed`` makes the split reproducible.

    :param num_items: the number of items to split, a non-negative int.
    :param sizes: the sizes of the index sets, non-negative ints summing to at most ``num_items``.
    :param seed: the seed of the random permutation (default 0).
    """
    if isinstance(num_items, bool) or not isinstance(num_items, int) or num_items < 0:
        raise ValueError(f"num_items must be a non-negative integer, got {num_items!r}")
    sizes = list(sizes)
    if any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in sizes):
        raise ValueError(f"sizes must be non-negative integers, got {sizes}")
    if sum(sizes) > num_items:
        raise ValueError(f"sizes sum to {sum(sizes)} but only num_items={num_items} are available")
    permutation = torch.randperm(num_items, generator=torch.Generator().manual_seed(seed))
    bounds = torch.tensor([0] + sizes).cumsum(0).tolist()
    return [permutation[start:end] for start, end in zip(bounds[:-1], bounds[1:])]
