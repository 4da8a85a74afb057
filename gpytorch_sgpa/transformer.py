r"""Transformers built from (sparse Gaussian process) attention layers (thesis §3.4).

Layer :math:`l` maps :math:`F^{l-1}` to :math:`F^l`:

* :math:`s = G_\phi(F^{l-1}) = \operatorname{LayerNorm}(F + \operatorname{MLP}(F))` with a 2-layer MLP (the deep-kernel
  feature map of thesis eq. (3.16)); for decoupled SGPA the same :math:`G_\phi` (without dropout) maps the layer's global
  inducing inputs :math:`Z_g` and the result is passed to the attention as ``global_inputs``;
* :math:`F^l = s + \operatorname{attention}(s)` where the attention returns a posterior sample (thesis eq. (3.17))
  and its KL.

Outputs are mean-pooled over the non-padded positions, layer-normalised and mapped by a linear
head.  ``forward`` returns ``(outputs, kl_total)`` with ``kl_total`` the sum of the layers' KL
terms (each averaged over the batch), ready for :class:`gpytorch_sgpa.elbo.SGPAELBO`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor, nn

from probseq._validation import check_dtype, check_real, check_tensor

from ._attention_base import MultiHeadAttentionBase
from ._validation import check_finite, check_finite_result, checks_on_host
from .attention import KernelAttention, ScaledDotProductAttention, SGPANoise, SGPAttention

__all__ = ["ATTENTION_TYPES", "TASKS", "build_attention", "SGPABlock", "SGPADecoder", "SGPATransformer", "SGPAViT"]

#: The attention layers :func:`build_attention` builds (``attention=``).
ATTENTION_TYPES = ("sgpa", "sgpa-dsvgp", "sgpa-standard", "kernel", "sdp")
#: The output heads of the models (``task=``).
TASKS = ("classification", "regression")


def build_attention(
    attention: str | Callable[..., nn.Module],
    d_model: int,
    num_heads: int,
    max_len: int | None = None,
    dropout: float = 0.0,
    attention_kwargs: dict | None = None,
) -> nn.Module:
    """One attention layer from a name in :data:`ATTENTION_TYPES` or a factory.

    Names: ``"sgpa"`` (decoupled, orthogonal), ``"sgpa-dsvgp"`` (decoupled, dsvgp),
    ``"sgpa-standard"`` (standard, uses ``max_len``), ``"kernel"`` (:class:`KernelAttention`),
    ``"sdp"`` (:class:`ScaledDotProductAttention`).  A factory is called as
    ``factory(d_model, num_heads, **attention_kwargs)`` and must return a module with the
    attention call signature ``forward(x, key_padding_mask=None, global_inputs=None) -> (out, kl)``.
    ``dropout`` is passed unless ``attention_kwargs`` sets it.

    :param attention: a name in :data:`ATTENTION_TYPES` or a factory (above).
    :param d_model: the width of the layer's input and output, a multiple of ``num_heads``.
    :param num_heads: the number of attention heads.
    :param max_len: the longest sequence, used by ``"sgpa-standard"`` only; ``None`` (the default): not given.
    :param dropout: the layer's dropout probability, in ``[0, 1)`` (default 0), unless ``attention_kwargs`` sets it.
    :param attention_kwargs: further keyword arguments of the layer (e.g. ``kernel``, ``num_global``); ``None`` (the
        default): none.
    """
    if attention_kwargs is not None and not isinstance(attention_kwargs, Mapping):
        raise TypeError(f"attention_kwargs must be a dict or None, got {type(attention_kwargs).__name__}")
    kwargs = dict(attention_kwargs or {})
    if callable(attention) and not isinstance(attention, str):
        return attention(d_model, num_heads, **kwargs)
    if not isinstance(attention, str):
        raise TypeError(f"attention must be a name in {ATTENTION_TYPES} or a callable, got {type(attention).__name__}")
    if attention not in ATTENTION_TYPES:
        raise ValueError(f"attention must be one of {ATTENTION_TYPES} or a callable, got {attention!r}")
    kwargs.setdefault("dropout", dropout)
    if attention == "sdp":
        return ScaledDotProductAttention(d_model, num_heads, **kwargs)
    if attention == "kernel":
        return KernelAttention(d_model, num_heads, **kwargs)
    if attention == "sgpa-standard":
        kwargs.setdefault("max_len", max_len)
        return SGPAttention(d_model, num_heads, mode="standard", **kwargs)
    variant = "dsvgp" if attention == "sgpa-dsvgp" else "orthogonal"
    return SGPAttention(d_model, num_heads, mode="decoupled", variant=variant, **kwargs)


class SGPABlock(nn.Module):
    r"""One Transformer layer: feature map :math:`G_\phi` (residual 2-layer MLP + LayerNorm) then attention.

    ``forward(f, key_padding_mask=None) -> (f_next, kl)`` with ``f`` ``(B, L, d_model)``.

    :param d_model: the model width, the size of the last dimension of ``f``.
    :param attention: the block's attention layer (e.g. from :func:`build_attention`).
    :param hidden_dim: the hidden width of the feature map's 2-layer MLP.
    :param dropout: the dropout probability, in ``[0, 1)``, of the MLP's hidden and output activations and of the
        attention output (default 0).
    """

    def __init__(self, d_model: int, attention: nn.Module, hidden_dim: int, dropout: float = 0.0):
        super().__init__()
        self.linear1 = nn.Linear(d_model, hidden_dim)
        self.linear2 = nn.Linear(hidden_dim, d_model)
        self.activation = nn.GELU()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.attention = attention

    def feature_map(self, f: Tensor, apply_dropout: bool = True) -> Tensor:
        r""":math:`G_\phi(f) = \operatorname{LayerNorm}(f + W_2 \sigma(W_1 f))` (thesis eq. (3.16), the deep-kernel
        feature map; :math:`\sigma` the GELU).

        :param f: the block input :math:`F^{l-1}` (or the global inducing inputs), ``(..., d_model)``.
        :param apply_dropout: whether to apply the block's dropout (default ``True``; ``False`` for :math:`G_\phi(Z_g)`).
        """
        hidden = self.activation(self.linear1(f))
        if apply_dropout:
            hidden = self.dropout(hidden)
        update = self.linear2(hidden)
        if apply_dropout:
            update = self.dropout(update)
        return self.norm(f + update)

    def global_inputs(self) -> Tensor | None:
        r""":math:`G_\phi(Z_g)` for a decoupled SGPA attention (no dropout), else ``None``."""
        inducing = getattr(self.attention, "global_inducing_inputs", None)
        if inducing is None:
            return None
        return self.feature_map(inducing, apply_dropout=False)

    def forward(self, f: Tensor, key_padding_mask: Tensor | None = None, noise: SGPANoise | None = None):
        r"""``(f_next, kl)``: :math:`F^l = s + \operatorname{attention}(s)` with :math:`s = G_\phi(F^{l-1})`, and the
        attention's KL (a scalar tensor).

        :param f: the block input :math:`F^{l-1}`, ``(B, L, d_model)``.
        :param key_padding_mask: bool ``(B, L)``, ``True`` at padded positions; ``None`` (the default): no padding.
        :param noise: the SGPA layer's standard-normal draws; ``None`` (the default): drawn by the layer.
        """
        s = self.feature_map(f)
        extra = {} if noise is None else {"noise": noise}
        out, kl = self.attention(s, key_padding_mask=key_padding_mask, global_inputs=self.global_inputs(), **extra)
        return s + self.dropout(out), kl

    def forward_step(self, f_t: Tensor, state=None, noise: SGPANoise | None = None):
        r"""One new position ``(B, 1, d_model)`` through a causal block: ``(f_next_t, state)``.

        :math:`G_\phi` acts position-wise, so only the attention keeps a cache (its ``forward_step``);
        :math:`G_\phi(Z_g)` is computed at the first step and kept by the attention's state.

        :param f_t: the new position's block input, ``(B, 1, d_model)``.
        :param state: the attention's cache of the earlier steps; ``None`` (the default) starts a new sequence.
        :param noise: the SGPA layer's standard-normal draws of this position; ``None`` (the default): drawn by the layer.
        """
        step = getattr(self.attention, "forward_step", None)
        if not callable(step):
            raise TypeError(f"{type(self.attention).__name__} has no forward_step; the block's attention needs one")
        s = self.feature_map(f_t)
        global_inputs = self.global_inputs() if state is None else None
        out, state = step(s, state, global_inputs=global_inputs, noise=noise)
        return s + self.dropout(out), state


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


class _SGPAModel(nn.Module):
    """Layers, pooling, head and Monte-Carlo prediction shared by the two models."""

    #: ``False``: ``model(x)`` returns the outputs alone, as an ordinary PyTorch classifier, so that
    #: ``F.cross_entropy(model(x), y) + gpytorch_sgpa.kl_divergence(model) / N`` is the whole loss
    #: (the layers record their KL); ``True`` (default): ``(outputs, kl_total)``
    return_kl: bool = True

    def __init__(
        self,
        num_classes,
        d_model,
        num_heads,
        num_layers,
        max_len,
        attention,
        attention_kwargs,
        task,
        dropout,
        hidden_dim,
        tasks=TASKS,
    ):
        super().__init__()
        for name, value in (("num_classes", num_classes), ("d_model", d_model), ("num_heads", num_heads)):
            _positive_int(name, value)
        _positive_int("num_layers", num_layers)
        _positive_int("max_len", max_len)
        if task not in tasks:
            raise ValueError(f"task must be one of {tasks}, got {task!r}")
        if not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be a float in [0, 1), got {dropout!r}")
        hidden_dim = 2 * d_model if hidden_dim is None else _positive_int("hidden_dim", hidden_dim)
        self.task = task
        self.num_classes = num_classes
        self.d_model = d_model
        self.max_len = max_len
        self.positional = nn.Parameter(0.02 * torch.randn(1, max_len, d_model))
        self.embedding_dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList(
            SGPABlock(
                d_model,
                build_attention(attention, d_model, num_heads, max_len, dropout, attention_kwargs),
                hidden_dim,
                dropout,
            )
            for _ in range(num_layers)
        )
        self.final_norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, num_classes)
        for layer in self.layers:  # the model checks its inputs and outputs once, not every layer
            if isinstance(layer.attention, MultiHeadAttentionBase):
                layer.attention.checks_values = False

    @staticmethod
    def _check_batch(inputs: Tensor, name: str) -> None:
        if inputs.shape[0] == 0 or (inputs.dim() > 1 and inputs.shape[1] == 0):
            raise ValueError(f"{name} must hold at least one sequence of at least one position, got shape {tuple(inputs.shape)}")

    @staticmethod
    def _check_result(inputs: Tensor, name: str, *results: Tensor) -> None:
        if checks_on_host(results[0]):
            check_finite_result(results, inputs, name)

    def _run_layers(self, h: Tensor, key_padding_mask: Tensor | None, noise: list | None = None):
        """Positional embedding, then every block; ``noise``: one ``SGPANoise`` or ``None`` per layer."""
        length = h.shape[1]
        if length > self.max_len:
            raise ValueError(f"sequence length {length} exceeds max_len={self.max_len}")
        h = self.embedding_dropout(h + self.positional[:, :length])
        kl_total = h.new_zeros(())
        for layer, layer_noise in zip(self.layers, noise or [None] * len(self.layers)):
            h, kl = layer(h, key_padding_mask, noise=layer_noise)
            kl_total = kl_total + kl
        return h, kl_total

    def _encode(self, h: Tensor, key_padding_mask: Tensor | None):
        h, kl_total = self._run_layers(h, key_padding_mask)
        if key_padding_mask is None:
            pooled = h.mean(1)
        else:
            weights = (~key_padding_mask).to(h.dtype).unsqueeze(-1)
            pooled = (h * weights).sum(1) / weights.sum(1)
        return self.head(self.final_norm(pooled)), kl_total

    def global_kl(self) -> Tensor:
        """Sum over the SGPA layers of the global inducing variables' KL (shared by all sequences;
        ``kl_total`` holds it once per sequence), used by ``SGPAELBO(kl_weighting="decomposed")``."""
        total = self.positional.new_zeros(())
        for layer in self.layers:
            if isinstance(layer.attention, SGPAttention):
                total = total + layer.attention.global_kl(layer.global_inputs())
        return total

    @torch.no_grad()
    def sample_outputs(self, *inputs, num_samples: int = 10, **kwargs) -> Tensor:
        """``num_samples`` forward passes stacked: ``(num_samples, B, num_classes)``.

        Uses the current mode (call ``eval()`` first to switch dropout off and reuse cached
        global factors).

        :param num_samples: the number of forward passes, a positive int (default 10).
        """
        _positive_int("num_samples", num_samples)
        return torch.stack([self._outputs_only(self(*inputs, **kwargs)) for _ in range(num_samples)])

    def _outputs_only(self, result):
        return result[0] if self.return_kl else result

    def _returned(self, outputs: Tensor, kl: Tensor):
        return (outputs, kl) if self.return_kl else outputs

    def predict_proba(self, *inputs, num_samples: int = 10, **kwargs) -> Tensor:
        """Class probabilities averaged over ``num_samples`` posterior samples, ``(B, num_classes)``.

        :param num_samples: the number of posterior samples (forward passes) averaged, a positive int (default 10).
        """
        if self.task != "classification":
            raise ValueError("predict_proba needs task='classification'; use sample_outputs for regression")
        return torch.softmax(self.sample_outputs(*inputs, num_samples=num_samples, **kwargs), dim=-1).mean(0)


class SGPATransformer(_SGPAModel):
    r"""Transformer encoder for token sequences (or feature sequences) with pluggable attention.

    ``forward(tokens, key_padding_mask=None) -> (outputs, kl_total)``: ``tokens`` is a long
    tensor ``(B, L)`` of ids in ``[0, vocab_size)``, or, when ``vocab_size is None``, a float
    tensor ``(B, L, input_dim)``; ``key_padding_mask`` bool ``(B, L)``, ``True`` = padded.
    ``outputs`` are class logits ``(B, num_classes)`` (``task="classification"``) or regression
    outputs ``(B, num_classes)`` (``task="regression"``, ``num_classes`` = number of outputs).
    ``attention`` is one of :data:`ATTENTION_TYPES` or a layer factory (:func:`build_attention`);
    ``attention_kwargs`` go to every attention layer (e.g. ``kernel="exponential"``,
    ``num_global=16``).  ``hidden_dim`` of the :math:`G_\phi` MLP defaults to ``2 * d_model``.

    Eager on the CPU the models check their inputs and outputs for NaN/Inf once per call (their
    layers then skip their own checks); on accelerators and under ``torch.compile`` these value
    checks are skipped.

    :param vocab_size: the number of token ids, or ``None`` for float feature sequences of width ``input_dim``.
    :param num_classes: the number of classes (classification) or of regression outputs.
    :param d_model: the model width, a multiple of ``num_heads``.
    :param num_heads: the attention heads per layer.
    :param num_layers: the number of :class:`SGPABlock` layers.
    :param max_len: the longest sequence (the learned positional embedding's length).
    :param attention: the attention layers, one of :data:`ATTENTION_TYPES` or a factory (default ``"sgpa"``).
    :param attention_kwargs: keyword arguments of every attention layer; ``None`` (the default): none.
    :param task: ``"classification"`` (the default) or ``"regression"``.
    :param dropout: the dropout probability, in ``[0, 1)``, of the embedding, the blocks and the attention (default 0).
    :param hidden_dim: the hidden width of the :math:`G_\phi` MLP; ``None`` (the default): ``2 * d_model``.
    :param input_dim: the width of float feature sequences, needed when ``vocab_size`` is ``None`` (else ignored).
    """

    embedding: nn.Linear | nn.Embedding  # Linear for float feature sequences (vocab_size None)

    def __init__(
        self,
        vocab_size: int | None,
        num_classes: int,
        d_model: int,
        num_heads: int,
        num_layers: int,
        max_len: int,
        attention: str | Callable[..., nn.Module] = "sgpa",
        attention_kwargs: dict | None = None,
        task: str = "classification",
        dropout: float = 0.0,
        hidden_dim: int | None = None,
        input_dim: int | None = None,
    ):
        super().__init__(num_classes, d_model, num_heads, num_layers, max_len, attention, attention_kwargs, task, dropout, hidden_dim)
        if vocab_size is None:
            self.embedding = nn.Linear(_positive_int("input_dim", input_dim), d_model)
        else:
            self.embedding = nn.Embedding(_positive_int("vocab_size", vocab_size), d_model)
        self.vocab_size = vocab_size
        self.input_dim = input_dim

    def forward(self, tokens: Tensor, key_padding_mask: Tensor | None = None):
        """``(outputs, kl_total)`` (``outputs`` alone with ``return_kl = False``); see the class.

        :param tokens: token ids ``(B, L)`` in ``[0, vocab_size)``, or float features ``(B, L, input_dim)`` when
            ``vocab_size`` is ``None``.
        :param key_padding_mask: bool ``(B, L)``, ``True`` at padded positions; ``None`` (the default): no padding.
        """
        check_tensor(tokens, "tokens", finite=False)
        if self.vocab_size is not None:
            if tokens.dim() != 2 or tokens.dtype not in (torch.int64, torch.int32):
                raise ValueError(f"tokens must be an integer tensor (batch, L), got {tokens.dtype} {tuple(tokens.shape)}")
            self._check_batch(tokens, "tokens")
            if checks_on_host(tokens) and (tokens.min() < 0 or tokens.max() >= self.vocab_size):
                raise ValueError(f"tokens must lie in [0, vocab_size={self.vocab_size})")
        else:
            if tokens.dim() != 3 or tokens.shape[-1] != self.input_dim or not tokens.is_floating_point():
                raise ValueError(
                    f"tokens (inputs) must be a float tensor (batch, L, input_dim={self.input_dim}), "
                    f"got {tokens.dtype} {tuple(tokens.shape)}"
                )
            self._check_batch(tokens, "tokens")
            check_dtype(tokens, "tokens", self.embedding.weight.dtype)
            if checks_on_host(tokens):
                check_finite(tokens, "tokens")
        outputs, kl = self._encode(self.embedding(tokens), key_padding_mask)
        self._check_result(tokens, "tokens", outputs, kl)
        return self._returned(outputs, kl)


class SGPAViT(_SGPAModel):
    r"""Vision Transformer: non-overlapping ``patch_size`` patches → linear embedding → layers → head.

    ``forward(images) -> (outputs, kl_total)`` with ``images`` ``(B, in_channels, image_size,
    image_size)``.  Same layers, pooling and head as :class:`SGPATransformer`.

    :param image_size: the height and width of the (square) images, in pixels, a multiple of ``patch_size``.
    :param patch_size: the height and width of each patch, in pixels.
    :param in_channels: the number of image channels.
    :param num_classes: the number of classes (classification) or of regression outputs.
    :param d_model: the model width, a multiple of ``num_heads``.
    :param num_heads: the attention heads per layer.
    :param num_layers: the number of :class:`SGPABlock` layers.
    :param attention: the attention layers, one of :data:`ATTENTION_TYPES` or a factory (default ``"sgpa"``).
    :param attention_kwargs: keyword arguments of every attention layer; ``None`` (the default): none.
    :param task: ``"classification"`` (the default) or ``"regression"``.
    :param dropout: the dropout probability, in ``[0, 1)``, of the embedding, the blocks and the attention (default 0).
    :param hidden_dim: the hidden width of the :math:`G_\phi` MLP; ``None`` (the default): ``2 * d_model``.
    """

    def __init__(
        self,
        image_size: int,
        patch_size: int,
        in_channels: int,
        num_classes: int,
        d_model: int,
        num_heads: int,
        num_layers: int,
        attention: str | Callable[..., nn.Module] = "sgpa",
        attention_kwargs: dict | None = None,
        task: str = "classification",
        dropout: float = 0.0,
        hidden_dim: int | None = None,
    ):
        _positive_int("image_size", image_size)
        _positive_int("patch_size", patch_size)
        _positive_int("in_channels", in_channels)
        if image_size % patch_size != 0:
            raise ValueError(f"image_size={image_size} must be divisible by patch_size={patch_size}")
        num_patches = (image_size // patch_size) ** 2
        super().__init__(
            num_classes,
            d_model,
            num_heads,
            num_layers,
            num_patches,
            attention,
            attention_kwargs,
            task,
            dropout,
            hidden_dim,
        )
        self.image_size = image_size
        self.in_channels = in_channels
        self.patch_embedding = nn.Conv2d(in_channels, d_model, kernel_size=patch_size, stride=patch_size)

    def forward(self, images: Tensor):
        """``(outputs, kl_total)`` (``outputs`` alone with ``return_kl = False``); see the class.

        :param images: the images, ``(B, in_channels, image_size, image_size)``, in the model's dtype.
        """
        check_tensor(images, "images", floating=True, finite=False)
        expected = (self.in_channels, self.image_size, self.image_size)
        if images.dim() != 4 or tuple(images.shape[1:]) != expected:
            raise ValueError(f"images must have shape (batch, {', '.join(map(str, expected))}), got {tuple(images.shape)}")
        self._check_batch(images, "images")
        check_dtype(images, "images", self.patch_embedding.weight.dtype)
        if checks_on_host(images):
            check_finite(images, "images")
        patches = self.patch_embedding(images).flatten(2).transpose(1, 2)
        outputs, kl = self._encode(patches, None)
        self._check_result(images, "images", outputs, kl)
        return self._returned(outputs, kl)


class SGPADecoder(_SGPAModel):
    r"""Causal (decoder-only) Transformer for next-token prediction with pluggable attention.

    The thesis lists decoder-based SGPA as future work (§3.7, "Conclusion and Future Work"; its concluding chapter, "Extending
    SGPA to decoder-based Transformers", sketches an online ELBO with HiPPO-based adaptive inducing
    keys, which is *not* what this class does).  This is the direct extension with the static prior
    and ELBO of the encoder: every layer is an :class:`SGPABlock` whose attention is built with
    ``causal=True``, so position :math:`i` attends to the amortised keys :math:`j \le i` only (for SGPA: the
    SVGP posterior given the prefix's keys and the global keys).  :math:`G_\phi`, the final LayerNorm and the linear head act
    position-wise, so :meth:`forward_step` (one token at a time, each layer with its key/value cache) reproduces
    :meth:`forward` given the same noise.

    * ``forward(tokens, key_padding_mask=None, noise=None) -> (logits, kl_total)``: ``tokens``
      ``(B, L)`` ids in ``[0, vocab_size)``; ``logits`` ``(B, L, vocab_size)`` predict the token
      *after* each position; ``noise`` is a list with one :class:`SGPANoise` (or ``None``) per
      layer, e.g. from :meth:`sample_noise` (common random numbers);
    * train with :class:`~gpytorch_sgpa.elbo.SGPAELBO` on ``(logits[:, :-1], kl, tokens[:, 1:])``
      (sequence targets, ``-100`` marks positions to ignore, ``num_data`` = number of sequences);
    * :meth:`generate` samples continuations autoregressively with the caches;
      :meth:`sample_outputs` stacks the logits of several posterior samples.

    :param vocab_size: the number of token ids (the logits' width).
    :param d_model: the model width, a multiple of ``num_heads``.
    :param num_heads: the attention heads per layer.
    :param num_layers: the number of :class:`SGPABlock` layers.
    :param max_len: the longest sequence, prompt and generated tokens together.
    :param attention: the attention layers, one of :data:`ATTENTION_TYPES` or a factory (default ``"sgpa"``); each is
        built with ``causal=True``.
    :param attention_kwargs: keyword arguments of every attention layer (``causal=False`` is refused); ``None`` (the
        default): none.
    :param dropout: the dropout probability, in ``[0, 1)``, of the embedding, the blocks and the attention (default 0).
    :param hidden_dim: the hidden width of the :math:`G_\phi` MLP; ``None`` (the default): ``2 * d_model``.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        num_heads: int,
        num_layers: int,
        max_len: int,
        attention: str | Callable[..., nn.Module] = "sgpa",
        attention_kwargs: dict | None = None,
        dropout: float = 0.0,
        hidden_dim: int | None = None,
    ):
        _positive_int("vocab_size", vocab_size)
        kwargs = dict(attention_kwargs or {})
        if kwargs.get("causal", True) is not True:
            raise ValueError("SGPADecoder builds causal attention; attention_kwargs must not set causal=False")
        kwargs["causal"] = True
        super().__init__(
            vocab_size,
            d_model,
            num_heads,
            num_layers,
            max_len,
            attention,
            kwargs,
            "language_model",
            dropout,
            hidden_dim,
            tasks=("language_model",),
        )
        self.vocab_size = vocab_size
        self.embedding = nn.Embedding(vocab_size, d_model)
        for layer in self.layers:
            if not callable(getattr(layer.attention, "forward_step", None)):
                raise TypeError(f"{type(layer.attention).__name__} has no forward_step; the decoder needs one")

    def _check_tokens(self, tokens: Tensor, start: int = 0, name: str = "tokens") -> None:
        if not isinstance(tokens, Tensor) or tokens.dtype not in (torch.int64, torch.int32) or tokens.dim() != 2:
            raise ValueError(f"{name} must be an integer tensor (batch, L), got {getattr(tokens, 'shape', tokens)!r}")
        self._check_batch(tokens, name)
        if checks_on_host(tokens) and (tokens.min() < 0 or tokens.max() >= self.vocab_size):
            raise ValueError(f"{name} must lie in [0, vocab_size={self.vocab_size})")
        if start + tokens.shape[1] > self.max_len:
            raise ValueError(f"sequence length {start + tokens.shape[1]} exceeds max_len={self.max_len}")

    def _check_noise(self, noise) -> list:
        if noise is None:
            return [None] * len(self.layers)
        if not isinstance(noise, (list, tuple)) or len(noise) != len(self.layers):
            raise ValueError(f"noise must be a list with one SGPANoise (or None) per layer ({len(self.layers)})")
        for index, layer_noise in enumerate(noise):
            for part, value in zip(("local", "global_"), layer_noise if isinstance(layer_noise, SGPANoise) else ()):
                if isinstance(value, Tensor) and value.is_floating_point() and checks_on_host(value):
                    check_finite(value, f"noise[{index}].{part}")
        return list(noise)

    def sample_noise(self, batch_size: int, length: int, generator: torch.Generator | None = None) -> list:
        """Per-layer standard-normal draws of one forward pass (``None`` for non-SGPA layers), from
        ``generator`` if given.

        :param batch_size: the number of sequences :math:`B`.
        :param length: the sequence length :math:`L`.
        :param generator: the random number generator to draw from; ``None`` (the default): the global one.
        """
        return [
            layer.attention.sample_noise(batch_size, length, generator=generator) if isinstance(layer.attention, SGPAttention) else None
            for layer in self.layers
        ]

    def forward(self, tokens: Tensor, key_padding_mask: Tensor | None = None, noise: list | None = None):
        r"""``(logits, kl_total)`` (``logits`` alone with ``return_kl = False``), ``logits`` ``(B, L, vocab_size)``
        predicting the token after each position; see the class.

        :param tokens: the token ids, ``(B, L)`` in ``[0, vocab_size)`` with :math:`L \le` ``max_len``.
        :param key_padding_mask: bool ``(B, L)``, ``True`` at padded positions; ``None`` (the default): no padding.
        :param noise: one :class:`SGPANoise` (or ``None``) per layer, e.g. from :meth:`sample_noise`; ``None`` (the
            default): every layer draws its own.
        """
        self._check_tokens(tokens)
        h, kl_total = self._run_layers(self.embedding(tokens), key_padding_mask, self._check_noise(noise))
        logits = self.head(self.final_norm(h))
        self._check_result(tokens, "tokens", logits, kl_total)
        return self._returned(logits, kl_total)

    def forward_step(self, token: Tensor, states: list | None = None, noise: list | None = None):
        """Logits ``(B, vocab_size)`` after one more token ``(B,)`` and the updated per-layer caches.

        ``noise``: per layer an :class:`SGPANoise` of one position (``local`` ``(B, H, 1, e)``;
        ``global_`` is read at the first step), or ``None`` to draw it.

        :param token: the new token ids, ``(B,)``.
        :param states: the per-layer caches returned by the previous call; ``None`` (the default) starts new sequences.
        :param noise: one :class:`SGPANoise` of this position (or ``None``) per layer; ``None`` (the default): every
            layer draws its own.
        """
        if not isinstance(token, Tensor) or token.dim() != 1:
            raise ValueError(f"token must be a 1-D integer tensor (batch,), got {getattr(token, 'shape', token)!r}")
        position = 0 if states is None else states[0].length
        self._check_tokens(token.unsqueeze(1), start=position)
        states = [None] * len(self.layers) if states is None else states
        noise = self._check_noise(noise)
        h = self.embedding_dropout(self.embedding(token.unsqueeze(1)) + self.positional[:, position : position + 1])
        for index, (layer, layer_noise) in enumerate(zip(self.layers, noise)):
            h, states[index] = layer.forward_step(h, states[index], noise=layer_noise)
        logits = self.head(self.final_norm(h)).squeeze(1)
        self._check_result(token, "token", logits)
        return logits, states

    @torch.no_grad()
    def generate(
        self, prompt: Tensor, num_tokens: int, temperature: float = 1.0, greedy: bool = False, generator: torch.Generator | None = None
    ) -> Tensor:
        r"""Continue ``prompt`` ``(B, T0)`` by ``num_tokens`` tokens: ``(B, T0 + num_tokens)``.

        One posterior sample path per sequence (the SGPA layers draw their global noise once, at the
        first step, and fresh local noise per position); the next token is drawn from
        :math:`\operatorname{softmax}(\text{logits} / \text{temperature})` or taken as the arg max (``greedy=True``). With a
        ``generator`` every draw (the layers' noise and the tokens) comes from it, so the output
        depends on the generator's state alone.

        :param prompt: the token ids to continue, ``(B, T0)``.
        :param num_tokens: the number of tokens to generate, a positive int.
        :param temperature: the softmax temperature, > 0 (default 1).
        :param greedy: whether to take the arg max instead of sampling (default ``False``).
        :param generator: the random number generator of every draw; ``None`` (the default): the global one.
        """
        _positive_int("num_tokens", num_tokens)
        check_real(temperature, "temperature", low=0.0, low_open=True)
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
        self._check_tokens(prompt, name="prompt")
        if prompt.shape[1] + num_tokens > self.max_len:
            raise ValueError(f"prompt length + num_tokens = {prompt.shape[1] + num_tokens} exceeds max_len={self.max_len}")
        states, tokens = None, [prompt]

        def noise():
            return None if generator is None else self.sample_noise(prompt.shape[0], 1, generator=generator)

        for t in range(prompt.shape[1]):
            logits, states = self.forward_step(prompt[:, t], states, noise=noise())
        for _ in range(num_tokens):
            if greedy:
                nxt = logits.argmax(-1)
            else:
                probabilities = torch.softmax(logits / temperature, -1)
                # draw where the generator lives (a CPU generator cannot sample CUDA tensors)
                source = generator.device if generator is not None else probabilities.device
                nxt = torch.multinomial(probabilities.to(source), 1, generator=generator).squeeze(1).to(logits.device)
            tokens.append(nxt.unsqueeze(1))
            if len(tokens) - 1 < num_tokens:
                logits, states = self.forward_step(nxt, states, noise=noise())
        return torch.cat(tokens, dim=1)
