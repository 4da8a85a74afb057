r"""Adapters that :func:`gpytorch_sgpa.convert` uses to swap a model's self-attention for the package's layers.

One registry maps a module type to a function ``fn(module, attention, **attention_kwargs)`` that
returns the replacement (or ``None``: leave the module as it is, e.g. a cross-attention module of
a type that also does self-attention); :func:`register_adapter` adds one.  ``convert`` replaces
every module whose type (most specific class first, along the MRO) has one.  Registered by the
package (the first by :mod:`gpytorch_sgpa.dropin`, which defines the replacement; the others here):

* :class:`torch.nn.MultiheadAttention` → :class:`~gpytorch_sgpa.dropin.MultiheadSGPAttention`; in
  :class:`torch.nn.TransformerDecoderLayer` only ``self_attn`` is converted (``causal=True`` unless
  given: decoders pass a causal ``tgt_mask``); ``multihead_attn``, the cross-attention, stays the
  original ``nn.MultiheadAttention`` (SGPA's keys are its queries, thesis eq. (3.16):
  :math:`q = k_a = G_\phi(F) W_{qk}`);
* Hugging Face ``transformers`` (tested with the version pinned in ``constraints.txt``): the
  self-attention of BERT, RoBERTa, XLM-RoBERTa, CamemBERT and ELECTRA (``*SelfAttention``), ViT
  (``ViTAttention``) and GPT-2 (``GPT2Attention``, causal, with its key/value cache; its
  cross-attention variant is left alone), and of DistilBERT, ALBERT, DeBERTa-v2 and the Llama-style
  decoders (below);
* ``timm``'s ``Attention`` (ViT and the models built from its blocks).

What the later families add:

* DistilBERT (``DistilBertSelfAttention``): ``q_lin``, ``k_lin``, ``v_lin``, then ``out_lin`` after the heads.
* ALBERT (``AlbertAttention``): after the heads its own ``dense``, ``output_dropout`` and the residual
  ``LayerNorm(hidden_states + ·)``; its layers are shared across depth, and so are the converted ones
  (one SGPA layer called once per depth; :func:`~gpytorch_sgpa.kl_divergence` counts its last call).
* DeBERTa-v2 (``DisentangledSelfAttention``): its attention logits are
  :math:`q_i \cdot k_j + q_i \cdot r^k_{\delta(i,j)} + k_j \cdot r^q_{\delta(j,i)}`, content-to-content plus the
  content-to-position and position-to-content terms of the relative position embeddings :math:`r`.  The
  content-to-content part becomes the kernel (:math:`K(q_i, q_j)` with :math:`q = x W_{qk}`), as for every family;
  the relative-position terms are additive logit biases, which kernel and SGPA attention have no softmax to add
  to, so they are dropped: the converted layer does not read ``relative_pos`` nor ``rel_embeddings``, and the
  module's ``pos_key_proj`` / ``pos_query_proj`` go with it.  Kept: the model's relative position embeddings
  (``encoder.rel_embeddings`` and their ``LayerNorm``, now unused by attention) and everything outside the
  self-attention (``DebertaV2SelfOutput``, the optional convolution layer).  The conversion record of the
  model (``config.sgpa``) says so in its ``notes``.
* Llama-style decoders (``LlamaAttention``, ``MistralAttention``, ``Qwen2Attention``): causal, with the
  rotary position embeddings the model passes (``position_embeddings = (cos, sin)``) applied to the shared
  queries/keys before the kernel, :math:`\tilde q_i = q_i \cos\theta_i + \operatorname{rot}(q_i) \sin\theta_i`
  (:math:`\operatorname{rot}(q) = (-q_{e/2:}, q_{:e/2})`, per head), so an RBF kernel sees
  :math:`\lVert \tilde q_i - \tilde q_j \rVert^2 = \lVert q_i \rVert^2 + \lVert q_j \rVert^2 - 2 q_i^\top R_{j-i} q_j`,
  the relative position through the rotation; the global inducing keys :math:`k_g = Z_g W_{qk}` are not
  rotated (they have no position).  Grouped-query attention: the :math:`H_{kv}` shared key and value heads
  are repeated to the :math:`H` query heads (as the family's own ``repeat_kv``), so :math:`W_k` gives each
  query head its group's key and :math:`W_v` its group's value: exact at conversion, after which each
  head's value projection trains on its own.  The key/value cache of ``generate`` holds the rotated
  :math:`\tilde q` and the values of the prefix, as the GPT-2 adapter's does.  Qwen2's query/key biases
  are dropped with the shared bias :math:`(b_q + b_k) / 2` as for every family (with rotary embeddings
  the common shift is rotated per position, so the kernel would see it: fine-tuning learns what it needs).
  Sliding-window attention (Mistral's ``sliding_window``, Qwen2's sliding layers) is supported while the
  sequence fits in the window; a longer one gets a banded mask, which raises.  ``calibration_inputs`` sets
  the kernel's scales from the unrotated queries and softmax logits.

Optional packages are never imported here: their classes are matched by their qualified names,
so ``import gpytorch_sgpa`` imports neither ``transformers`` nor ``timm``.

Every adapter holds a kernel or SGPA layer (``self.attention``) initialised from the module's
trained weights, as :func:`~gpytorch_sgpa.convert` does for ``nn.MultiheadAttention``:
:math:`W_{qk} = (W_q + W_k) / 2`, :math:`W_v` and its bias copied; the module's own output path (output
projection, normalisation, gate, dropout) is kept as it was, after the heads.  The shared
query/key bias :math:`(b_q + b_k) / 2` is dropped: it shifts queries and keys alike, which a stationary
kernel (RBF, exponential, Matérn: every named kernel) does not see.

Masks: padding and, for a causal layer, the causal structure; given as Hugging Face passes them
(``None``, 4-D bool ``True`` = attend, or additive float ``0`` / very negative) or as timm does
(bool ``True`` = attend, or additive float ``0`` / ``-inf``).  Any other mask (sliding windows,
packed sequences, additive biases) raises.  Attention weights (``output_attentions=True``) are
the kernel weights :math:`W` of the posterior mean, :math:`m = W v + \gamma A^\top L^\top v_g` (thesis eq. (3.15), the
orthogonally decoupled mean :math:`m_d = K_{qa} v_a + K_{qg} (v_g - K_{gg}^{-1} K_{ga} v_a)` of Chen & Li (2023), SGPA;
:math:`\gamma` the layer's mean gate, 1 without one): :math:`W = K_{qk}` (kernel attention, DSVGP, standard SGPA) or
:math:`K_{qk} - \gamma K_{qg} K_{gg}^{-1} K_{gk}` (orthogonal SGPA), zero where the mask blocks, shaped
``(batch, heads, L_q, L_k)``: what ``softmax`` weights are to dot-product attention; the sample adds
the posterior noise to ``m``.
"""

from __future__ import annotations

import copy
import math
import sys
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any, cast

import torch
from torch import Tensor, nn

from probseq._compat import can_record_registry, forward_hooks, output_capturing_installed
from probseq._validation import check_real

from ._numerics import gp_dtype, relative_jitter
from .attention import KernelAttention, SGPAttention
from .decoupled import mean_gate
from .kernel_scale import mark_for_placement
from .kernels import dense_kernel
from .transformer import ATTENTION_TYPES, build_attention

__all__ = [
    "AlbertAttentionAdapter",
    "BertSelfAttentionAdapter",
    "DebertaV2SelfAttentionAdapter",
    "DistilBertSelfAttentionAdapter",
    "GPT2AttentionAdapter",
    "RotaryAttentionAdapter",
    "SelfAttentionAdapter",
    "TimmAttentionAdapter",
    "ViTAttentionAdapter",
    "adapter_for",
    "from_albert_attention",
    "from_bert_self_attention",
    "from_deberta_v2_self_attention",
    "from_distilbert_self_attention",
    "from_gpt2_attention",
    "from_rotary_attention",
    "from_timm_attention",
    "from_vit_attention",
    "register_adapter",
    "supported_modules",
]

_BY_TYPE: dict[type, Callable] = {}
#: classes of optional packages, by ``module.QualName``: matched without importing the package
_BY_NAME: dict[str, Callable] = {}


def register_adapter(module_type: type, fn: Callable) -> None:
    """Let :func:`gpytorch_sgpa.convert` replace every module of type ``module_type`` (and of its
    subclasses that have no adapter of their own) by ``fn(module, attention, **attention_kwargs)``,
    an ``nn.Module``, or leave it when ``fn`` returns ``None``.  Registering a type again replaces
    its adapter.

    :param module_type: the ``nn.Module`` subclass whose instances ``fn`` converts.
    :param fn: the adapter, called as ``fn(module, attention, **attention_kwargs)``; returns the replacement module or
        ``None`` to leave the module.
    """
    if not isinstance(module_type, type) or not issubclass(module_type, nn.Module):
        raise TypeError(f"module_type must be a subclass of torch.nn.Module, got {module_type!r}")
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    _BY_TYPE[module_type] = fn


def adapter_for(module: nn.Module) -> Callable | None:
    """The adapter of the most specific class of ``module`` (its MRO order) that has one.

    :param module: the module to look up (its class and base classes are tried in MRO order).
    """
    for cls in type(module).__mro__:
        if cls in _BY_TYPE:
            return _BY_TYPE[cls]
        name = f"{cls.__module__}.{cls.__qualname__}"
        if name in _BY_NAME:
            return _BY_NAME[name]
    return None


def supported_modules() -> list[str]:
    """The names of the module classes that have an adapter (registered ones included), for error messages;
    a ``transformers`` class with its family (the model type): ``"transformers deberta_v2.DisentangledSelfAttention"``."""
    internal = {"SelfAttentionAdapter", "MultiheadSGPAttention"}  # the package's own adapters, reconverted
    names = [("nn." if cls.__module__.startswith("torch.nn") else "") + cls.__qualname__ for cls in _BY_TYPE]
    for name in _BY_NAME:
        parts = name.split(".")
        family = f"{parts[2]}." if parts[0] == "transformers" else ""  # transformers.models.<family>.modeling_<family>.<Class>
        names.append(f"{parts[0]} {family}{parts[-1]}")
    return [name for name in names if name not in internal]


def child_defaults(parent: nn.Module, name: str) -> dict | None:
    """Defaults for converting ``parent``'s child ``name``, or ``None``: leave it (cross-attention).

    :param parent: the module that holds the child.
    :param name: the child's attribute name in ``parent`` (e.g. ``"self_attn"``).
    """
    if isinstance(parent, nn.TransformerDecoderLayer):
        if name == "multihead_attn":
            return None
        if name == "self_attn":
            return {"causal": True}
    return {}


# --------------------------------------------------------------------------- the adapter module
class _IdentityProjection(nn.Module):
    """The layer's output projection when the adapter applies the replaced module's own: identity
    (``weight`` is an empty buffer that only carries the dtype the layer checks inputs against)."""

    def __init__(self, reference: Tensor):
        super().__init__()
        self.register_buffer("weight", reference.new_empty(0), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        return x


def _bias(linear: nn.Module, rows: slice | None = None) -> Tensor | None:
    bias = getattr(linear, "bias", None)
    if bias is None:
        return None
    bias = bias.detach()
    return bias if rows is None else bias[rows]


def _kernel_layer(
    attention: str,
    d_model: int,
    num_heads: int,
    weight_q: Tensor,
    weight_k: Tensor,
    weight_v: Tensor,
    bias_v: Tensor | None,
    kwargs: dict,
    bias_q: Tensor | None = None,
    bias_k: Tensor | None = None,
) -> KernelAttention | SGPAttention:
    """A kernel/SGPA layer with ``W_qk = (W_q + W_k) / 2``, ``W_v``, ``b_v`` and no output projection,
    SGPA started at the kernel layer's function (``sgpa_start``); the softmax projections
    ``(W_q, b_q, W_k, b_k)`` stay on it while ``convert`` runs (for ``calibration_inputs``)."""
    if not isinstance(attention, str) or attention not in ATTENTION_TYPES:
        raise ValueError(f"attention must be one of {ATTENTION_TYPES}, got {attention!r}")
    cov_init = sgpa_start(attention, kwargs)
    layer = build_attention(attention, d_model, num_heads, attention_kwargs=kwargs)
    if not isinstance(layer, (KernelAttention, SGPAttention)):  # the layers with a shared W_qk
        raise ValueError(f"convert initialises kernel or SGPA attention (shared W_qk), not {attention!r}")
    layer.v_proj = nn.Linear(d_model, d_model, bias=bias_v is not None)
    layer.out_proj = _IdentityProjection(weight_v)  # type: ignore[assignment]  # identity for the Linear, with the weight it reads
    layer.to(device=weight_v.device, dtype=weight_v.dtype)
    with torch.no_grad():
        layer.qk_proj.weight.copy_(0.5 * (weight_q + weight_k))
        layer.v_proj.weight.copy_(weight_v)
        if bias_v is not None:
            layer.v_proj.bias.copy_(bias_v)
    start_at_mean(layer, cov_init)
    layer._softmax_query_key = (weight_q, bias_q, weight_k, bias_k)
    return layer


def _allowed(mask, batch: int, queries: int, keys: int) -> Tensor | None:
    """Bool ``(B, 1, L_q, L_k)``, ``True`` = may attend, from ``None``, a bool mask (``True`` =
    attend) or an additive float mask of ``0`` and ``-inf`` / very negative entries."""
    if mask is None:
        return None
    if not isinstance(mask, Tensor):
        raise TypeError(
            f"the attention mask must be a tensor or None, got {type(mask).__name__} "
            "(load the model with attn_implementation='eager' or 'sdpa')"
        )
    if mask.dtype == torch.bool:
        allowed = mask
    elif mask.is_floating_point():
        allowed = mask == 0
        blocked = mask <= torch.finfo(mask.dtype).min / 2
        if not (allowed | blocked).all():
            raise ValueError(
                "the attention mask holds additive biases other than 0 and -inf; kernel and SGPA "
                "attention have no softmax to add them to, so only masks are supported"
            )
    else:
        raise TypeError(f"the attention mask must be bool or float, got {mask.dtype}")
    if allowed.dim() in (2, 3):
        allowed = allowed.reshape((1,) * (4 - allowed.dim()) + tuple(allowed.shape))
    target = (batch, allowed.shape[1] if allowed.dim() == 4 else 1, queries, keys)
    if allowed.dim() != 4 or any(size not in (1, want) for size, want in zip(allowed.shape, target)):
        raise ValueError(f"the attention mask must broadcast to (batch, 1 or heads, {queries}, {keys}), got {tuple(mask.shape)}")
    if allowed.shape[1] > 1:
        if not (allowed == allowed[:, :1]).all():
            raise ValueError("per-head attention masks are not supported: kernel and SGPA heads share one mask")
        allowed = allowed[:, :1]
    return allowed.expand(batch, 1, queries, keys)


def _padding(allowed: Tensor | None, causal: bool) -> Tensor | None:
    """The key padding ``(B, L)`` (``True`` = padded) of a square mask that is padding (and, for a
    causal layer, causal) structure; raises for any other mask."""
    if allowed is None:
        return None
    allowed = allowed[:, 0]
    length = allowed.shape[-1]
    padded = ~allowed.diagonal(dim1=-2, dim2=-1)  # a valid token may attend to itself
    expected = (~padded)[:, None, :].expand_as(allowed)
    if causal:
        expected = expected & torch.ones(length, length, dtype=torch.bool, device=allowed.device).tril()
    rows = ~padded[:, :, None]  # the rows of padded queries are not used
    if ((allowed != expected) & rows).any():
        raise ValueError(
            f"the attention mask is not a {'causal ' if causal else ''}padding mask; the layer was built with "
            f"causal={causal} and supports only padding{' plus the causal mask' if causal else ''} (convert with "
            f"causal={not causal} if the model's mask is {'not ' if causal else ''}causal)"
        )
    return padded if padded.any() else None


def _mean_weights(layer: nn.Module, queries: Tensor, keys: Tensor, allowed: Tensor | None):
    """``(W, g)`` of the posterior mean ``m = W v + g`` at ``queries`` given the amortised ``keys``
    (``(B, H, L, e)``, the GP dtype): ``W = K_qk`` (kernel attention, DSVGP, standard SGPA) or
    ``K_qk - γ A_qᵀ A_k`` (orthogonal, ``A = L⁻¹ K_g·``, ``γ`` the mean gate or 1) zeroed where
    ``allowed`` is ``False``; ``g = γ A_qᵀ Lᵀ v_g`` (orthogonal) or ``None``; with the global factors (or ``None``) and ``A_q``."""
    weights = dense_kernel(layer.kernel, queries, keys)
    offset = factors = whitened = None
    if isinstance(layer, SGPAttention) and layer.mode == "decoupled":
        factors = layer.cached_global_factors(None, queries.dtype)
        whitened = factors.chol_inverse.matmul(dense_kernel(layer.kernel, queries, factors.keys).transpose(-2, -1))
        if layer.variant == "orthogonal":
            whitened_keys = factors.chol_inverse.matmul(dense_kernel(layer.kernel, keys, factors.keys).transpose(-2, -1))
            global_values = cast(Tensor, factors.whitened_values)  # L^T v_g: the orthogonal variant has v_g
            gate = mean_gate(layer, queries.dtype)  # γ of m = K_qk v + γ Aᵀ (Lᵀ v_g - A_k v)
            shrink = whitened.transpose(-2, -1).matmul(whitened_keys)
            if gate is not None:
                shrink, global_values = gate * shrink, gate * global_values
            weights = weights - shrink
            offset = whitened.transpose(-2, -1).matmul(global_values)
    if allowed is not None:
        weights = weights.masked_fill(~allowed, 0.0)
    return weights, offset, factors, whitened


def _cached_rows(layer: nn.Module, queries: Tensor, keys: Tensor, values: Tensor, allowed: Tensor) -> Tensor:
    r"""Head outputs ``(B, H, L_q, e)`` at new positions from the cached keys and values of the whole
    prefix: kernel attention ``K_qk v``; decoupled SGPA a draw from the posterior :math:`\mathcal{N}(m_d, \Sigma_d)` of
    thesis eq. (3.15) (the orthogonally decoupled SGPA of Chen & Li (2023)) at each new position (samplers
    ``"decomposed"`` and ``"diagonal"``, with noise drawn per call)."""
    if isinstance(layer, KernelAttention):
        weights = dense_kernel(layer.kernel, queries, keys).masked_fill(~allowed, 0.0)
        return layer.dropout(weights).matmul(values)
    if not isinstance(layer, SGPAttention) or layer.mode != "decoupled" or layer.sampler == "full":
        raise ValueError(
            "cached decoding (use_cache=True) supports kernel attention and decoupled SGPA with the "
            "'decomposed' or 'diagonal' sampler; generate with use_cache=False for this layer"
        )
    weights, offset, factors, whitened = _mean_weights(layer, queries, keys, allowed)
    mean = weights.matmul(values)
    if offset is not None:
        mean = mean + offset
    batch, _, length, _ = queries.shape
    noise = layer.sample_noise(batch, length, queries.dtype, queries.device)
    residual = dense_kernel(layer.kernel, queries, diag=True) - whitened.square().sum(-2)  # k(q, q) - Q_qq
    jitter = relative_jitter(layer.kernel, queries.dtype)
    if layer.sampler == "decomposed":
        coefficient = torch.einsum("hdmn,bhdn->bhmd", factors.whitened_cov_factor, noise.global_)
        mean = mean + whitened.transpose(-2, -1).matmul(coefficient)
        return mean + residual.unsqueeze(-1).clamp_min(jitter).sqrt() * noise.local
    projected = torch.einsum("hdmn,bhml->bhdnl", factors.whitened_cov_factor, whitened)  # (B, H, e|1, M, L)
    variance = (residual.unsqueeze(-2) + projected.square().sum(-2)).transpose(-2, -1)
    return mean + variance.clamp_min(jitter).sqrt() * noise.local


class SelfAttentionAdapter(nn.Module):
    r"""A kernel or SGPA layer in place of a model's self-attention module.

    ``self.attention`` is the package layer (its output projection the identity); ``self.output``
    the replaced module's output path (``None``: the model applies its own afterwards, as BERT's
    ``BertSelfOutput``).  Subclasses give the call convention of the module they replace and call
    :meth:`attend`.

    :param attention: the package's kernel or SGPA layer that computes the heads (its output projection the identity).
    :param output: the replaced module's output path applied after the heads; ``None`` (the default): none, the model
        applies its own afterwards.
    :param layer_idx: the layer's index in a Hugging Face key/value cache; ``None`` (the default) for a model without one.
    """

    attention: KernelAttention | SGPAttention

    def __init__(self, attention: KernelAttention | SGPAttention, output: nn.Module | None = None, layer_idx: int | None = None):
        super().__init__()
        self.attention = attention
        self.output = output
        self.layer_idx = layer_idx

    @property
    def causal(self) -> bool:
        return self.attention.causal

    def _project(self, x: Tensor) -> tuple[Tensor, Tensor]:
        layer = self.attention
        dtype = gp_dtype(x.dtype)
        return layer.split_heads(layer.qk_proj(x)).to(dtype), layer.split_heads(layer.v_proj(x)).to(dtype)

    def attend(self, x: Tensor, mask=None, cache=None, output_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """``(output, weights)`` for ``x`` ``(B, L, d_model)``; ``mask`` as the module's family passes
        it; ``cache``: a Hugging Face cache whose layer ``self.layer_idx`` holds the projected keys
        ``s W_qk`` and values ``s W_v`` of the prefix (updated here).

        :param x: the input of the attention block, ``(B, L, d_model)``.
        :param mask: the attention mask as the module's family passes it (bool ``True`` = attend, or additive float ``0`` /
            very negative; 2-D to 4-D, broadcast to ``(B, 1, L, L_k)``); ``None`` (the default): no mask.
        :param cache: a Hugging Face cache (updated in place); ``None`` (the default): no cache, the whole sequence at once.
        :param output_weights: whether to return the kernel weights of the posterior mean, ``(B, H, L, L_k)``, too (else
            ``None``).
        """
        layer = self.attention
        batch, length, _ = x.shape
        past = 0 if cache is None else cache.get_seq_length(self.layer_idx)
        weights = None
        if past == 0:
            padded = _padding(_allowed(mask, batch, length, length), layer.causal)
            output, _ = layer(x, key_padding_mask=padded)
            if cache is not None or output_weights:
                queries, values = self._project(x)
                if cache is not None:
                    cache.update(queries.to(x.dtype), values.to(x.dtype), self.layer_idx)
                if output_weights:
                    allowed = None if padded is None else (~padded)[:, None, None, :].expand(batch, 1, length, length)
                    if layer.causal:
                        causal = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
                        allowed = causal if allowed is None else allowed & causal
                    weights = _mean_weights(layer, queries, queries, allowed)[0].to(x.dtype)
        else:
            queries, values = self._project(x)
            keys, all_values = cache.update(queries.to(x.dtype), values.to(x.dtype), self.layer_idx)
            total = keys.shape[-2]
            allowed = _allowed(mask, batch, length, total)
            if allowed is None:  # no padding: the causal structure, query i at position total - length + i
                position = torch.arange(total - length, total, device=x.device)
                allowed = (torch.arange(total, device=x.device)[None, :] <= position[:, None]).expand(batch, 1, -1, -1)
            dtype = queries.dtype
            merged = layer.merge_heads(_cached_rows(layer, queries, keys.to(dtype), all_values.to(dtype), allowed).to(x.dtype))
            output = layer.out_proj(layer.dropout(merged) if isinstance(layer, SGPAttention) else merged)
            if output_weights:
                weights = _mean_weights(layer, queries, keys.to(dtype), allowed)[0].to(x.dtype)
        return output, weights

    def reconverted(self, attention: str, **kwargs) -> SelfAttentionAdapter | None:
        """This adapter with its kernel-attention layer turned into ``attention`` (the thesis's path:
        MLE kernel attention first, then SGPA from its weights, App. B.4; Chen & Li (2023)); ``None`` if it holds none.

        :param attention: the layer type to convert to, one of :data:`~gpytorch_sgpa.transformer.ATTENTION_TYPES`
            (``"kernel"`` gives ``None``: nothing to do).
        """
        source = self.attention
        if not isinstance(source, KernelAttention) or attention == "kernel":
            return None
        if "kernel" in kwargs:
            raise ValueError("kernel must not be given when converting kernel attention: its trained kernel is kept")
        kwargs.setdefault("dropout", source.dropout.p)
        kwargs.setdefault("causal", source.causal)
        bias = source.v_proj.bias
        weight = source.qk_proj.weight.detach()
        layer = _kernel_layer(
            attention,
            source.d_model,
            source.num_heads,
            weight,
            weight,
            source.v_proj.weight.detach(),
            None if bias is None else bias.detach(),
            kwargs,
        )
        del layer._softmax_query_key  # already kernel attention: no softmax to calibrate against
        copy_kernel(layer, source)
        self.attention = layer
        return self


# --------------------------------------------------------------------------- starting a converted layer
# (used by the adapters here and by gpytorch_sgpa.dropin's conversion of nn.MultiheadAttention)
def sgpa_start(attention: str, kwargs: dict) -> float | None:
    r"""Defaults of a conversion to SGPA (from softmax or kernel attention) that start it at the kernel
    layer's function: orthogonal SGPA at mean gate :math:`\gamma = 0`, where its posterior mean is kernel
    attention's output :math:`K_{qa} v_a` (:class:`~gpytorch_sgpa.attention.SGPAttention`;
    ``mean_gate=None``: the thesis's mean); decoupled SGPA's global covariance at :math:`C = c I` with
    :math:`c` = ``global_cov_init`` (popped from ``kwargs``, default 0.1; ``None``: the random start of
    ``variational_init_std``), i.e. whitened :math:`S_g = c^2 K_{gg}`, so the samples start near the mean.
    Returns :math:`c` (``None`` for kernel attention, whose ``kwargs`` are left as they are).

    :param attention: the name of the layer converted to (:data:`~gpytorch_sgpa.transformer.ATTENTION_TYPES`).
    :param kwargs: the layer's keyword arguments, completed in place."""
    if not attention.startswith("sgpa"):
        return None
    if attention == "sgpa":
        kwargs.setdefault("mean_gate", 0.0)
    cov_init = kwargs.pop("global_cov_init", 0.1)
    if cov_init is not None:
        check_real(cov_init, "global_cov_init", low=0.0, low_open=True)
    return cov_init


def start_at_mean(layer: nn.Module, cov_init: float | None) -> None:
    r"""Start a decoupled SGPA ``layer``'s global covariance at :math:`\mathrm{cov\_init} \cdot I` (whitened) and let
    ``calibration_inputs`` place its global inducing inputs.

    :param layer: the new kernel or SGPA layer.
    :param cov_init: what :func:`sgpa_start` returned (``None``: leave the covariance as built)."""
    if cov_init is not None and isinstance(layer, SGPAttention) and layer.mode == "decoupled":
        with torch.no_grad():
            layer.global_chol_lower.zero_()
            layer.global_chol_log_diag.fill_(math.log(cov_init))
    mark_for_placement(layer)


def copy_kernel(layer: KernelAttention | SGPAttention, source: KernelAttention) -> None:
    """Give ``layer`` the trained kernel of the kernel-attention layer ``source`` it is converted from.

    :param layer: the new SGPA layer.
    :param source: the kernel-attention layer it replaces."""
    layer.kernel = copy.deepcopy(source.kernel)
    layer.kernel_name = source.kernel_name


def _cache_of(cache):
    """The self-attention part of an encoder-decoder cache."""
    return getattr(cache, "self_attention_cache", cache)


def _output_attentions(module: SelfAttentionAdapter, kwargs: dict) -> bool:
    requested = kwargs.get("output_attentions")
    if requested is None:
        requested = getattr(getattr(module, "config", None), "output_attentions", False)
    return bool(requested)


def _no_head_mask(kwargs: dict) -> None:
    if kwargs.get("head_mask") is not None:
        raise ValueError("head_mask is not supported by kernel and SGPA attention (their heads are not softmax weights)")


class BertSelfAttentionAdapter(SelfAttentionAdapter):
    """In place of ``BertSelfAttention`` (and RoBERTa's, XLM-RoBERTa's, CamemBERT's, ELECTRA's):
    ``forward(hidden_states, attention_mask=None, cache=None, **kwargs) -> (context, weights)``,
    the context before ``BertSelfOutput``; ``weights``: see :mod:`gpytorch_sgpa.adapters`.

    :param attention: the package's kernel or SGPA layer that computes the heads.
    :param config: the replaced module's Hugging Face config (read for ``output_attentions``).
    :param layer_idx: the layer's index in the Hugging Face key/value cache; ``None`` (the default): no cache.
    """

    def __init__(self, attention, config, layer_idx=None):
        super().__init__(attention, None, layer_idx)
        self.config = config

    def forward(self, hidden_states: Tensor, attention_mask=None, cache=None, **kwargs):
        """``(context, weights)``: the heads' outputs ``(B, L, d_model)`` and, with
        ``output_attentions``, the kernel weights ``(B, H, L, L_k)`` of the posterior mean.

        :param hidden_states: the input of the attention block, ``(B, L, d_model)``.
        :param attention_mask: the Hugging Face attention mask (bool ``True`` = attend, or additive float ``0`` / very
            negative); ``None`` (the default): no mask.
        :param cache: the Hugging Face key/value cache (also accepted as ``past_key_values``); ``None`` (the default): none.
        """
        cache = kwargs.pop("past_key_values", cache)
        if kwargs.get("encoder_hidden_states") is not None:
            raise ValueError("a converted self-attention module got encoder_hidden_states (cross-attention)")
        _no_head_mask(kwargs)
        cache = None if cache is None else _cache_of(cache)
        return self.attend(hidden_states, attention_mask, cache, _output_attentions(self, kwargs))


class ViTAttentionAdapter(SelfAttentionAdapter):
    """In place of ``ViTAttention``: ``forward(hidden_states, attention_mask=None, **kwargs) ->
    (output, weights)``, its ``o_proj`` applied after the heads.

    :param attention: the package's kernel or SGPA layer that computes the heads.
    :param output: the replaced ``ViTAttention``'s ``o_proj``, applied after the heads.
    :param config: the replaced module's Hugging Face config (read for ``output_attentions``).
    """

    output: nn.Module  # always given: the replaced module's o_proj

    def __init__(self, attention, output, config):
        super().__init__(attention, output)
        self.config = config

    def forward(self, hidden_states: Tensor, attention_mask=None, **kwargs):
        """``(o_proj(context), weights)`` as :meth:`BertSelfAttentionAdapter.forward`.

        :param hidden_states: the input of the attention block, ``(B, L, d_model)``.
        :param attention_mask: the Hugging Face attention mask (bool ``True`` = attend, or additive float ``0`` / very
            negative); ``None`` (the default): no mask.
        """
        _no_head_mask(kwargs)
        context, weights = self.attend(hidden_states, attention_mask, None, _output_attentions(self, kwargs))
        return self.output(context), weights


class GPT2AttentionAdapter(SelfAttentionAdapter):
    """In place of ``GPT2Attention`` (self-attention): ``forward(hidden_states, cache=None,
    attention_mask=None, ..., output_attentions=False, **kwargs) -> (output, weights)`` with
    ``c_proj`` and ``resid_dropout`` applied after the heads.  With a cache (``use_cache=True``,
    ``generate``) the first call runs the layer on the prompt and stores ``s W_qk`` and ``s W_v``;
    later calls compute only the new positions from them, which inside
    :func:`~gpytorch_sgpa.posterior_mean` gives the outputs of the uncached pass.  Sampling there
    draws fresh noise at each call (the global noise of a sequence is not kept across calls).

    :param attention: the package's kernel or SGPA layer that computes the heads (causal by default).
    :param output: the replaced module's ``c_proj`` followed by its ``resid_dropout``, applied after the heads.
    :param config: the replaced module's Hugging Face config (read for ``output_attentions``).
    :param layer_idx: the layer's index in the Hugging Face key/value cache; ``None`` (the default): no cache.
    """

    output: nn.Module  # always given: the replaced module's c_proj and resid_dropout

    def __init__(self, attention, output, config, layer_idx=None):
        super().__init__(attention, output, layer_idx)
        self.config = config

    def forward(
        self,
        hidden_states: Tensor,
        cache=None,
        attention_mask=None,
        encoder_hidden_states=None,
        encoder_attention_mask=None,
        output_attentions=False,
        **kwargs,
    ):
        """``(resid_dropout(c_proj(context)), weights)``; ``cache`` (or ``past_key_values``) as
        ``GPT2Attention`` takes it.

        :param hidden_states: the input of the attention block, ``(B, L, d_model)`` (``L`` new positions with a cache).
        :param cache: the Hugging Face key/value cache (also accepted as ``past_key_values``); ``None`` (the default): none.
        :param attention_mask: the Hugging Face attention mask (bool ``True`` = attend, or additive float ``0`` / very
            negative); ``None`` (the default): the causal structure only.
        :param encoder_hidden_states: must be ``None`` (the default): cross-attention is not converted and raises.
        :param encoder_attention_mask: ignored (accepted for ``GPT2Attention``'s call signature).
        :param output_attentions: whether to return the kernel weights ``(B, H, L, L_k)`` as well (also on when the config
            asks for them); ``False`` (the default): ``weights`` is ``None``.
        """
        cache = kwargs.pop("past_key_values", cache)
        if encoder_hidden_states is not None:
            raise ValueError("a converted self-attention module got encoder_hidden_states (cross-attention)")
        _no_head_mask(kwargs)
        cache = None if cache is None else _cache_of(cache)
        wants = bool(output_attentions) or _output_attentions(self, kwargs)
        context, weights = self.attend(hidden_states, attention_mask, cache, wants)
        return self.output(context), weights


class TimmAttentionAdapter(SelfAttentionAdapter):
    """In place of timm's ``Attention``: ``forward(x, attn_mask=None, is_causal=False) -> output``
    with its ``norm``, ``gate``, ``proj`` and ``proj_drop`` applied after the heads.

    :param attention: the package's kernel or SGPA layer that computes the heads.
    :param norm: the replaced module's ``norm`` applied to the heads' output (``nn.Identity`` in timm's default).
    :param gate: the replaced module's ``gate`` Linear layer, or ``None`` where it has none.
    :param proj: the replaced module's output projection ``proj``.
    :param proj_drop: the replaced module's output dropout ``proj_drop``.
    """

    output: nn.Module  # always given: the replaced module's proj

    def __init__(self, attention, norm, gate, proj, proj_drop):
        super().__init__(attention, proj)
        self.norm, self.gate, self.proj_drop = norm, gate, proj_drop

    def forward(self, x: Tensor, attn_mask=None, is_causal: bool = False):
        """``proj_drop(proj(norm(context) ⊙ σ(gate(x))))`` (no gate: ``proj_drop(proj(norm(context)))``).

        :param x: the input of the attention block, ``(B, L, d_model)``.
        :param attn_mask: timm's attention mask (bool ``True`` = attend, or additive float ``0`` / ``-inf``); ``None``
            (the default): no mask.
        :param is_causal: whether the caller asks for causal attention; must match the layer's ``causal`` (else raises).
        """
        if is_causal and not self.causal:
            raise ValueError("is_causal=True for a layer built with causal=False: convert with causal=True")
        if not is_causal and attn_mask is None and self.causal:
            raise ValueError("a layer built with causal=True got no causal mask: pass is_causal=True or convert with causal=False")
        context, _ = self.attend(x, attn_mask)
        context = self.norm(context)
        if self.gate is not None:
            context = context * self.gate(x).sigmoid()
        return self.proj_drop(self.output(context))


# --------------------------------------------------------------------------- the families' adapters
def from_bert_self_attention(module: nn.Module, attention: str = "sgpa", **kwargs) -> BertSelfAttentionAdapter:
    """``BertSelfAttention``-style module (``query``, ``key``, ``value`` Linear layers, no output
    projection) → :class:`BertSelfAttentionAdapter`; ``causal`` defaults to the module's
    ``is_causal`` (BERT as a decoder), ``dropout`` to its attention dropout.

    :param module: the ``BertSelfAttention``-style module to replace (its trained weights start the new layer).
    :param attention: the layer type to convert to, one of :data:`~gpytorch_sgpa.transformer.ATTENTION_TYPES`
        (default ``"sgpa"``).
    """
    source: Any = module  # a transformers module: its attributes are set dynamically (nn.Module types them Tensor | Module)
    d_model = source.query.in_features
    if source.all_head_size != d_model:
        raise ValueError(f"convert needs num_heads * head_size = hidden size, got {source.all_head_size} != {d_model}")
    kwargs.setdefault("dropout", source.dropout.p)
    kwargs.setdefault("causal", bool(getattr(source, "is_causal", False)))
    value_bias = None if source.value.bias is None else source.value.bias.detach()
    layer = _kernel_layer(
        attention,
        d_model,
        source.num_attention_heads,
        source.query.weight.detach(),
        source.key.weight.detach(),
        source.value.weight.detach(),
        value_bias,
        kwargs,
        _bias(source.query),
        _bias(source.key),
    )
    return BertSelfAttentionAdapter(layer, source.config, getattr(source, "layer_idx", None))


def from_vit_attention(module: nn.Module, attention: str = "sgpa", **kwargs) -> ViTAttentionAdapter:
    """``ViTAttention`` (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``) → :class:`ViTAttentionAdapter`.

    :param module: the ``ViTAttention`` module to replace (its trained weights start the new layer).
    :param attention: the layer type to convert to, one of :data:`~gpytorch_sgpa.transformer.ATTENTION_TYPES`
        (default ``"sgpa"``).
    """
    source: Any = module  # a transformers module: its attributes are set dynamically (nn.Module types them Tensor | Module)
    d_model = source.q_proj.in_features
    if source.q_proj.out_features != d_model:
        raise ValueError(f"convert needs num_heads * head_dim = hidden size, got {source.q_proj.out_features} != {d_model}")
    kwargs.setdefault("dropout", float(source.attention_dropout))
    kwargs.setdefault("causal", bool(getattr(source, "is_causal", False)))
    value_bias = None if source.v_proj.bias is None else source.v_proj.bias.detach()
    layer = _kernel_layer(
        attention,
        d_model,
        source.num_attention_heads,
        source.q_proj.weight.detach(),
        source.k_proj.weight.detach(),
        source.v_proj.weight.detach(),
        value_bias,
        kwargs,
        _bias(source.q_proj),
        _bias(source.k_proj),
    )
    return ViTAttentionAdapter(layer, source.o_proj, source.config)


def from_gpt2_attention(module: nn.Module, attention: str = "sgpa", **kwargs) -> GPT2AttentionAdapter | None:
    """``GPT2Attention`` (fused ``c_attn`` Conv1D, ``c_proj``) → :class:`GPT2AttentionAdapter`,
    causal unless ``causal=False`` is given; the cross-attention variant is left (``None``).

    :param module: the ``GPT2Attention`` module to replace (its trained weights start the new layer).
    :param attention: the layer type to convert to, one of :data:`~gpytorch_sgpa.transformer.ATTENTION_TYPES`
        (default ``"sgpa"``).
    """
    source: Any = module  # a transformers module: its attributes are set dynamically (nn.Module types them Tensor | Module)
    if source.is_cross_attention:
        return None
    d_model = source.embed_dim
    weight = source.c_attn.weight.detach().T  # Conv1D holds (in, out)
    weight_q, weight_k, weight_v = weight.split(d_model, dim=0)
    bias = source.c_attn.bias
    value_bias = None if bias is None else bias.detach()[2 * d_model :]
    kwargs.setdefault("dropout", source.attn_dropout.p)
    kwargs.setdefault("causal", True)
    layer = _kernel_layer(
        attention,
        d_model,
        source.num_heads,
        weight_q,
        weight_k,
        weight_v,
        value_bias,
        kwargs,
        _bias(source.c_attn, slice(0, d_model)),
        _bias(source.c_attn, slice(d_model, 2 * d_model)),
    )
    return GPT2AttentionAdapter(layer, nn.Sequential(source.c_proj, source.resid_dropout), source.config, source.layer_idx)


def from_timm_attention(module: nn.Module, attention: str = "sgpa", **kwargs) -> TimmAttentionAdapter:
    """timm's ``Attention`` (fused ``qkv`` Linear, ``num_heads``, ``head_dim``, ``q_norm`` /
    ``k_norm``, ``attn_drop``, ``norm``, ``gate``, ``proj``, ``proj_drop``) →
    :class:`TimmAttentionAdapter`.  Query/key normalisation (``qk_norm=True``) has no counterpart
    in a kernel layer with a shared ``W_qk`` and raises.

    :param module: timm's ``Attention`` module to replace (its trained weights start the new layer).
    :param attention: the layer type to convert to, one of :data:`~gpytorch_sgpa.transformer.ATTENTION_TYPES`
        (default ``"sgpa"``).
    """
    source: Any = module  # a timm module: its attributes are set dynamically (nn.Module types them Tensor | Module)
    if not (isinstance(source.q_norm, nn.Identity) and isinstance(source.k_norm, nn.Identity)):
        raise ValueError(
            "convert does not support timm Attention with qk_norm: a kernel layer's queries and keys share "
            "one projection W_qk and have no normalisation"
        )
    d_model = source.qkv.in_features
    attn_dim = source.num_heads * source.head_dim
    if attn_dim != d_model:
        raise ValueError(f"convert needs num_heads * head_dim = dim, got {attn_dim} != {d_model}")
    weight_q, weight_k, weight_v = source.qkv.weight.detach().split(attn_dim, dim=0)
    bias = source.qkv.bias
    value_bias = None if bias is None else bias.detach()[2 * attn_dim :]
    kwargs.setdefault("dropout", source.attn_drop.p)
    layer = _kernel_layer(
        attention,
        d_model,
        source.num_heads,
        weight_q,
        weight_k,
        weight_v,
        value_bias,
        kwargs,
        _bias(source.qkv, slice(0, attn_dim)),
        _bias(source.qkv, slice(attn_dim, 2 * attn_dim)),
    )
    return TimmAttentionAdapter(layer, source.norm, getattr(source, "gate", None), source.proj, source.proj_drop)


#: what a DeBERTa-v2 conversion keeps and drops, written into the model's conversion record
DEBERTA_V2_NOTE = (
    "DeBERTa-v2: content-to-content attention converted to the kernel; the content-to-position and "
    "position-to-content terms of the relative position embeddings are dropped (the converted layers do not read "
    "rel_embeddings); encoder.rel_embeddings are kept, unused by attention"
)


# --------------------------------------------------------------------------- DistilBERT, ALBERT, DeBERTa-v2
class DistilBertSelfAttentionAdapter(ViTAttentionAdapter):
    """In place of ``DistilBertSelfAttention``: ``forward(hidden_states, attention_mask=None, **kwargs) ->
    (out_lin(context), weights)``, as :class:`ViTAttentionAdapter` with DistilBERT's ``out_lin`` as ``output``.

    :param attention: the package's kernel or SGPA layer that computes the heads.
    :param output: the replaced module's ``out_lin``, applied after the heads.
    :param config: the replaced module's Hugging Face config (read for ``output_attentions``).
    """


class AlbertAttentionAdapter(SelfAttentionAdapter):
    """In place of ``AlbertAttention``: ``forward(hidden_states, attention_mask=None, **kwargs) ->
    (LayerNorm(hidden_states + output_dropout(dense(context))), weights)``, ALBERT's own output path.

    :param attention: the package's kernel or SGPA layer that computes the heads.
    :param dense: the replaced module's ``dense`` output projection.
    :param output_dropout: the replaced module's ``output_dropout``.
    :param layer_norm: the replaced module's ``LayerNorm`` (of the residual sum).
    :param config: the replaced module's Hugging Face config (read for ``output_attentions``).
    """

    def __init__(self, attention, dense, output_dropout, layer_norm, config):
        super().__init__(attention, None)
        self.dense, self.output_dropout, self.LayerNorm = dense, output_dropout, layer_norm
        self.config = config

    def forward(self, hidden_states: Tensor, attention_mask=None, **kwargs):
        """``(LayerNorm(hidden_states + output_dropout(dense(context))), weights)``.

        :param hidden_states: the input of the attention block, ``(B, L, d_model)``.
        :param attention_mask: the Hugging Face attention mask (bool ``True`` = attend, or additive float ``0`` / very
            negative); ``None`` (the default): no mask.
        """
        _no_head_mask(kwargs)
        context, weights = self.attend(hidden_states, attention_mask, None, _output_attentions(self, kwargs))
        return self.LayerNorm(hidden_states + self.output_dropout(self.dense(context))), weights


class DebertaV2SelfAttentionAdapter(SelfAttentionAdapter):
    """In place of DeBERTa-v2's ``DisentangledSelfAttention``: ``forward(hidden_states, attention_mask,
    output_attentions=False, query_states=None, relative_pos=None, rel_embeddings=None) -> (context, weights)``,
    the context before ``DebertaV2SelfOutput``.  The relative-position arguments are accepted and not used (see
    :mod:`gpytorch_sgpa.adapters`); ``query_states`` other than ``None`` (the enhanced mask decoder) raises.

    :param attention: the package's kernel or SGPA layer that computes the heads.
    """

    #: what the conversion keeps and drops (collected into the model's ``config.sgpa`` record)
    conversion_note = DEBERTA_V2_NOTE

    def __init__(self, attention):
        super().__init__(attention, None)

    def forward(
        self, hidden_states: Tensor, attention_mask=None, output_attentions=False, query_states=None, relative_pos=None, rel_embeddings=None
    ):
        """``(context, weights)``: the heads' outputs ``(B, L, d_model)`` and, with ``output_attentions``, the kernel
        weights ``(B, H, L, L)`` of the posterior mean.

        :param hidden_states: the input of the attention block, ``(B, L, d_model)``.
        :param attention_mask: DeBERTa's mask ``(B, 1, L, L)`` (nonzero = attend, as the model builds it) or ``None``.
        :param output_attentions: whether to return the weights (the model passes it).
        :param query_states: must be ``None``: queries other than the hidden states are cross-attention.
        :param relative_pos: ignored: the relative-position terms are dropped by the conversion.
        :param rel_embeddings: ignored, as ``relative_pos``.
        """
        if query_states is not None and query_states is not hidden_states:
            raise ValueError("a converted DeBERTa-v2 self-attention got query_states other than hidden_states (cross-attention)")
        if attention_mask is not None and not (attention_mask.dtype == torch.bool or attention_mask.is_floating_point()):
            attention_mask = attention_mask.bool()  # the model's 0/1 integer mask, read as the module reads it
        return self.attend(hidden_states, attention_mask, None, bool(output_attentions))


def from_distilbert_self_attention(module: nn.Module, attention: str = "sgpa", **kwargs) -> DistilBertSelfAttentionAdapter:
    """``DistilBertSelfAttention`` (``q_lin``, ``k_lin``, ``v_lin``, ``out_lin``) → :class:`DistilBertSelfAttentionAdapter`.

    :param module: the module to replace (its trained weights start the new layer).
    :param attention: the layer type to convert to, one of :data:`~gpytorch_sgpa.transformer.ATTENTION_TYPES`
        (default ``"sgpa"``).
    """
    source: Any = module
    kwargs.setdefault("dropout", source.dropout.p)
    kwargs.setdefault("causal", False)
    layer = _from_linears(attention, source.q_lin, source.k_lin, source.v_lin, source.n_heads, kwargs)
    return DistilBertSelfAttentionAdapter(layer, source.out_lin, source.config)


def from_albert_attention(module: nn.Module, attention: str = "sgpa", **kwargs) -> AlbertAttentionAdapter:
    """``AlbertAttention`` (``query``, ``key``, ``value``, ``dense``, ``LayerNorm``) → :class:`AlbertAttentionAdapter`.

    :param module: the module to replace (its trained weights start the new layer).
    :param attention: the layer type to convert to, one of :data:`~gpytorch_sgpa.transformer.ATTENTION_TYPES`
        (default ``"sgpa"``).
    """
    source: Any = module
    kwargs.setdefault("dropout", source.attention_dropout.p)
    kwargs.setdefault("causal", False)
    layer = _from_linears(attention, source.query, source.key, source.value, source.num_attention_heads, kwargs)
    return AlbertAttentionAdapter(layer, source.dense, source.output_dropout, source.LayerNorm, source.config)


def from_deberta_v2_self_attention(module: nn.Module, attention: str = "sgpa", **kwargs) -> DebertaV2SelfAttentionAdapter:
    """DeBERTa-v2's ``DisentangledSelfAttention`` (``query_proj``, ``key_proj``, ``value_proj``) →
    :class:`DebertaV2SelfAttentionAdapter`: content-to-content attention becomes the kernel; the relative-position
    terms are dropped (see :mod:`gpytorch_sgpa.adapters`).

    :param module: the module to replace (its trained weights start the new layer).
    :param attention: the layer type to convert to, one of :data:`~gpytorch_sgpa.transformer.ATTENTION_TYPES`
        (default ``"sgpa"``).
    """
    source: Any = module
    kwargs.setdefault("dropout", source.dropout.p)
    kwargs.setdefault("causal", False)
    layer = _from_linears(attention, source.query_proj, source.key_proj, source.value_proj, source.num_attention_heads, kwargs)
    return DebertaV2SelfAttentionAdapter(layer)


def _from_linears(attention: str, query: nn.Linear, key: nn.Linear, value: nn.Linear, num_heads: int, kwargs: dict):
    """The kernel/SGPA layer of three ``nn.Linear`` projections of width ``d_model`` (no grouped heads)."""
    d_model = query.in_features
    if query.out_features != d_model:
        raise ValueError(f"convert needs num_heads * head_size = hidden size, got {query.out_features} != {d_model}")
    return _kernel_layer(
        attention,
        d_model,
        num_heads,
        query.weight.detach(),
        key.weight.detach(),
        value.weight.detach(),
        _bias(value),
        kwargs,
        _bias(query),
        _bias(key),
    )


# --------------------------------------------------------------------------- Llama-style decoders
def _rotate_half(x: Tensor) -> Tensor:
    """:math:`\\operatorname{rot}(x) = (-x_{e/2:}, x_{:e/2})` over the last dimension."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class RotaryAttentionAdapter(SelfAttentionAdapter):
    r"""In place of a Llama-style attention (``LlamaAttention``, ``MistralAttention``, ``Qwen2Attention``):
    ``forward(hidden_states, position_embeddings, attention_mask=None, cache=None, **kwargs) -> (output, weights)``
    with ``o_proj`` after the heads.  The queries (= keys) of each head are rotated by the model's rotary
    embeddings before the kernel, :math:`\tilde q_i = q_i \cos\theta_i + \operatorname{rot}(q_i) \sin\theta_i`; with a
    cache (``use_cache=True``, ``generate``) the rotated queries and the values of the prefix are stored and later
    calls compute only the new positions (as :class:`~gpytorch_sgpa.adapters.GPT2AttentionAdapter`).

    :param attention: the package's kernel or SGPA layer that computes the heads (causal by default).
    :param output: the replaced module's ``o_proj``, applied after the heads.
    :param config: the replaced module's Hugging Face config (read for ``output_attentions``).
    :param layer_idx: the layer's index in the Hugging Face key/value cache.
    """

    output: nn.Module

    def __init__(self, attention, output, config, layer_idx=None):
        super().__init__(attention, output, layer_idx)
        self.config = config

    @contextmanager
    def _rotated(self, cos: Tensor, sin: Tensor):
        """Rotate every ``(B, L, d_model)`` output of the layer's ``qk_proj`` (a LoRA layer around it included) while
        the context runs; the global keys (projected as ``(H M, d_model)``) are left."""
        layer = self.attention
        heads, head_dim = layer.num_heads, layer.head_dim
        if cos.shape[-1] != head_dim or sin.shape != cos.shape:
            raise ValueError(
                f"position_embeddings must be (cos, sin) of head size {head_dim}, got {tuple(cos.shape)} and {tuple(sin.shape)}"
            )

        def rotate(module, args, output):
            if output.dim() != 3 or output.shape[1] != cos.shape[-2]:
                return None
            q = output.view(*output.shape[:2], heads, head_dim)
            c, s = cos.unsqueeze(2).to(q.dtype), sin.unsqueeze(2).to(q.dtype)
            return (q * c + _rotate_half(q) * s).reshape(output.shape)

        handle = layer.qk_proj.register_forward_hook(rotate)
        try:
            yield
        finally:
            handle.remove()

    def forward(self, hidden_states: Tensor, position_embeddings=None, attention_mask=None, cache=None, **kwargs):
        """``(o_proj(context), weights)``; ``cache`` (or ``past_key_values``) as the family's attention takes it.

        :param hidden_states: the input of the attention block, ``(B, L, d_model)``.
        :param position_embeddings: the rotary embeddings ``(cos, sin)``, each ``(B, L, head_dim)``, as the model
            passes them (required).
        :param attention_mask: the Hugging Face attention mask (bool ``True`` = attend, or additive float ``0`` / very
            negative); ``None`` (the default): the causal structure only.
        :param cache: the Hugging Face key/value cache (also accepted as ``past_key_values``); ``None`` (the default): none.
        """
        if position_embeddings is None:
            raise ValueError("a converted Llama-style attention needs position_embeddings=(cos, sin), as the model passes them")
        cache = kwargs.pop("past_key_values", cache)
        _no_head_mask(kwargs)
        cache = None if cache is None else _cache_of(cache)
        cos, sin = position_embeddings
        with self._rotated(cos, sin):
            context, weights = self.attend(hidden_states, attention_mask, cache, _output_attentions(self, kwargs))
        return self.output(context), weights


def _repeat_heads(tensor: Tensor, groups: int, head_dim: int) -> Tensor:
    """Rows of ``H_kv`` heads (a weight ``(H_kv e, d)`` or a bias ``(H_kv e,)``) repeated to ``H = groups H_kv`` heads,
    head ``h`` from shared head ``h // groups`` (``repeat_kv``'s order)."""
    shared = tensor.reshape(-1, head_dim, *tensor.shape[1:])
    return shared.repeat_interleave(groups, dim=0).reshape(-1, *tensor.shape[1:])


def from_rotary_attention(module: nn.Module, attention: str = "sgpa", **kwargs) -> RotaryAttentionAdapter:
    """A Llama-style attention (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``, ``head_dim``, grouped key/value heads,
    rotary embeddings) → :class:`RotaryAttentionAdapter`, causal unless ``causal=False`` is given.

    :param module: the module to replace (its trained weights start the new layer).
    :param attention: the layer type to convert to, one of :data:`~gpytorch_sgpa.transformer.ATTENTION_TYPES`
        (default ``"sgpa"``).
    """
    source: Any = module
    d_model = source.q_proj.in_features
    head_dim = source.head_dim
    if source.q_proj.out_features != d_model:
        raise ValueError(
            f"convert needs num_attention_heads * head_dim = hidden size, got {source.q_proj.out_features} != {d_model} "
            "(a config with another head_dim)"
        )
    groups = source.num_key_value_groups
    weight_k = _repeat_heads(source.k_proj.weight.detach(), groups, head_dim)
    weight_v = _repeat_heads(source.v_proj.weight.detach(), groups, head_dim)
    bias_k, bias_v = (None if b is None else _repeat_heads(b, groups, head_dim) for b in (_bias(source.k_proj), _bias(source.v_proj)))
    kwargs.setdefault("dropout", float(source.attention_dropout))
    kwargs.setdefault("causal", True)
    layer = _kernel_layer(
        attention,
        d_model,
        d_model // head_dim,
        source.q_proj.weight.detach(),
        weight_k,
        weight_v,
        bias_v,
        kwargs,
        _bias(source.q_proj),
        bias_k,
    )
    return RotaryAttentionAdapter(layer, source.o_proj, source.config, source.layer_idx)


def _from_adapter(module: SelfAttentionAdapter, attention: str = "sgpa", **kwargs):
    return module.reconverted(attention, **kwargs)


def _register_builtin() -> None:
    """The adapters of this module (:mod:`gpytorch_sgpa.dropin` registers ``nn.MultiheadAttention``'s and its own)."""
    _BY_TYPE[SelfAttentionAdapter] = _from_adapter
    for family in (
        "bert.modeling_bert.Bert",
        "roberta.modeling_roberta.Roberta",
        "xlm_roberta.modeling_xlm_roberta.XLMRoberta",
        "camembert.modeling_camembert.Camembert",
        "electra.modeling_electra.Electra",
    ):
        _BY_NAME[f"transformers.models.{family}SelfAttention"] = from_bert_self_attention
    _BY_NAME["transformers.models.vit.modeling_vit.ViTAttention"] = from_vit_attention
    _BY_NAME["transformers.models.gpt2.modeling_gpt2.GPT2Attention"] = from_gpt2_attention
    _BY_NAME["timm.layers.attention.Attention"] = from_timm_attention
    families = "transformers.models"
    _BY_NAME[f"{families}.distilbert.modeling_distilbert.DistilBertSelfAttention"] = from_distilbert_self_attention
    _BY_NAME[f"{families}.albert.modeling_albert.AlbertAttention"] = from_albert_attention
    _BY_NAME[f"{families}.deberta_v2.modeling_deberta_v2.DisentangledSelfAttention"] = from_deberta_v2_self_attention
    for family in ("llama.modeling_llama.Llama", "mistral.modeling_mistral.Mistral", "qwen2.modeling_qwen2.Qwen2"):
        _BY_NAME[f"{families}.{family}Attention"] = from_rotary_attention


# --------------------------------------------------------------------------- attention maps of transformers models
def record_attentions(root: nn.Module, replaced: dict[int, tuple[nn.Module, nn.Module]]) -> None:
    """Keep ``output_attentions`` of converted ``transformers`` models: their models record the
    weights with forward hooks on the attention modules' classes, installed at the first request.
    Hooks already on a replaced module were moved to its replacement by ``convert``; where the model
    has not installed them yet, the same recording hook goes on the replacement now.

    :param root: the converted model (every ``transformers`` ``PreTrainedModel`` under it is handled).
    :param replaced: the replacements ``convert`` made, ``{id(old): (old, new)}``.
    """
    if "transformers" not in sys.modules:  # then no model of it is in the tree; do not import it
        return
    registry = can_record_registry()
    from transformers.modeling_utils import PreTrainedModel
    from transformers.utils.output_capturing import OutputRecorder

    originals = {id(new): old for old, new in replaced.values()}
    for model in root.modules():
        if not isinstance(model, PreTrainedModel) or output_capturing_installed(model):
            continue
        tasks = []
        for key, specs in registry.get(model).items():
            for spec in specs if isinstance(specs, list) else [specs]:
                if not isinstance(spec, OutputRecorder):
                    index = 0 if "hidden_states" in key else 1
                    spec = OutputRecorder(
                        target_class=None if isinstance(spec, str) else spec,  # type: ignore[arg-type]  # transformers itself passes None
                        index=index,
                        class_name=spec if isinstance(spec, str) else None,
                    )
                tasks.append((key, spec))
        for name, module in _own_modules(model, PreTrainedModel):
            old = originals.get(id(module))
            if old is None:
                continue
            for key, spec in tasks:
                by_class = spec.target_class is not None and isinstance(old, spec.target_class)
                by_name = spec.class_name is not None and name.endswith(spec.class_name)
                layer_ok = spec.layer_name is None or f".{spec.layer_name.strip('.')}." in f".{name}."
                if (by_class or by_name) and layer_ok:
                    module.register_forward_hook(_OutputCapture(key, spec.index, spec.capture_initial_hidden_state))


class _OutputCapture:
    """``transformers``' output-recording forward hook (``install_output_capuring_hook``), built at its
    first call; unlike the closure it wraps it pickles, so ``torch.save`` of a converted model works."""

    def __init__(self, key: str, index: int, capture_initial_hidden_state: bool):
        self.arguments = (key, index, capture_initial_hidden_state)
        self.hook = None

    def __call__(self, module, args, output):
        if self.hook is None:
            from transformers.utils.output_capturing import install_output_capuring_hook

            holder = nn.Module()
            install_output_capuring_hook(holder, *self.arguments)
            (self.hook,) = forward_hooks(holder)
        return self.hook(module, args, output)

    def __getstate__(self):
        return {"arguments": self.arguments, "hook": None}


def _own_modules(model: nn.Module, stop: type, prefix: str = ""):
    """``(name, module)`` under ``model`` without descending into nested ``stop`` instances."""
    for name, child in model.named_children():
        path = f"{prefix}.{name}"
        yield path, child
        if not isinstance(child, stop):
            yield from _own_modules(child, stop, path)


_register_builtin()
