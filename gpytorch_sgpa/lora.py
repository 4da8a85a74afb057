r"""LoRA (``peft``) on a converted model: which projections to adapt, SGPA's own parameters trained
and saved beside the adapter.

:func:`~gpytorch_sgpa.convert` replaces a family's query, key and value projections by the layer's
shared ``qk_proj`` (:math:`W_{qk}`) and ``v_proj`` (:math:`W_v`), so a ``LoraConfig`` naming the family's own
modules (``["query", "value"]`` for BERT) matches nothing; :func:`lora_target_modules` gives the
names to target.  The global keys :math:`k_g = Z_g W_{qk}` are ``qk_proj`` called on the global inducing
inputs (:meth:`~gpytorch_sgpa.attention.SGPAttention.global_keys`), so an adapter of ``qk_proj``
moves them with the queries and ``merge_and_unload()`` keeps the model's function.

``peft`` freezes every parameter it does not add, and its ``modules_to_save`` names whole modules,
while SGPA's variational parameters (:math:`Z_g`, :math:`v_g`, :math:`C`, the mean gate) are parameters of the
attention layer itself.  :func:`get_peft_model` therefore adds LoRA and makes the parameters of
:func:`sgpa_parameter_names` trainable; :func:`save_adapter` writes the adapter with
``save_pretrained`` and those parameters beside it (``sgpa_parameters.safetensors``), and
:func:`load_adapter` restores both.  ``PeftModel.save_pretrained`` alone (and so ``Trainer.save_model``
of a ``PeftModel``) saves the adapter without them.
"""

from __future__ import annotations

import os

from torch import nn

from probseq._optional import require

from .attention import SGPAttention
from .mle_attention import KernelAttention

__all__ = ["SGPA_PARAMETERS_FILE", "get_peft_model", "load_adapter", "lora_target_modules", "save_adapter", "sgpa_parameter_names"]

#: The file :func:`save_adapter` writes SGPA's parameters to, beside the adapter's own files.
SGPA_PARAMETERS_FILE = "sgpa_parameters.safetensors"

_PROJECTIONS = ("qk_proj", "v_proj", "out_proj")


def _attention_layers(model: nn.Module) -> list[tuple[str, SGPAttention | KernelAttention]]:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    layers = [(name, module) for name, module in model.named_modules() if isinstance(module, (SGPAttention, KernelAttention))]
    if not layers:
        raise ValueError("model holds no SGPA or kernel-attention layer: convert it first (gpytorch_sgpa.convert)")
    return layers


def lora_target_modules(model: nn.Module) -> list[str]:
    """The full names of the ``qk_proj`` and ``v_proj`` projections of every SGPA and kernel-attention
    layer of ``model`` (a converted model, or a ``PeftModel`` around one): ``LoraConfig(target_modules=...)``.

    :param model: a converted model, or a ``PeftModel`` around one; it must hold an SGPA or kernel-attention layer.
    """
    return [f"{name}.{projection}" for name, _ in _attention_layers(model) for projection in ("qk_proj", "v_proj")]


def sgpa_parameter_names(model: nn.Module) -> list[str]:
    """Names (as ``model.named_parameters()`` gives them) of the attention layers' own parameters: every
    parameter of an SGPA or kernel-attention layer except those of its projections ``qk_proj``,
    ``v_proj``, ``out_proj`` (global inducing inputs, variational parameters, mean gate, kernel
    hyperparameters; standard SGPA's ``cov_proj``).

    :param model: a converted model, or a ``PeftModel`` around one; it must hold an SGPA or kernel-attention layer.
    """
    names = []
    for layer_name, layer in _attention_layers(model):
        for name, _ in layer.named_parameters():
            if name.split(".")[0] not in _PROJECTIONS:
                names.append(f"{layer_name}.{name}")
    return names


def get_peft_model(model: nn.Module, config=None, **lora_kwargs):
    """``peft.get_peft_model(model, config)`` for a converted model, with SGPA's parameters
    (:func:`sgpa_parameter_names`) trainable.  ``config``: a ``peft`` config (used as is), or ``None``
    for ``LoraConfig(target_modules=lora_target_modules(model), **lora_kwargs)``.

    :param model: the converted model to wrap.
    :param config: a ``peft`` config, used as is; ``None`` (the default) builds a ``LoraConfig`` from ``lora_kwargs``.
    """
    peft = require("peft", "zoo", "gpytorch_sgpa.lora")
    if config is None:
        config = peft.LoraConfig(target_modules=lora_target_modules(model), **lora_kwargs)
    elif lora_kwargs:
        raise ValueError(f"pass either config or LoRA keyword arguments, got both (config and {sorted(lora_kwargs)})")
    peft_model = peft.get_peft_model(model, config)
    parameters = dict(peft_model.named_parameters())
    for name in sgpa_parameter_names(peft_model):
        parameters[name].requires_grad_(True)
    return peft_model


def _base_model(peft_model) -> nn.Module:
    if not hasattr(peft_model, "get_base_model") or not hasattr(peft_model, "peft_config"):
        raise TypeError(f"peft_model must be a peft.PeftModel, got {type(peft_model).__name__}")
    return peft_model.get_base_model()


def save_adapter(peft_model, path: str | os.PathLike, **kwargs) -> None:
    """``peft_model.save_pretrained(path, **kwargs)`` and SGPA's parameters (:func:`sgpa_parameter_names`
    of the base model) in ``path/sgpa_parameters.safetensors``.

    :param peft_model: the ``PeftModel`` around a converted model.
    :param path: the directory to write to (created if needed).
    """
    _base_model(peft_model)
    peft_model.save_pretrained(path, **kwargs)
    save_sgpa_parameters(peft_model, path)


def save_sgpa_parameters(peft_model, path: str | os.PathLike) -> None:
    """SGPA's parameters of ``peft_model``'s base model in ``path/sgpa_parameters.safetensors``, the part of a
    converted model that ``peft``'s own ``save_pretrained`` leaves out (``SGPATrainer`` writes it beside every
    adapter it saves).

    :param peft_model: the ``PeftModel`` around a converted model.
    :param path: the directory to write ``sgpa_parameters.safetensors`` to (created if needed).
    """
    safetensors = require("safetensors.torch", "zoo", "gpytorch_sgpa.lora.save_sgpa_parameters", package="safetensors")
    base = _base_model(peft_model)
    os.makedirs(path, exist_ok=True)
    parameters = dict(base.named_parameters())
    tensors = {name: parameters[name].detach().contiguous() for name in sgpa_parameter_names(base)}
    safetensors.save_file(tensors, os.path.join(path, SGPA_PARAMETERS_FILE))


def load_adapter(model: nn.Module, path: str | os.PathLike, is_trainable: bool = False, **kwargs):
    """The ``PeftModel`` of ``peft.PeftModel.from_pretrained(model, path, is_trainable=..., **kwargs)``
    with SGPA's parameters loaded from ``path`` (written by :func:`save_adapter`); ``model``: the
    converted model the adapter was trained on (e.g. from :func:`~gpytorch_sgpa.from_pretrained`).
    Every saved parameter must exist in ``model`` and every SGPA parameter of ``model`` must be saved
    (``ValueError`` otherwise); with ``is_trainable`` they are trainable, as after :func:`get_peft_model`.

    :param model: the converted model the adapter was trained on.
    :param path: the directory written by :func:`save_adapter`.
    :param is_trainable: whether the LoRA weights and SGPA's parameters are trainable (default ``False``: inference).
    """
    peft = require("peft", "zoo", "gpytorch_sgpa.lora.load_adapter")
    safetensors = require("safetensors.torch", "zoo", "gpytorch_sgpa.lora.load_adapter", package="safetensors")
    file = os.path.join(path, SGPA_PARAMETERS_FILE)
    if not os.path.isfile(file):
        raise ValueError(f"path holds no {SGPA_PARAMETERS_FILE}: save the adapter with gpytorch_sgpa.lora.save_adapter")
    saved = safetensors.load_file(file)
    expected = set(sgpa_parameter_names(model))
    missing, unexpected = sorted(expected - set(saved)), sorted(set(saved) - expected)
    if missing or unexpected:
        raise ValueError(f"{file} does not match the model's SGPA parameters: missing {missing}, unexpected {unexpected}")
    peft_model = peft.PeftModel.from_pretrained(model, path, is_trainable=is_trainable, **kwargs)
    parameters = dict(_base_model(peft_model).named_parameters())
    for name, tensor in saved.items():
        parameter = parameters[name]
        if parameter.shape != tensor.shape:
            raise ValueError(f"{name}: saved shape {tuple(tensor.shape)}, the model's {tuple(parameter.shape)}")
        parameter.data.copy_(tensor)
        parameter.requires_grad_(is_trainable)
    return peft_model
