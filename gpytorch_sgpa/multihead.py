"""Multi-head attention plumbing shared by every layer: size and input checks, head splitting,
masks, the key/value cache of causal decoding and the numerics of the GP algebra (dtype, jitter)."""

from __future__ import annotations

from dataclasses import dataclass

import gpytorch
import torch
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor, nn

from ._validation import check_dtype, check_finite, check_finite_result, check_tensor

__all__ = ["SGPAStepState"]


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


def _gp_dtype(dtype: torch.dtype) -> torch.dtype:
    """The GP algebra (Gram matrices, Cholesky, solves, KL) runs in float32 at least."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _relative_jitter(kernel, dtype: torch.dtype, params=None) -> Tensor:
    """``gpytorch.settings.cholesky_jitter`` times each head's ``σ_f²``, shaped ``(H, 1, 1)``
    (``σ_f²`` from ``params``, :class:`~gpytorch_sgpa.kernels.ExpKernelParameters`, when given).

    An absolute jitter is swamped (or swamps) when ``σ_f²`` is far from 1; relative to ``σ_f²``
    it is the same fraction of every Gram matrix's scale (``k(x, x) >= σ_f²`` for both kernels).
    """
    scale = (kernel.outputscale if params is None else params.outputscale).detach().to(dtype)
    return gpytorch.settings.cholesky_jitter.value(dtype) * scale.reshape(-1, 1, 1)


def _no_autocast(x: Tensor):
    """Context in which the GP algebra runs in its own dtype, not autocast's."""
    return torch.autocast(device_type=x.device.type, enabled=False)


def _causal_mask(length: int, device) -> Tensor:
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()


class _MultiHeadAttention(gpytorch.Module):
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
        return _checks_on_host(x) and getattr(self, "checks_values", True)

    def _check_input(self, x: Tensor, key_padding_mask: Tensor | None) -> None:
        check_tensor(x, "x", floating=True)
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
            if _checks_on_host(key_padding_mask) and key_padding_mask.all(-1).any():
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

    def _split(self, x: Tensor) -> Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)

    def _merge(self, x: Tensor) -> Tensor:
        batch, _, length, _ = x.shape
        return x.transpose(1, 2).reshape(batch, length, self.d_model)

    def _key_mask(self, key_padding_mask: Tensor | None, length: int, device) -> Tensor | None:
        """Bool ``(B or 1, 1, L, L)`` mask of allowed (query, key) pairs, or ``None`` for all."""
        allowed = None
        if key_padding_mask is not None:
            allowed = (~key_padding_mask)[:, None, None, :]
        if self.causal:
            causal = _causal_mask(length, device)
            allowed = causal if allowed is None else allowed & causal
        return allowed


def _checks_on_host(x: Tensor) -> bool:
    """Whether to run input checks that read tensor values on the host (eager mode on the CPU).

    On an accelerator such a check would make the host wait for the device every call, and under
    ``torch.compile`` it would break the graph, so there they are skipped; the docstrings of the
    callers say what then happens to bad input.
    """
    return x.device.type == "cpu" and not torch.compiler.is_compiling()


def psd_cholesky(matrix: Tensor) -> Tensor:
    """Cholesky factor of a batch of p.s.d. matrices, with jitter escalation where it fails.

    Eager on the CPU this is ``linear_operator``'s ``psd_safe_cholesky`` (jitter × 10ⁱ added to the
    failed matrices, then ``NotPSDError``).  On accelerators and under ``torch.compile`` it never
    waits for the device: every matrix is tried as given (no gradient), those that fail get
    ``psd_safe_cholesky``'s largest jitter, and the factor is recomputed once with gradient; a
    matrix that fails even then gets a NaN factor (so the loss is NaN) instead of ``NotPSDError``.
    Where no matrix fails, both paths return the same factor.

    :param matrix: the symmetric positive semi-definite matrices, ``(..., n, n)``.
    """
    if _checks_on_host(matrix):
        return psd_safe_cholesky(matrix)
    with torch.no_grad():
        failed = torch.linalg.cholesky_ex(matrix)[1] > 0
        tries = gpytorch.settings.cholesky_max_tries.value()
        largest = gpytorch.settings.cholesky_jitter.value(matrix.dtype) * 10 ** (tries - 1)
        jitter = torch.diag_embed((failed.to(matrix.dtype) * largest)[..., None].expand(matrix.shape[:-1]))  # 0 or largest
    factor, info = torch.linalg.cholesky_ex(matrix + jitter)
    return factor.masked_fill((info > 0)[..., None, None], float("nan"))


def _masked_cholesky(matrix: Tensor, valid: Tensor | None, jitter: Tensor) -> Tensor:
    """Cholesky of ``matrix + jitter I`` over the valid positions (``valid``: bool ``(B, 1, L)``);
    padded rows/columns are replaced by the identity, so they contribute exactly 0 to log-dets."""
    eye = torch.eye(matrix.shape[-1], dtype=matrix.dtype, device=matrix.device)
    if valid is None:
        return psd_cholesky(matrix + jitter * eye)
    pair = valid.unsqueeze(-1) & valid.unsqueeze(-2)
    matrix = matrix.masked_fill(~pair, 0.0) + torch.diag_embed((~valid).to(matrix.dtype))
    return psd_cholesky(matrix + jitter * torch.diag_embed(valid.to(matrix.dtype)))


class ForwardKL:
    r"""The KL terms of a layer's most recent forward call (read by ``gpytorch_sgpa.kl_divergence``).

    ``total``: the batch-mean per-sequence KL the call returned; ``global_``: its part from the
    global inducing variables (decoupled SGPA; ``0`` for standard).  Both carry the autograd graph
    of that call, so a copy (``copy.deepcopy``, pickling) starts empty instead of copying the graph,
    which ``deepcopy`` of a non-leaf tensor would refuse.

    :param total: the batch-mean per-sequence KL of the call (a scalar tensor); ``None`` (the default): no call yet.
    :param global\_: the part of ``total`` from the global inducing variables (a scalar tensor); ``None`` (the default):
        no call yet.
    """

    __slots__ = ("total", "global_")

    def __init__(self, total: Tensor | None = None, global_: Tensor | None = None):
        self.total = total
        self.global_ = global_

    def __deepcopy__(self, memo) -> ForwardKL:
        return ForwardKL()

    def __reduce__(self):
        return (ForwardKL, ())


@dataclass
class SGPAStepState:
    r"""Key/value cache of a causal attention layer for autoregressive prediction.

    Created by the first ``forward_step`` call of a causal :class:`~gpytorch_sgpa.attention.SGPAttention`,
    :class:`~gpytorch_sgpa.attention.KernelAttention` or :class:`~gpytorch_sgpa.attention.ScaledDotProductAttention`
    and updated in place by the following ones (the maximum-likelihood layers use ``keys`` and
    ``values`` only).  ``length`` tokens have been processed.

    :param keys: the keys of the processed positions, ``(B, H, t, e)`` (for SGPA the projected queries, which are the
        amortised keys).
    :param values: the values of the processed positions, ``(B, H, t, e)``.
    :param global_factors: the decoupled layer's :class:`~gpytorch_sgpa.decoupled.GlobalFactors`, computed at the first
        step; ``None`` (the default) otherwise.
    :param projected_values: :math:`\sum_j a_j v_j^\top` over the prefix, ``(B, H, M, e)`` (decoupled); ``None``
        (the default) otherwise.
    :param whitened_keys: :math:`a_j = L^{-1} K_{g k_j}` of the prefix, ``(B, H, M, t)`` (decoupled, ``"full"`` and
        ``"diagonal"`` samplers); ``None`` (the default) otherwise.
    :param conditional_chol: the Cholesky factor of :math:`K_{qq} - A^\top A` over the prefix, ``(B, H, t, t)``
        (decoupled, ``"full"`` sampler); ``None`` (the default) otherwise.
    :param local_noise: the standard-normal draws of the prefix's positions, ``(B, H, t, e)`` (SGPA); ``None`` (the
        default) otherwise.
    :param global_noise: the standard-normal draws of the global part, ``(B, H, e, M)`` (decoupled, ``"full"`` and
        ``"decomposed"`` samplers); ``None`` (the default) otherwise.
    """

    keys: Tensor  # (B, H, t, e)
    values: Tensor  # (B, H, t, e)
    global_factors: object | None = None  # decoupled.GlobalFactors
    projected_values: Tensor | None = None  # Σ_j a_j v_jᵀ, (B, H, M, e) (orthogonal variant)
    whitened_keys: Tensor | None = None  # a_j = L⁻¹ K_g,k_j, (B, H, M, t) (full covariance)
    conditional_chol: Tensor | None = None  # chol of K_qq - AᵀA over the prefix, (B, H, t, t)
    local_noise: Tensor | None = None  # (B, H, t, e) (full covariance)
    global_noise: Tensor | None = None  # (B, H, e, M) (full covariance, decoupled)

    @property
    def length(self) -> int:
        return self.keys.shape[-2]


def _append_to_cache(state: SGPAStepState | None, keys: Tensor, values: Tensor) -> SGPAStepState:
    if state is None:
        return SGPAStepState(keys=keys, values=values)
    state.keys = torch.cat([state.keys, keys], dim=-2)
    state.values = torch.cat([state.values, values], dim=-2)
    return state
