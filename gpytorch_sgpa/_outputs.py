"""Reading the logits out of whatever a classifier's forward returns."""

from __future__ import annotations

from torch import Tensor

__all__ = ["output_logits"]


def output_logits(output) -> Tensor:
    """The logits of a model output: a tensor, the first element of a tuple (``(logits, kl)``), or ``.logits``
    (Hugging Face's ``ModelOutput``).

    :param output: what the model's forward returned.
    """
    if isinstance(output, Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], Tensor):
        return output[0]
    logits = getattr(output, "logits", None)
    if isinstance(logits, Tensor):
        return logits
    raise TypeError(
        f"the model's forward returned {type(output).__name__}; a prediction needs logits (a tensor, "
        "a tuple whose first element is the logits, or an output with .logits)"
    )
