"""The base class of every attention layer: size and input checks, head splitting, masks, and the
key/value cache of causal decoding."""

from __future__ import annotations

import gpytorch
import torch
from torch import Tensor, nn

from probseq._validation import check_dtype, check_tensor

from ._numerics import causal_mask
from ._validation import check_finite, check_finite_result, checks_on_host
from .multihead import SGPAStepState

__all__ = ["MultiHeadAttentionBase", "append_to_cache"]


def _check_sizes(d_model, num_heads, dropout) -> int:
    for name, value in (("d_model", d_model), ("num_heads", num_heads)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if d_model % num_heads != 0:
        raise ValueError(f"d_model must be divisible by num_heads, got d_model={d_model}, num_heads={num_heads}")
    if not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be a float in [0, 1), got {dropout!r}")
    return d_model // num_heads


class MultiHeadAttentionBase(gpytorch.Module):
    """Shared input checks and head splitting.

    ``gpytorch.Module.__call__`` skips ``nn.Module``'s hooks; the layers use ``nn.Module``'s so
    that forward (pre-)hooks fire (profilers, activation capture, offloading).
    """

    __call__ = nn.Module.__call__

    def __init__(self, d_model: int, num_heads: int, dropout: float, causal: bool):
        super().__init__()
        self.head_dim = _check_sizes(d_model, num_heads, dropout)
        if not isinstance(causal, bool):
            raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
        self.d_model = d_model
        self.num_heads = num_heads
        self.causal = causal
        self.dropout = nn.Dropout(dropout)
        self.out_proj = nn.Linear(d_model, d_model)
        # a model that checks its own inputs and outputs sets this to False for its layers
        self.checks_values = True

    def _checks_values(self, x: Tensor) -> bool:
        """Whether this call reads the values of its inputs and outputs (NaN/Inf checks): eager on the
        CPU, and only when the layer is not inside a model that checks them once for all layers."""
        return checks_on_host(x) and getattr(self, "checks_values", True)

    def _check_input(self, x: Tensor, key_padding_mask: Tensor | None) -> None:
        check_tensor(x, "x", floating=True, finite=False)
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (batch, L, d_model={self.d_model}), got {tuple(x.shape)}")
        if x.shape[0] == 0 or x.shape[1] == 0:
            raise ValueError(f"x must hold at least one sequence of at least one token, got shape {tuple(x.shape)}")
        check_dtype(x, "x", self.out_proj.weight.dtype)
        if self._checks_values(x):
            check_finite(x, "x")
        if key_padding_mask is not None:
            if not isinstance(key_padding_mask, Tensor) or key_padding_mask.dtype != torch.bool:
                raise TypeError("key_padding_mask must be a bool tensor (True = padded)")
            if key_padding_mask.shape != x.shape[:2]:
                raise ValueError(f"key_padding_mask must have shape (batch, L)={tuple(x.shape[:2])}, got {tuple(key_padding_mask.shape)}")
            # not checked on accelerators / under compile: a fully padded sequence then gets finite but
            # meaningless outputs, and the other sequences are unaffected (tests/sgpa/test_sgpa_compile.py)
            if checks_on_host(key_padding_mask) and key_padding_mask.all(-1).any():
                raise ValueError("key_padding_mask pads every position of some sequence; each needs >= 1 token")

    def _check_step(self, x_t: Tensor, state) -> None:
        if not self.causal:
            raise ValueError("forward_step needs a causal layer (causal=True)")
        self._check_input(x_t, None)
        if x_t.shape[1] != 1:
            raise ValueError(f"x_t must hold exactly one token, shape (batch, 1, d_model), got {tuple(x_t.shape)}")
        if state is not None and state.keys.shape[0] != x_t.shape[0]:
            raise ValueError(f"x_t has batch size {x_t.shape[0]} but the state holds {state.keys.shape[0]}")

    def _check_result(self, x: Tensor, *results: Tensor) -> None:
        """``ValueError`` naming ``x`` where a finite input gave a non-finite output (eager, CPU)."""
        if self._checks_values(x):
            check_finite_result(results, x, "x")

    def split_heads(self, x: Tensor) -> Tensor:
        """The heads of a projection: ``(B, L, d_model)`` to ``(B, H, L, d_model / H)``.

        :param x: a projection of the tokens, ``(B, L, d_model)``.
        """
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)

    def merge_heads(self, x: Tensor) -> Tensor:
        """The heads side by side again (inverse of :meth:`split_heads`): ``(B, H, L, e)`` to ``(B, L, d_model)``.

        :param x: per-head rows, ``(B, H, L, d_model / H)``.
        """
        batch, _, length, _ = x.shape
        return x.transpose(1, 2).reshape(batch, length, self.d_model)

    def _key_mask(self, key_padding_mask: Tensor | None, length: int, device) -> Tensor | None:
        """Bool ``(B or 1, 1, L, L)`` mask of allowed (query, key) pairs, or ``None`` for all."""
        allowed = None
        if key_padding_mask is not None:
            allowed = (~key_padding_mask)[:, None, None, :]
        if self.causal:
            causal = causal_mask(length, device)
            allowed = causal if allowed is None else allowed & causal
        return allowed


def append_to_cache(state: SGPAStepState | None, keys: Tensor, values: Tensor) -> SGPAStepState:
    if state is None:
        return SGPAStepState(keys=keys, values=values)
    state.keys = torch.cat([state.keys, keys], dim=-2)
    state.values = torch.cat([state.values, values], dim=-2)
    return state
