"""The heat-equation time of a Gaussian blur, shared by the heat pseudo videos and their theory."""

from __future__ import annotations

import math

__all__ = ["heat_time"]


def heat_time(std: float) -> float:
    """``tau = std^2 / 2``, ``inf`` where that overflows (the heat equation then reaches the image mean)."""
    return std * std / 2 if std < 1e150 else math.inf
