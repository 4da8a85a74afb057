"""Random draws on a tensor's device from a generator that may live elsewhere.

A CPU ``torch.Generator`` cannot drive sampling on CUDA (and a CUDA one cannot drive CPU
sampling), so the draws are made where ``generator`` lives and moved to ``device``: a seeded CPU
generator then gives the same numbers whichever device the model is on.  Without a generator the
draws are made directly on ``device`` (from that device's global generator).
"""

from __future__ import annotations

import torch


def _source(generator: torch.Generator | None, device) -> torch.device:
    return generator.device if generator is not None else torch.device(device)


def randn(shape, generator: torch.Generator | list[torch.Generator] | None, dtype: torch.dtype | None, device) -> torch.Tensor:
    """Standard normals of ``shape`` on ``device`` drawn by ``generator`` (a list of generators: row ``i`` by
    ``generator[i]``, as diffusers' ``randn_tensor`` draws)."""
    if isinstance(generator, list):
        return torch.cat([randn((1, *shape[1:]), row, dtype, device) for row in generator])
    return torch.randn(shape, generator=generator, dtype=dtype, device=_source(generator, device)).to(device)


def rand(shape, generator: torch.Generator | None, device) -> torch.Tensor:
    """Uniforms on ``[0, 1)`` of ``shape`` on ``device`` drawn by ``generator``."""
    return torch.rand(shape, generator=generator, device=_source(generator, device)).to(device)


def multinomial(probabilities: torch.Tensor, num_samples: int, generator: torch.Generator | None) -> torch.Tensor:
    """``torch.multinomial`` of ``probabilities`` (rows), drawn by ``generator``, on the rows' device."""
    source = _source(generator, probabilities.device)
    return torch.multinomial(probabilities.to(source), num_samples, generator=generator).to(probabilities.device)
