r"""SGPA inside a user's own PyTorch Transformer (thesis ch. 3 without the package's model classes).

* :class:`MultiheadSGPAttention` has :class:`torch.nn.MultiheadAttention`'s call convention
  (``forward(query, key, value, key_padding_mask, need_weights, attn_mask, average_attn_weights,
  is_causal) -> (output, weights)``, ``batch_first``, unbatched inputs) and holds one of the
  package's layers (:class:`~gpytorch_sgpa.attention.SGPAttention`,
  :class:`~gpytorch_sgpa.mle_attention.KernelAttention`, ...), so it can be the ``self_attn`` of
  :class:`torch.nn.TransformerEncoderLayer` (stacked by :class:`torch.nn.TransformerEncoder`);
* :func:`convert` swaps the ``nn.MultiheadAttention`` modules of an existing model for such
  adapters initialised from the trained weights (the thesis starts SGPA from an MLE network,
  App. B.4), and the self-attention of Hugging Face and timm models for the adapters of
  :mod:`gpytorch_sgpa.adapters`;
* :func:`kl_divergence` / :func:`global_kl_divergence` sum, after a forward pass, the KL terms of
  every SGPA layer of a module tree, so the caller's ``forward`` keeps its signature;
  :class:`~gpytorch_sgpa.elbo.SGPAELBO` takes the first and reads the second itself.

In the package's own Transformers the global inducing inputs pass through the block's feature
map :math:`G_\phi` (thesis eq. (3.16), :math:`q = k_a = G_\phi(F) W_{qk}` and :math:`k_g = G_\phi(Z_g) W_{qk}`); in an
adapter they are parameters in the attention's input space (:math:`G_\phi` = identity), as a stock encoder layer has no
separate :math:`G_\phi`.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor, nn

from probseq._compat import child_modules, move_forward_hooks
from probseq._validation import check_int

from ._outputs import output_logits
from .adapters import (
    adapter_for,
    child_defaults,
    copy_kernel,
    record_attentions,
    register_adapter,
    sgpa_start,
    start_at_mean,
    supported_modules,
)
from .attention import KernelAttention, ScaledDotProductAttention, SGPAttention
from .conversion_record import record_conversion
from .kernel_scale import calibrate_kernel_scales, forget_softmax_projections
from .model_loss import install_elbo_loss
from .transformer import ATTENTION_TYPES, build_attention

__all__ = ["MultiheadSGPAttention", "convert", "global_kl_divergence", "kl_divergence"]


def _boolean_mask(mask: Tensor, name: str) -> Tensor:
    """``True`` = not allowed, from a bool mask or an additive float mask of ``0`` / ``-inf``."""
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(mask).__name__}")
    if mask.dtype == torch.bool:
        return mask
    if not mask.is_floating_point():
        raise TypeError(f"{name} must be a bool tensor or a float tensor of 0 / -inf, got {mask.dtype}")
    blocked = mask == float("-inf")
    if not (blocked | (mask == 0)).all():
        raise ValueError(
            f"{name} holds additive biases other than 0 and -inf; kernel and SGPA attention have no "
            "softmax to add them to, so only masks (bool, or float 0 / -inf) are supported"
        )
    return blocked


def _same_values(other, query: Tensor) -> bool:
    if other is query:
        return True
    if not isinstance(other, Tensor) or other.shape != query.shape or other.dtype != query.dtype:
        return False
    same_view = other.data_ptr() == query.data_ptr() and other.stride() == query.stride()
    return same_view or torch.equal(other, query)


class MultiheadSGPAttention(nn.Module):
    r"""Self-attention with :class:`torch.nn.MultiheadAttention`'s interface around a package layer.

    ``attention`` is a name of :data:`~gpytorch_sgpa.transformer.ATTENTION_TYPES` (``"sgpa"``:
    decoupled orthogonal SGPA, ``"sgpa-dsvgp"``, ``"sgpa-standard"`` (needs ``max_len``),
    ``"kernel"``, ``"sdp"``); ``attention_kwargs`` go to that layer (``kernel``, ``num_global``,
    ``sampler``, ``causal``, ...).  The layer is ``self.attention``; its KL of the last call is
    collected by :func:`kl_divergence`.

    ``forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
    average_attn_weights=True, is_causal=False)`` returns ``(output, None)``:

    * self-attention only: ``key`` and ``value`` must equal ``query`` (SGPA's keys are its
      queries, :math:`q = k_a = s W_{qk}`, thesis eq. (3.16); Chen & Li (2023), SGPA); cross-attention raises;
    * ``query``: ``(L, N, E)``, or ``(N, L, E)`` with ``batch_first=True``, or unbatched ``(L, E)``;
    * ``key_padding_mask``: ``(N, L)`` (``(L,)`` unbatched), bool (``True`` = ignore) or float
      ``0`` / ``-inf`` (what ``nn.TransformerEncoder`` passes);
    * ``attn_mask`` / ``is_causal``: the only mask a layer supports is its own structure: none for
      a layer built with ``causal=False``, the causal mask (``(L, L)``, ``True`` / ``-inf`` above the
      diagonal, e.g. ``nn.Transformer.generate_square_subsequent_mask``) or ``is_causal=True`` for
      one built with ``causal=True``; anything else raises (no silent reinterpretation);
    * weights: ``None`` whatever ``need_weights``: an SGPA output is a GP sample, not a weighted
      average, so there is no attention matrix to return.

    ``in_proj_weight`` / ``in_proj_bias`` are ``None`` and ``_qkv_same_embed_dim`` is ``True``:
    ``nn.TransformerEncoderLayer`` reads them to decide on its fused inference kernel, which would
    bypass this module; ``in_proj_bias is None`` switches that kernel off.

    :param embed_dim: the model width :math:`E` (``d_model``), a multiple of ``num_heads``.
    :param num_heads: the number of attention heads.
    :param dropout: the layer's dropout probability, in ``[0, 1)`` (passed to the package layer).
    :param batch_first: whether inputs are ``(N, L, E)`` rather than ``(L, N, E)`` (default ``False``, as
        :class:`torch.nn.MultiheadAttention`).
    :param attention: the package layer's type, one of :data:`~gpytorch_sgpa.transformer.ATTENTION_TYPES` (default
        ``"sgpa"``).
    """

    attention: ScaledDotProductAttention | KernelAttention | SGPAttention

    def __init__(
        self, embed_dim: int, num_heads: int, dropout: float = 0.0, batch_first: bool = False, attention: str = "sgpa", **attention_kwargs
    ):
        super().__init__()
        if not isinstance(batch_first, bool):
            raise TypeError(f"batch_first must be a bool, got {type(batch_first).__name__}")
        if not isinstance(attention, str) or attention not in ATTENTION_TYPES:
            raise ValueError(f"attention must be one of {ATTENTION_TYPES}, got {attention!r}")
        layer = build_attention(attention, embed_dim, num_heads, dropout=dropout, attention_kwargs=attention_kwargs)
        self.attention = cast(ScaledDotProductAttention | KernelAttention | SGPAttention, layer)  # what a name builds
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.batch_first = batch_first
        self._qkv_same_embed_dim = True
        self.in_proj_weight = None
        self.in_proj_bias = None

    @property
    def causal(self) -> bool:
        return self.attention.causal

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        # convert keeps the value bias of nn.MultiheadAttention (``v_proj`` has one), which 0.1.0
        # dropped: a state dict saved by 0.1.0 holds none, which is a zero bias; one saved with it
        # gives a layer built without a bias (a plain constructor call) its bias.
        key = prefix + "attention.v_proj.bias"
        v_proj = getattr(self.attention, "v_proj", None)
        if isinstance(v_proj, nn.Linear):
            if v_proj.bias is not None and key not in state_dict and prefix + "attention.v_proj.weight" in state_dict:
                state_dict[key] = torch.zeros_like(v_proj.bias)
            elif v_proj.bias is None and key in state_dict:
                weight = v_proj.weight
                v_proj.bias = nn.Parameter(weight.new_zeros(weight.shape[0]))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)

    def _wants_causal(self, attn_mask: Tensor | None, is_causal: bool, length: int, device) -> bool:
        if attn_mask is None:
            return bool(is_causal)
        blocked = _boolean_mask(attn_mask, "attn_mask")
        causal = torch.ones(length, length, dtype=torch.bool, device=device).triu(1)
        if blocked.shape != (length, length) or not torch.equal(blocked, causal):
            raise ValueError(
                f"attn_mask must be None or the causal mask of shape ({length}, {length}); SGPA's "
                "posterior conditions on all keys (causal=False) or on the prefix (causal=True) only"
            )
        return True

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = True,
        attn_mask: Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ):
        """``(output, None)``: the layer output, shaped as ``query``, and no attention weights (see the class).

        :param query: the input, ``(L, N, E)``, ``(N, L, E)`` with ``batch_first=True``, or unbatched ``(L, E)``.
        :param key: must equal ``query`` (self-attention only).
        :param value: must equal ``query`` (self-attention only).
        :param key_padding_mask: ``(N, L)`` (``(L,)`` unbatched), bool (``True`` = ignore) or float ``0`` / ``-inf``;
            ``None`` (the default): no padding.
        :param need_weights: ignored: no attention weights are returned (accepted for the interface).
        :param attn_mask: ``None`` (the default) or, for a layer built with ``causal=True``, the causal mask ``(L, L)``
            (``True`` / ``-inf`` above the diagonal); anything else raises.
        :param average_attn_weights: ignored (accepted for the interface).
        :param is_causal: whether the caller asks for causal attention; must match the layer's ``causal``.
        """
        if not isinstance(query, Tensor) or query.dim() not in (2, 3):
            raise ValueError(
                f"query must be a tensor (L, E) or {'(N, L, E)' if self.batch_first else '(L, N, E)'}, "
                f"got {getattr(query, 'shape', type(query).__name__)}"
            )
        if not (_same_values(key, query) and _same_values(value, query)):
            raise ValueError(
                "key and value must equal query: SGPA is self-attention (its keys are its queries, "
                "thesis eq. (3.16): q = k_a = G_φ(F) W_qk)"
            )
        unbatched = query.dim() == 2
        x = query.unsqueeze(0) if unbatched else (query if self.batch_first else query.transpose(0, 1))
        if key_padding_mask is not None:
            key_padding_mask = _boolean_mask(key_padding_mask, "key_padding_mask")
            if unbatched:
                key_padding_mask = key_padding_mask.unsqueeze(0)
            if key_padding_mask.shape != x.shape[:2]:
                raise ValueError(f"key_padding_mask must have shape {tuple(x.shape[:2])} (batch, L), got {tuple(key_padding_mask.shape)}")
        if self._wants_causal(attn_mask, is_causal, x.shape[1], x.device) != self.causal:
            raise ValueError(
                f"the attention layer was built with causal={self.causal}, but attn_mask/is_causal ask for "
                f"{'a causal' if not self.causal else 'no'} mask; build it (or convert) with causal={not self.causal}"
            )
        output, _ = self.attention(x, key_padding_mask=key_padding_mask)
        output = output.squeeze(0) if unbatched else (output if self.batch_first else output.transpose(0, 1))
        return output, None


def _sgpa_layers(module: nn.Module) -> list[SGPAttention]:
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    layers = [m for m in module.modules() if isinstance(m, SGPAttention)]
    if not layers:
        raise ValueError(f"{type(module).__name__} holds no SGPAttention layer (use gpytorch_sgpa.convert first)")
    return layers


def _recorded(module: nn.Module, part: str) -> Tensor:
    total: Tensor | None = None
    for layer in _sgpa_layers(module):
        value = getattr(layer.last_kl, part)
        if value is None:
            raise ValueError(
                "an SGPAttention layer of the module has not run a forward pass since it was "
                "built or copied; run the model's forward before collecting its KL"
            )
        if torch.is_grad_enabled() and value.grad_fn is None and any(p.requires_grad for p in layer.parameters()):
            raise RuntimeError(
                "the KL recorded by an SGPAttention layer comes from a forward pass without gradients (e.g. an "
                "evaluation pass after the training forward), so a loss built from it would not train the KL: "
                "collect kl_divergence(model) right after the forward whose logits enter the loss"
            )
        total = value if total is None else total + value
    return cast(Tensor, total)  # sgpa_layers found at least one layer


def kl_divergence(module: nn.Module) -> Tensor:
    """Sum of the KL terms (thesis App. B.1.2, the KL of the SGPA posterior of Chen & Li (2023); batch-mean per
    sequence) of every SGPA layer in ``module``'s tree, from each layer's most recent forward call (a scalar carrying
    gradients).

    Use it right after the forward pass whose ELBO it enters:
    ``elbo(logits, gpytorch_sgpa.kl_divergence(model), y)``.  A layer called several times in one
    pass contributes its last call only. Collected with gradients enabled after a forward pass that
    ran without them (an evaluation pass in between), it raises instead of returning a KL that
    would not train.

    :param module: the model (or layer) whose SGPA layers' KL terms are summed; it must hold at least one.
    """
    return _recorded(module, "total")


def global_kl_divergence(module: nn.Module) -> Tensor:
    """The part of :func:`kl_divergence` from the global inducing variables (shared by all
    sequences, so ``SGPAELBO(kl_weighting="decomposed")`` divides it by ``num_data``).

    :param module: the model (or layer) whose SGPA layers' global KL parts are summed; it must hold at least one.
    """
    return _recorded(module, "global_")


@torch.no_grad()
def predict_proba(model: nn.Module, *inputs, num_samples: int = 10, **kwargs) -> Tensor:
    r"""Class probabilities of any model with SGPA layers, averaged over ``num_samples`` posterior
    samples: :math:`\frac{1}{S} \sum_s \operatorname{softmax}(\text{logits}_s)` with :math:`\text{logits}_s` from the
    model's own ``forward(*inputs,
    **kwargs)`` (a tensor, the first element of a tuple, or an output with ``.logits`` as Hugging
    Face's). Runs in eval mode (restored afterwards); inside :func:`posterior_mean` one pass suffices.

    :param model: the model with SGPA layers; its ``forward`` returns logits ``(..., num_classes)``.
    :param num_samples: the number of posterior samples (forward passes) averaged, a positive int (default 10).
    """
    _sgpa_layers(model)
    check_int(num_samples, "num_samples")
    training = model.training
    model.eval()
    try:
        total: Tensor | None = None
        for _ in range(num_samples):
            probabilities = torch.softmax(output_logits(model(*inputs, **kwargs)), dim=-1)
            total = probabilities if total is None else total + probabilities
    finally:
        model.train(training)
    return cast(Tensor, total) / num_samples  # num_samples >= 1 passes


def _split_in_projection(mha: nn.MultiheadAttention) -> tuple[Tensor, Tensor, Tensor]:
    if not mha._qkv_same_embed_dim:
        raise ValueError("convert needs nn.MultiheadAttention with kdim = vdim = embed_dim (self-attention)")
    if mha.bias_k is not None or mha.add_zero_attn:
        raise ValueError("convert does not support nn.MultiheadAttention with add_bias_kv or add_zero_attn")
    weight_q, weight_k, weight_v = mha.in_proj_weight.detach().chunk(3, dim=0)
    return weight_q, weight_k, weight_v


def _from_multihead(mha: nn.MultiheadAttention, attention: str, kwargs: dict) -> MultiheadSGPAttention:
    weight_q, weight_k, weight_v = _split_in_projection(mha)
    bias_v = None if mha.in_proj_bias is None else mha.in_proj_bias.detach()[2 * mha.embed_dim :]
    kwargs.setdefault("dropout", mha.dropout)
    cov_init = sgpa_start(attention, kwargs)
    adapter = MultiheadSGPAttention(mha.embed_dim, mha.num_heads, batch_first=mha.batch_first, attention=attention, **kwargs)
    layer = adapter.attention
    if not isinstance(layer, (KernelAttention, SGPAttention)):  # the layers with a shared W_qk
        raise ValueError(f"convert initialises kernel or SGPA attention (shared W_qk), not {attention!r}")
    if bias_v is not None:
        layer.v_proj = nn.Linear(mha.embed_dim, mha.embed_dim)
    adapter.to(device=weight_v.device, dtype=weight_v.dtype)  # first: the copies keep every digit
    with torch.no_grad():
        layer.qk_proj.weight.copy_(0.5 * (weight_q + weight_k))
        layer.v_proj.weight.copy_(weight_v)
        if bias_v is not None:
            layer.v_proj.bias.copy_(bias_v)
        layer.out_proj.load_state_dict(mha.out_proj.state_dict())
    start_at_mean(layer, cov_init)
    bias_q, bias_k = (None, None) if mha.in_proj_bias is None else mha.in_proj_bias.detach().chunk(3)[:2]
    layer._softmax_query_key = (weight_q, bias_q, weight_k, bias_k)  # for calibration_inputs, while convert runs
    return adapter


def _from_kernel_adapter(old: MultiheadSGPAttention, source: KernelAttention, attention: str, kwargs: dict) -> MultiheadSGPAttention:
    if "kernel" in kwargs:
        raise ValueError("kernel must not be given when converting kernel attention: its trained kernel is kept")
    kwargs.setdefault("dropout", source.dropout.p)
    kwargs.setdefault("causal", source.causal)
    cov_init = sgpa_start(attention, kwargs)
    adapter = MultiheadSGPAttention(old.embed_dim, old.num_heads, batch_first=old.batch_first, attention=attention, **kwargs)
    layer = adapter.attention
    if not isinstance(layer, (KernelAttention, SGPAttention)):  # "sdp" has no W_qk to copy
        raise ValueError(f"convert initialises kernel or SGPA attention (shared W_qk), not {attention!r}")
    weight = source.qk_proj.weight
    if source.v_proj.bias is not None:
        layer.v_proj = nn.Linear(old.embed_dim, old.embed_dim)
    adapter.to(device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        for name in ("qk_proj", "v_proj", "out_proj"):
            getattr(layer, name).load_state_dict(getattr(source, name).state_dict())
    copy_kernel(layer, source)
    start_at_mean(layer, cov_init)
    return adapter


def _multihead_adapter(module: nn.MultiheadAttention, attention: str = "sgpa", **kwargs) -> MultiheadSGPAttention:
    return _from_multihead(module, attention, kwargs)


def _kernel_adapter(module: MultiheadSGPAttention, attention: str = "sgpa", **kwargs) -> MultiheadSGPAttention | None:
    """Kernel attention in a :class:`MultiheadSGPAttention` becomes SGPA (or another kernel layer); others stay."""
    source = module.attention
    if isinstance(source, KernelAttention) and attention != "kernel":
        return _from_kernel_adapter(module, source, attention, kwargs)
    return None


register_adapter(nn.MultiheadAttention, _multihead_adapter)
register_adapter(MultiheadSGPAttention, _kernel_adapter)


def convert(module: nn.Module, attention: str = "sgpa", calibration_inputs=None, **attention_kwargs) -> nn.Module:
    r"""Swap, in place, the self-attention modules of ``module`` for kernel or SGPA adapters and
    return ``module`` (or the replacement when ``module`` is itself an attention module).

    Converted: every module whose type has an adapter (:mod:`gpytorch_sgpa.adapters`, most specific
    class first; :func:`~gpytorch_sgpa.register_adapter` adds one): ``nn.MultiheadAttention`` (→
    :class:`MultiheadSGPAttention`; in ``nn.TransformerDecoderLayer`` the self-attention only, causal
    by default, the cross-attention left as it is), the self-attention of Hugging Face BERT-style
    encoders, DistilBERT, ALBERT, DeBERTa-v2, ViT, GPT-2 and the Llama-style decoders (Llama, Mistral,
    Qwen2) and of timm's ViT; and every kernel-attention adapter when ``attention``
    is not ``"kernel"``: the thesis's path, MLE kernel attention first, then SGPA from its weights.
    ``attention`` and ``attention_kwargs`` are those of :class:`MultiheadSGPAttention` (e.g.
    ``num_global=32``, ``"sgpa-dsvgp"``, ``sampler="decomposed"``, ``causal=True`` for a causal
    model); ``dropout``, ``batch_first`` and the causal structure default to the replaced module's.
    A replacement starts in the training or evaluation mode of the module it replaces, and forward
    hooks and pre-hooks of that module move to it (it has the same call convention).

    Initialisation from kernel attention (the thesis's path, App. B.4): :math:`W_{qk}`, :math:`W_v` (and its
    bias), the output projection and the kernel hyperparameters are copied, and the converted model
    computes the kernel network's function: inside :func:`posterior_mean` its outputs are the
    kernel network's, for every variant.  Standard SGPA and DSVGP: their posterior mean is
    :math:`K_{qk} v_a` (thesis eqs. (3.4), (B.14)).  Orthogonal SGPA (the default): its mean
    :math:`K_{qa} v_a + K_{qg} (v_g - K_{gg}^{-1} K_{ga} v_a)` (thesis eq. (3.15), the orthogonally decoupled
    posterior) carries a correction that no
    parameter :math:`v_g` cancels for every input (:math:`K_{gg}^{-1} K_{ga} v_a` varies with the sequence), so the
    layer gets a learnable per-head mean gate :math:`\gamma`,
    :math:`m = K_{qa} v_a + \gamma K_{qg} (v_g - K_{gg}^{-1} K_{ga} v_a)`,
    started at :math:`\gamma = 0` (``mean_gate=0.0``; ``mean_gate=None`` gives the thesis's ungated mean).  For
    every :math:`\gamma` this is the mean of thesis eq. (3.15) with the global mean parameter
    :math:`\gamma v_g + (1 - \gamma) K_{gg}^{-1} K_{ga} v_a`,
    whose KL the layer computes (:class:`~gpytorch_sgpa.attention.SGPAttention`), and at :math:`\gamma = 0`
    :math:`\partial m / \partial \gamma \ne 0`: the first ELBO step moves :math:`\gamma`, then :math:`v_g` and
    :math:`Z_g` get the likelihood's gradients.  The global covariance of decoupled SGPA starts at :math:`C = c I`
    (whitened, the default: :math:`S_g = c^2 K_{gg}`) with :math:`c` = ``global_cov_init``, default 0.1, so the
    samples start near the mean;
    ``global_cov_init=None`` keeps the random start of ``variational_init_std``.  SGPA's other
    variational parameters start as in :class:`SGPAttention`.

    From softmax attention (separate :math:`W_q`, :math:`W_k`): :math:`W_{qk} = (W_q + W_k) / 2`, :math:`W_v` with its
    bias and the output path are copied; the shared query/key bias is dropped (a stationary kernel
    does not see a common shift of queries and keys).  The function computed changes (softmax →
    kernel), so fine-tune afterwards.  Converted to SGPA in one step, a layer starts as from kernel
    attention (mean gate 0, ``global_cov_init``): its posterior mean is the kernel network that
    ``convert(..., attention="kernel")`` builds with the same ``calibration_inputs``; the measured
    recipe fine-tunes that kernel network before SGPA (see the README).  The kernel's scale: by
    default the ``kernel_init`` rule of :func:`~gpytorch_sgpa.kernels.make_attention_kernel`; with
    ``calibration_inputs`` (what the model is called with: a tensor, a tuple of positional arguments
    or a dict of keyword arguments; a batch of training inputs) each layer's length and output scales
    are set, per head, so that the spread of the kernel's log-weights over the keys equals that of the
    trained logits :math:`q \cdot k / \sqrt{d}` and a query's weights sum to 1 in geometric mean, as softmax weights do
    (:mod:`gpytorch_sgpa.kernel_scale`).
    To decoupled SGPA, ``calibration_inputs`` also places each head's global inducing inputs on
    tokens of the layer's inputs (the mean is unchanged: the gate is 0).
    State dicts of converted ``nn.MultiheadAttention`` saved by 0.1.0, which dropped the value bias,
    still load (as a zero bias).

    In a Hugging Face model the conversion is recorded in ``model.config`` (``config.sgpa``), so
    ``save_pretrained`` keeps it and :func:`gpytorch_sgpa.from_pretrained` rebuilds the converted
    model (:mod:`gpytorch_sgpa.pretrained`); ``torch.save`` of the whole model works as well.

    ``nn.TransformerEncoder``\ s in the tree get ``use_nested_tensor = False``: their nested-tensor
    inference path would bypass the new attention modules.

    :param module: the model (or a single attention module) to convert in place.
    :param attention: the layer type to convert to, one of :data:`~gpytorch_sgpa.transformer.ATTENTION_TYPES` (default
        ``"sgpa"``: decoupled orthogonal SGPA).
    :param calibration_inputs: what ``module`` is called with on a batch of training inputs (a tensor, a tuple of
        positional arguments or a dict of keyword arguments), to calibrate the kernels' scales and place the global
        inducing inputs; ``None`` (the default): no calibration.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    if not isinstance(attention, str) or attention not in ATTENTION_TYPES:
        raise ValueError(f"attention must be one of {ATTENTION_TYPES}, got {attention!r}")

    def replacement(child: nn.Module, defaults: dict) -> nn.Module | None:
        adapter = adapter_for(child)
        if adapter is None:
            return None
        new = adapter(child, attention, **{**defaults, **attention_kwargs})
        if new is not None and not isinstance(new, nn.Module):
            raise TypeError(f"the adapter of {type(child).__name__} returned {type(new).__name__}, not an nn.Module")
        if new is not None:
            new.train(child.training)  # an evaluation-mode model stays in evaluation mode (dropout off)
            if new is not child:
                move_forward_hooks(child, new)
        return new

    root = replacement(module, {})
    if root is not None:
        return _finish(root, calibration_inputs)
    replaced = {}  # id(old) -> (old, new): a module shared by several parents stays shared
    for parent in list(module.modules()):
        if isinstance(parent, nn.TransformerEncoder):
            parent.use_nested_tensor = False
        for name, child in list(child_modules(parent).items()):  # named_children() would skip repeats
            if child is None:
                continue
            if id(child) not in replaced:
                defaults = child_defaults(parent, name)
                new = None if defaults is None else replacement(child, defaults)
                if new is None:
                    continue
                replaced[id(child)] = (child, new)
            setattr(parent, name, replaced[id(child)][1])
    if not replaced:
        raise ValueError(
            f"{type(module).__name__} holds no nn.MultiheadAttention nor other self-attention that convert knows (nor kernel attention to "
            f"turn into {attention!r}); it converts {', '.join(supported_modules())}. For another attention module, "
            "register its adapter first: gpytorch_sgpa.register_adapter(ModuleType, fn)"
        )
    record_attentions(module, replaced)
    for model in record_conversion(module, attention, attention_kwargs, replaced):
        install_elbo_loss(model, kl_divergence)
    return _finish(module, calibration_inputs)


def _finish(module: nn.Module, calibration_inputs) -> nn.Module:
    """Calibrate the kernels' scales if asked, then drop the softmax projections kept for it."""
    try:
        if calibration_inputs is not None:
            calibrate_kernel_scales(module, calibration_inputs)
    finally:
        forget_softmax_projections(module)
    return module
