"""The check of :mod:`gpytorch_hippo`'s own; argument checks live in :mod:`probseq._validation` (``check_tensor``,
``check_real``, ...).

* :func:`floating_dtype` -- the floating dtype a module (a kernel, inducing variables) computes in.
"""

from __future__ import annotations

import torch

__all__ = ["floating_dtype"]


def floating_dtype(module: torch.nn.Module | None, default: torch.dtype | None = None) -> torch.dtype:
    """The dtype of ``module``'s first floating parameter or buffer, else ``default`` (or torch's default)."""
    if module is not None:
        for tensor in module.parameters():
            if tensor.is_floating_point():
                return tensor.dtype
        for buffer in module.buffers():
            if buffer.is_floating_point():
                return buffer.dtype
    return default if default is not None else torch.get_default_dtype()
