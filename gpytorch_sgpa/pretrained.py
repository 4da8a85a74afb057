r"""Saving and reloading converted Hugging Face models (``save_pretrained`` / :func:`from_pretrained`).

A ``transformers`` checkpoint is a configuration (``config.json``) and weights; ``from_pretrained``
builds the model's class from the configuration and loads the weights into it, so a class whose
self-attention is softmax attention cannot hold SGPA's parameters.  :func:`gpytorch_sgpa.convert`
therefore records each conversion in the model's configuration, which ``save_pretrained`` (and
``Trainer.save_model``) write with the weights:

* ``config.sgpa``: ``{"attn_implementation": ..., "conversions": [{"attention": ..., "kwargs": {...},
  "modules": [...]}, ...]}``, the conversions in order (e.g. kernel attention, then SGPA), each with
  its keyword arguments and the paths of the modules it replaced;
* ``config.attn_implementation = "gpytorch_sgpa"``: an attention implementation that only this
  package registers (in ``transformers``' ``AttentionInterface``), and whose function raises with
  the fix;
* ``config.experts_implementation``: an experts implementation that does not exist, whose name says to load
  the checkpoint with :func:`from_pretrained`.  ``transformers`` checks it whenever it builds a model, and
  ``from_pretrained(path, attn_implementation="sdpa" | "eager")`` replaces the attention implementation
  but not this one, so loading the checkpoint with the model's own ``from_pretrained`` raises a
  ``ValueError`` naming :func:`from_pretrained`, with or without ``gpytorch_sgpa`` imported: never the
  softmax network with fresh query/key weights.

:func:`from_pretrained` builds the model from the configuration with the attention implementation
it was converted with, replays the recorded conversions (the same modules are replaced, checked),
and loads every saved tensor strictly: the reloaded model computes what the saved one did.
``calibration_inputs`` are not replayed: the scales they set are saved parameters.

``torch.save(model)`` / ``torch.load(path, weights_only=False)`` of a converted model work as for
any module (``weights_only=False``: the file holds the classes, not only tensors), with the limit
of ``transformers`` models: once asked for ``output_attentions`` or ``output_hidden_states`` a model
holds ``transformers``' recording hooks, which do not pickle.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

import torch

from probseq._compat import set_implementations
from probseq._optional import require

from .conversion_record import ATTN_IMPLEMENTATION
from .dropin import convert

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["ATTN_IMPLEMENTATION", "from_pretrained"]


def _saved_tensors(path: str) -> dict:
    """Every tensor of a ``save_pretrained`` directory (safetensors, sharded or not, or ``pytorch_model.bin``)."""
    from safetensors.torch import load_file

    single = os.path.join(path, "model.safetensors")
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(single):
        return load_file(single)
    if os.path.isfile(index):
        with open(index) as handle:
            files = sorted(set(json.load(handle)["weight_map"].values()))
        return {key: value for name in files for key, value in load_file(os.path.join(path, name)).items()}
    binary = os.path.join(path, "pytorch_model.bin")
    if os.path.isfile(binary):
        return torch.load(binary, map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"{path} holds no model.safetensors, model.safetensors.index.json nor pytorch_model.bin")


def _model_keys(model: PreTrainedModel, tensors: dict) -> dict:
    """``tensors`` under the model's own names: ``save_pretrained`` writes some families' weights under
    their checkpoints' historical names (ViT's ``encoder.layer.N.attention.attention.query``, ...) and
    ``transformers`` renames them when loading; the same renamings are applied here."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    transforms = get_model_conversion_mapping(model) or []
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    renamed = {}
    for key, tensor in tensors.items():
        name, converter = rename_source_key(key, renamings, converters)
        if converter is not None or name in renamed:
            raise ValueError(
                f"{type(model).__name__} checkpoints store {key!r} in a converted layout that gpytorch_sgpa.from_pretrained does not undo"
            )
        renamed[name] = tensor
    return renamed


def from_pretrained(model_class, path: str | os.PathLike):
    """Reload a converted ``transformers`` model saved with ``save_pretrained`` (or ``Trainer.save_model``).

    ``model_class``: the model's class (``BertForSequenceClassification``, ...) or an ``AutoModel*``
    class; ``path``: the saved directory.  Builds ``model_class`` from the saved configuration with
    the attention implementation it was converted with, replays the recorded conversions
    (``config.sgpa``), loads every saved tensor (strict: a missing or unexpected key raises, tied
    weights excepted) and returns the model in evaluation mode, as ``transformers`` does.  A
    checkpoint without a recorded conversion raises: load it with ``model_class.from_pretrained``.

    :param model_class: the model's ``transformers`` class (``BertForSequenceClassification``, ...) or an
        ``AutoModel*`` class.
    :param path: the directory the converted model was saved to.
    """
    transformers = require("transformers", "zoo", "gpytorch_sgpa.from_pretrained")
    path = os.fspath(path)
    is_model = isinstance(model_class, type) and issubclass(model_class, transformers.PreTrainedModel)
    config_class = model_class.config_class if is_model else transformers.AutoConfig
    config = config_class.from_pretrained(path)
    settings = getattr(config, "sgpa", None)
    if not settings:
        raise ValueError(
            f"{path} holds no SGPA conversion (its config has no 'sgpa' entry); load it with "
            f"{getattr(model_class, '__name__', 'the model class')}.from_pretrained"
        )
    for entry in settings["conversions"]:
        if entry["modules"] is None:
            raise ValueError(
                "the checkpoint was converted below its transformers model (convert called on a submodule), "
                "so the converted modules' paths are unknown: convert the whole model before saving"
            )
        if entry.get("unsaved_kwargs"):
            raise ValueError(
                f"the conversion to {entry['attention']!r} was given {entry['unsaved_kwargs']} as objects, "
                "which a config cannot hold: convert with names (e.g. kernel='rbf') before saving"
            )
    config.sgpa = None
    set_implementations(config, settings["attn_implementation"], settings.get("experts_implementation"))  # experts: absent from 0.1's
    model = model_class(config) if is_model else model_class.from_config(config)
    for entry in settings["conversions"]:
        convert(model, entry["attention"], **entry["kwargs"])
    if model.config.sgpa != settings:
        raise ValueError(
            f"replaying the recorded conversions of {path} replaced other modules than the saved model's "
            f"({model.config.sgpa} instead of {settings})"
        )
    tensors = _model_keys(model, _saved_tensors(path))
    floating = {tensor.dtype for tensor in tensors.values() if tensor.is_floating_point()}
    if len(floating) == 1:  # the model's dtype (non-persistent buffers included)
        model.to(floating.pop())
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if name in tensors and tensors[name].dtype != tensor.dtype:  # a tensor saved in another dtype keeps it
            tensor.data = tensor.data.to(tensors[name].dtype)
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    loaded = {id(p) for name, p in model.named_parameters(remove_duplicate=False) if name in tensors}
    untied = [name for name, p in model.named_parameters(remove_duplicate=False) if name in missing and id(p) not in loaded]
    untied += [name for name in missing if name not in dict(model.named_parameters(remove_duplicate=False))]
    if unexpected or untied:
        raise RuntimeError(
            f"the weights in {path} do not fit the converted {type(model).__name__}: missing {untied}, unexpected {unexpected}"
        )
    return model.eval()
