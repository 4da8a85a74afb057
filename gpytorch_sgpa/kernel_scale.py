r"""The kernel's scale of a layer converted from softmax attention, chosen from the trained network's
attention logits (``convert(..., calibration_inputs=...)``).

Softmax attention weighs key :math:`j` for query :math:`i` by :math:`\exp(s_{ij}) / \sum_{j'} \exp(s_{ij'})` with the logits
:math:`s_{ij} = (x_i W_q^\top + b_q) \cdot (x_j W_k^\top + b_k) / \sqrt{e}` of each head; a kernel layer by
:math:`\sigma_f^2 \exp(a_{ij})` with :math:`a_{ij} = \log(k(q_i, q_j) / \sigma_f^2)`, e.g. :math:`-\|q_i - q_j\|^2 / (2\ell^2)` (RBF) or
:math:`q_i \cdot q_j / \ell^2` (exponential).  Per head, on the calibration batch:

* length scale: :math:`\ell` (every ARD dimension alike) such that the spread of the kernel's
  log-weights over the keys equals that of the softmax logits,
  :math:`\operatorname{mean}_i \operatorname{std}_j a_{ij} = \operatorname{mean}_i \operatorname{std}_j s_{ij}`; for RBF and
  exponential :math:`a` scales as :math:`1/\ell^2`, so :math:`\ell^2 \leftarrow \ell^2 \cdot \operatorname{spread}(a) /
  \operatorname{spread}(s)` is exact in one step (Matérn: repeated until it settles);
* output scale: :math:`\sigma_f^2` such that a query's weights sum to 1 in geometric mean over the queries,
  :math:`\log \sigma_f^2 = -\operatorname{mean}_i \log \sum_j \exp(a_{ij})`, as softmax weights do.

Decoupled SGPA built from kernel attention: the global inducing inputs :math:`Z_g` of each head are
``M`` tokens drawn without replacement from the layer's inputs on the batch (not padding), where
the global keys then explain the queries' prior variance (:math:`K_{qg} K_{gg}^{-1} K_{gq} \approx K_{qq}`); the
posterior mean stays the kernel network's, as the mean gate is 0 whatever :math:`Z_g`.

Layers are calibrated in the order the model calls them, each on the inputs it gets from the layers
before it, already calibrated (one forward pass per layer, without gradients, in evaluation mode,
SGPA at its posterior mean).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, cast

import torch
from gpytorch.kernels import MaternKernel, RBFKernel, ScaleKernel
from torch import Tensor, nn

from .kernels import ExponentialKernel

if TYPE_CHECKING:
    from .attention import KernelAttention, SGPAttention

__all__ = ["calibrate_kernel_scales", "forget_softmax_projections", "mark_for_placement"]

_STASH = "_softmax_query_key"
_PLACE = "_global_inputs_from_data"


def mark_for_placement(layer: nn.Module) -> None:
    """Let ``calibration_inputs`` place the global inducing inputs of a decoupled SGPA ``layer``.

    :param layer: the new kernel or SGPA layer (only a decoupled SGPA layer is marked).
    """
    if getattr(layer, "mode", None) == "decoupled":
        layer.__dict__[_PLACE] = True


def _log_weights(base, queries: Tensor) -> Tensor:
    """``log k(q_i, q_j)`` of the base kernel, ``(B, H, L, L)``, for ``queries`` ``(B, H, L, e)``."""
    scaled = queries / base.lengthscale.to(queries.dtype).unsqueeze(0)  # lengthscale (H, 1, e)
    if isinstance(base, ExponentialKernel):
        return scaled.matmul(scaled.transpose(-2, -1))
    distance = torch.cdist(scaled, scaled)
    if isinstance(base, RBFKernel):
        return -0.5 * distance.square()
    if isinstance(base, MaternKernel):
        root = math.sqrt(2 * base.nu) * distance
        if base.nu == 0.5:
            return -root
        polynomial = 1 + root if base.nu == 1.5 else 1 + root + root.square() / 3
        return polynomial.log() - root
    raise ValueError(f"calibration_inputs supports RBF, exponential and Matérn kernels, not {type(base).__name__}")


def _spread(values: Tensor, allowed: Tensor) -> Tensor:
    """Per head: the mean over queries (with at least two allowed keys) of the standard deviation of
    ``values`` over the allowed keys; ``values`` ``(B, H, L, L)``, ``allowed`` ``(B, 1, L, L)``."""
    weight = allowed.to(values.dtype)
    count = weight.sum(-1)  # (B, 1, L)
    mean = (values * weight).sum(-1) / count.clamp_min(1)
    variance = ((values - mean.unsqueeze(-1)).square() * weight).sum(-1) / count.clamp_min(1)
    rows = (count >= 2).to(values.dtype).expand_as(variance)
    return (variance.sqrt() * rows).sum((0, 2)) / rows.sum((0, 2)).clamp_min(1)


def _heads(layer, projected: Tensor) -> Tensor:
    batch, length, _ = projected.shape
    return projected.view(batch, length, layer.num_heads, layer.head_dim).transpose(1, 2)


@torch.no_grad()
def _calibrate_layer(layer: KernelAttention | SGPAttention, x: Tensor, key_padding_mask: Tensor | None) -> None:
    kernel = layer.kernel
    if not isinstance(kernel, ScaleKernel):
        raise ValueError("calibration_inputs needs the layer's kernel to be a gpytorch ScaleKernel")
    weight_q, bias_q, weight_k, bias_k = getattr(layer, _STASH)
    dtype = torch.promote_types(x.dtype, torch.float32)
    x = x.to(dtype)
    batch, length, _ = x.shape
    allowed = torch.ones(batch, 1, length, length, dtype=torch.bool, device=x.device)
    if key_padding_mask is not None:
        valid = ~key_padding_mask
        allowed = allowed & valid[:, None, None, :] & valid[:, None, :, None]
    if layer.causal:
        allowed = allowed & torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
    q = _heads(layer, nn.functional.linear(x, weight_q.to(dtype), None if bias_q is None else bias_q.to(dtype)))
    k = _heads(layer, nn.functional.linear(x, weight_k.to(dtype), None if bias_k is None else bias_k.to(dtype)))
    target = _spread(q.matmul(k.transpose(-2, -1)) / math.sqrt(layer.head_dim), allowed)  # (H,)
    queries = _heads(layer, layer.qk_proj(x.to(layer.qk_proj.weight.dtype)).to(dtype))
    base = kernel.base_kernel
    lengthscale = base.lengthscale.detach().to(dtype).mean(-1, keepdim=True)  # (H, 1, 1)
    steps = 1 if isinstance(base, (RBFKernel, ExponentialKernel)) else 20
    for _ in range(steps):
        base.lengthscale = lengthscale.expand_as(base.lengthscale)
        current = _spread(_log_weights(base, queries), allowed)
        ratio = (current / target.clamp_min(1e-12)).clamp(1e-6, 1e6)
        lengthscale = lengthscale * ratio.sqrt().view(-1, 1, 1)
    base.lengthscale = lengthscale.expand_as(base.lengthscale)
    log_weights = _log_weights(base, queries).masked_fill(~allowed, float("-inf"))
    row_mass = torch.logsumexp(log_weights, dim=-1)  # (B, H, L)
    rows = allowed.any(-1).to(dtype).expand_as(row_mass)
    mean_log_mass = (row_mass.nan_to_num(0.0, neginf=0.0) * rows).sum((0, 2)) / rows.sum((0, 2)).clamp_min(1)
    kernel.outputscale = (-mean_log_mass).exp()
    if hasattr(layer, "clear_cache"):
        layer.clear_cache()


@torch.no_grad()
def _place_global_inputs(layer: SGPAttention, x: Tensor, key_padding_mask: Tensor | None) -> None:
    tokens = x.reshape(-1, x.shape[-1]) if key_padding_mask is None else x[~key_padding_mask]
    inducing = cast(Tensor, layer.global_inducing_inputs)  # a parameter: marked layers are decoupled
    heads, num_global, _ = inducing.shape
    if tokens.shape[0] < num_global:
        raise ValueError(f"calibration_inputs hold {tokens.shape[0]} tokens, fewer than num_global={num_global}")
    chosen = torch.stack([torch.randperm(tokens.shape[0], device=tokens.device)[:num_global] for _ in range(heads)])
    inducing.copy_(tokens[chosen].to(inducing.dtype))
    layer.clear_cache()


def _call(model: nn.Module, inputs):
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def calibrate_kernel_scales(model: nn.Module, inputs) -> int:
    """Set the length and output scales of every layer of ``model`` that ``convert`` has just built
    from softmax attention, and the global inducing inputs of decoupled SGPA it has just built from
    kernel attention (see the module's docstring); ``inputs``: what ``model`` is called with
    (a tensor, a tuple of positional arguments, or a dict of keyword arguments).  Returns the number
    of layers calibrated.

    :param model: the converted model.
    :param inputs: what ``model`` is called with: a tensor, a tuple of positional arguments, or a dict of keyword
        arguments.
    """
    from .attention import posterior_mean

    layers = [m for m in model.modules() if getattr(m, _STASH, None) is not None or _PLACE in m.__dict__]
    if not layers:
        raise ValueError(
            "calibration_inputs needs layers converted from softmax attention (their query and key "
            "projections set the scale) or decoupled SGPA from kernel attention (global inducing "
            "inputs); kernel attention keeps its trained kernel"
        )
    training = model.training
    model.eval()
    done: set[int] = set()
    try:
        while len(done) < len(layers):
            seen: list[tuple[nn.Module, Tensor, Tensor | None]] = []

            def record(module, args, kwargs):
                if id(module) not in done and not any(m is module for m, _, _ in seen):
                    x = args[0] if args else kwargs["x"]
                    seen.append((module, x, kwargs.get("key_padding_mask", args[1] if len(args) > 1 else None)))

            handles = [layer.register_forward_pre_hook(record, with_kwargs=True) for layer in layers]
            try:
                with torch.no_grad(), posterior_mean():
                    _call(model, inputs)
            finally:
                for handle in handles:
                    handle.remove()
            if not seen:
                raise ValueError("the model's forward on calibration_inputs did not call every converted layer")
            layer, x, padding = seen[0]  # the first layer not yet calibrated, on calibrated inputs
            # marked by convert: its kernel or SGPA layers, and only decoupled SGPA for placement
            if getattr(layer, _STASH, None) is not None:
                _calibrate_layer(cast("KernelAttention | SGPAttention", layer), x, padding)
            if _PLACE in layer.__dict__:
                _place_global_inputs(cast("SGPAttention", layer), x, padding)
            done.add(id(layer))
    finally:
        model.train(training)
    return len(layers)


def forget_softmax_projections(model: nn.Module) -> None:
    """Drop what ``convert`` kept of the softmax projections for the calibration.

    :param model: the converted model (every module under it is cleared).
    """
    for module in model.modules():
        for name in (_STASH, _PLACE):
            module.__dict__.pop(name, None)
