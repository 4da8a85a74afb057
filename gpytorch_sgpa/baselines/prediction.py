"""Class probabilities from any classifier in this package."""

from __future__ import annotations

from typing import cast

import torch

from .._outputs import output_logits as logits_of
from .._validation import check_num_samples


@torch.no_grad()
def predict_proba(model: torch.nn.Module, *inputs, num_samples: int = 1, **forward_kwargs) -> torch.Tensor:
    """Predictive class probabilities in eval mode, averaged over ``num_samples`` forward passes.

    A model with its own ``predict_proba`` (SGPA Transformers, ensembles) is asked for it; otherwise
    the softmax of its logits is averaged (one pass suffices for a deterministic MLE model).
    The model's train/eval mode is restored afterwards.

    :param model: the classifier; its forward returns logits, ``(logits, kl)`` or an output with ``.logits`` (Hugging
        Face's), or it has its own ``predict_proba``.
    :param num_samples: the number of forward passes averaged, a positive int (default 1).
    """
    check_num_samples(num_samples)
    was_training = model.training
    model.eval()
    try:
        own = getattr(model, "predict_proba", None)
        if own is not None:
            return own(*inputs, num_samples=num_samples, **forward_kwargs)
        total: torch.Tensor | None = None
        for _ in range(num_samples):
            probs = logits_of(model(*inputs, **forward_kwargs)).softmax(-1)
            total = probs if total is None else total + probs
        return cast(torch.Tensor, total) / num_samples  # num_samples >= 1 passes
    finally:
        model.train(was_training)
