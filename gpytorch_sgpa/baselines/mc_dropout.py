"""Monte-Carlo dropout (Gal & Ghahramani 2016), the MCD baseline of thesis ch. 3."""

from __future__ import annotations

import contextlib
from typing import cast

import torch

from .._validation import check_num_samples
from .prediction import logits_of

_DROPOUT_TYPES = (torch.nn.Dropout, torch.nn.Dropout1d, torch.nn.Dropout2d, torch.nn.Dropout3d, torch.nn.AlphaDropout)
# PyTorch's Transformer modules take a fused inference path in eval mode that skips their dropout
# (and nn.MultiheadAttention applies its attention dropout only in training mode): MC dropout runs
# them in training mode, which changes nothing else in them (no batch statistics)
_FAST_PATH_TYPES = (
    torch.nn.TransformerEncoder,
    torch.nn.TransformerEncoderLayer,
    torch.nn.TransformerDecoderLayer,
    torch.nn.MultiheadAttention,
)


@contextlib.contextmanager
def dropout_enabled(model: torch.nn.Module):
    """Evaluation mode everywhere except dropout modules, which sample masks, and PyTorch's Transformer
    modules, whose eval-mode fast path would skip their dropout; modes restored on exit.

    Raises ``ValueError`` if ``model`` has no dropout module with ``p > 0`` (MC dropout would then
    silently return the deterministic prediction).

    :param model: the model whose dropout is switched on; it must hold a dropout module with ``p > 0``.
    """
    dropouts = [m for m in model.modules() if isinstance(m, _DROPOUT_TYPES) and m.p > 0]
    if not dropouts:
        raise ValueError("model has no dropout module with p > 0; MC dropout needs one (build it with dropout > 0)")
    modes = {module: module.training for module in model.modules()}
    model.eval()
    for module in model.modules():
        if isinstance(module, _DROPOUT_TYPES + _FAST_PATH_TYPES):
            module.training = True
    try:
        yield model
    finally:
        for module, mode in modes.items():
            module.training = mode


@torch.no_grad()
def mc_dropout_predict_proba(model: torch.nn.Module, *inputs, num_samples: int = 10, **forward_kwargs) -> torch.Tensor:
    """Class probabilities averaged over ``num_samples`` dropout masks (thesis ch. 3 uses 10 samples).

    :param model: the classifier with dropout; its forward returns logits, ``(logits, kl)`` or an output with
        ``.logits`` (Hugging Face's).
    :param num_samples: the number of dropout masks (forward passes) averaged, a positive int (default 10).
    """
    check_num_samples(num_samples)
    with dropout_enabled(model):
        total: torch.Tensor | None = None
        for _ in range(num_samples):
            probs = logits_of(model(*inputs, **forward_kwargs)).softmax(-1)
            total = probs if total is None else total + probs
    return cast(torch.Tensor, total) / num_samples  # num_samples >= 1 passes
