"""Checks of :mod:`pseudovideo`'s own (the shared ones are in :mod:`probseq._validation`)."""

from __future__ import annotations

import torch

__all__ = ["check_generator"]


def check_generator(generator, name: str = "generator") -> None:
    """``TypeError`` unless ``generator`` is a ``torch.Generator`` or ``None``."""
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"{name} must be a torch.Generator or None, got {type(generator).__name__}")
