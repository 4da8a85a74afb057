r"""Maximum-likelihood attention baselines: scaled dot-product (thesis eq. (3.1),
:math:`\operatorname{softmax}(q k^\top / \sqrt{d_k})\, v`) and kernel attention (thesis eq. (3.2), :math:`K_{qk} v`),
with the call signature of every layer (see :mod:`gpytorch_sgpa.attention`)."""

from __future__ import annotations

import math

import torch
from gpytorch.kernels import Kernel
from torch import Tensor, nn

from ._attention_base import MultiHeadAttentionBase, append_to_cache
from .kernels import dense_kernel, make_attention_kernel
from .multihead import SGPAStepState

__all__ = ["ScaledDotProductAttention", "KernelAttention"]


class ScaledDotProductAttention(MultiHeadAttentionBase):
    r"""Multi-head scaled dot-product attention, thesis eq. (3.1): :math:`\operatorname{softmax}(q k^\top / \sqrt{d_k})\, v`
    (MLE baseline).

    Separate query/key/value projections, head outputs combined by thesis eq. (2.4) (concatenated and multiplied by the
    output projection :math:`W_o`, Vaswani et al. (2017));
    ``dropout`` acts on the attention weights (MC dropout keeps it active at test time).
    Returns ``(output, kl)`` with ``kl = 0``.

    :param d_model: the width of the layer's input and output, a multiple of ``num_heads``.
    :param num_heads: the attention heads :math:`H`; each has ``d_model // num_heads`` dimensions.
    :param dropout: the dropout probability, in ``[0, 1)``, of the attention weights.
    :param causal: whether position :math:`i` attends to the keys :math:`j \le i` only (a decoder layer).
    """

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0, causal: bool = False):
        super().__init__(d_model, num_heads, dropout, causal)
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None, global_inputs: Tensor | None = None):
        """``(output, kl)``: the layer output ``(B, L, d_model)`` and a zero KL (a scalar tensor).

        :param x: the layer input, ``(B, L, d_model)``.
        :param key_padding_mask: bool ``(B, L)``, ``True`` at padded positions; ``None`` (the default): no padding.
        :param global_inputs: ignored (accepted for the call signature the SGPA layers share).
        """
        self._check_input(x, key_padding_mask)
        q, k, v = self.split_heads(self.q_proj(x)), self.split_heads(self.k_proj(x)), self.split_heads(self.v_proj(x))
        scores = q.matmul(k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        allowed = self._key_mask(key_padding_mask, x.shape[1], x.device)
        if allowed is not None:
            # a padded query of a causal layer with left padding has no allowed key: it gets
            # zero weights (not softmax(-inf, ..., -inf) = NaN, which would reach valid positions)
            scores = scores.masked_fill(~allowed, float("-inf"))
            weights = torch.softmax(scores.masked_fill(~allowed.any(-1, keepdim=True), 0.0), dim=-1)
            weights = weights.masked_fill(~allowed, 0.0)
        else:
            weights = torch.softmax(scores, dim=-1)
        output = self.out_proj(self.merge_heads(self.dropout(weights).matmul(v)))
        self._check_result(x, output)
        return output, x.new_zeros(())

    def forward_step(self, x_t: Tensor, state: SGPAStepState | None = None, global_inputs=None, noise=None):
        """One new token ``(B, 1, d_model)`` of a causal layer with a key/value cache: ``(output_t, state)``.

        :param x_t: the new token's layer input, ``(B, 1, d_model)``.
        :param state: the key/value cache of the earlier steps, as returned by the previous call; ``None`` (the default)
            starts a new sequence.
        :param global_inputs: ignored (accepted for the call signature the SGPA layers share).
        :param noise: ignored (the layer is deterministic apart from dropout).
        """
        self._check_step(x_t, state)
        q, k, v = self.split_heads(self.q_proj(x_t)), self.split_heads(self.k_proj(x_t)), self.split_heads(self.v_proj(x_t))
        state = append_to_cache(state, k, v)
        scores = q.matmul(state.keys.transpose(-2, -1)) / math.sqrt(self.head_dim)
        weights = self.dropout(torch.softmax(scores, dim=-1))
        output = self.out_proj(self.merge_heads(weights.matmul(state.values)))
        self._check_result(x_t, output)
        return output, state


class KernelAttention(MultiHeadAttentionBase):
    r"""Multi-head kernel attention, thesis eq. (3.2): :math:`F = K_{qk} v` (MLE baseline).

    Queries and keys share one projection :math:`W_{qk}` (Tsai et al., 2019) so that :math:`K_{qk}` is a
    symmetric kernel's Gram matrix; ``kernel`` is ``"rbf"`` (ARD-RBF) or ``"exponential"``, one
    set of hyperparameters per head, initialised by ``kernel_init`` (see
    :func:`~gpytorch_sgpa.kernels.make_attention_kernel`).  ``dropout`` acts on the Gram matrix entries.  Returns
    ``(output, kl)`` with ``kl = 0``.

    :param d_model: the width of the layer's input and output, a multiple of ``num_heads``.
    :param num_heads: the attention heads :math:`H`; each has ``d_model // num_heads`` dimensions.
    :param kernel: the kernel's name (``"rbf"``, ``"exponential"``, ``"matern12"``, ``"matern32"``, ``"matern52"``) or a
        GPyTorch ``ScaleKernel`` with ``batch_shape (num_heads,)`` (:func:`~gpytorch_sgpa.kernels.make_attention_kernel`).
    :param dropout: the dropout probability, in ``[0, 1)``, of the Gram matrix entries.
    :param causal: whether position :math:`i` attends to the keys :math:`j \le i` only (a decoder layer).
    :param kernel_init: the kernel hyperparameters' initialisation, ``"sdp"`` or ``"authors"``.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        kernel: str | Kernel = "rbf",
        dropout: float = 0.0,
        causal: bool = False,
        kernel_init: str = "sdp",
    ):
        super().__init__(d_model, num_heads, dropout, causal)
        self.kernel = make_attention_kernel(kernel, self.head_dim, num_heads, init=kernel_init)
        self.kernel_name = kernel if isinstance(kernel, str) else type(kernel.base_kernel).__name__
        self.qk_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None, global_inputs: Tensor | None = None):
        """``(output, kl)``: the layer output ``(B, L, d_model)`` and a zero KL (a scalar tensor).

        :param x: the layer input, ``(B, L, d_model)``.
        :param key_padding_mask: bool ``(B, L)``, ``True`` at padded positions; ``None`` (the default): no padding.
        :param global_inputs: ignored (accepted for the call signature the SGPA layers share).
        """
        self._check_input(x, key_padding_mask)
        q, v = self.split_heads(self.qk_proj(x)), self.split_heads(self.v_proj(x))
        gram = dense_kernel(self.kernel, q)
        allowed = self._key_mask(key_padding_mask, x.shape[1], x.device)
        if allowed is not None:
            gram = gram.masked_fill(~allowed, 0.0)
        heads = self.dropout(gram).matmul(v)
        output = self.out_proj(self.merge_heads(heads))
        self._check_result(x, output)
        return output, x.new_zeros(())

    def forward_step(self, x_t: Tensor, state: SGPAStepState | None = None, global_inputs=None, noise=None):
        """One new token ``(B, 1, d_model)`` of a causal layer with a key/value cache: ``(output_t, state)``.

        :param x_t: the new token's layer input, ``(B, 1, d_model)``.
        :param state: the key/value cache of the earlier steps, as returned by the previous call; ``None`` (the default)
            starts a new sequence.
        :param global_inputs: ignored (accepted for the call signature the SGPA layers share).
        :param noise: ignored (the layer is deterministic apart from dropout).
        """
        self._check_step(x_t, state)
        q, v = self.split_heads(self.qk_proj(x_t)), self.split_heads(self.v_proj(x_t))
        state = append_to_cache(state, q, v)
        gram_row = dense_kernel(self.kernel, q, state.keys)  # (B, H, 1, t+1)
        output = self.out_proj(self.merge_heads(self.dropout(gram_row).matmul(state.values)))
        self._check_result(x_t, output)
        return output, state
