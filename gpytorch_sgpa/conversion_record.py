r"""The record of a conversion in a ``transformers`` model's configuration (``config.sgpa``).

:func:`gpytorch_sgpa.convert` calls :func:`record_conversion` for every conversion of a Hugging Face
model, so that ``save_pretrained`` writes it with the weights and :func:`gpytorch_sgpa.from_pretrained`
replays it (:mod:`gpytorch_sgpa.pretrained` describes the format and the loading).  The configuration
then names :data:`ATTN_IMPLEMENTATION`, an attention implementation whose functions raise naming
:func:`~gpytorch_sgpa.pretrained.from_pretrained`, and :data:`EXPERTS_IMPLEMENTATION`, an experts implementation
that does not exist (``transformers`` checks it when it builds any model, and ``from_pretrained(path,
attn_implementation="sdpa")`` does not replace it), so that the unconverted class refuses the checkpoint.
"""

from __future__ import annotations

import math
import sys
from typing import TypeVar

from torch import nn

from probseq._compat import attn_implementation, experts_implementation

_Model = TypeVar("_Model", bound=nn.Module)

__all__ = ["ATTN_IMPLEMENTATION", "EXPERTS_IMPLEMENTATION", "record_conversion", "register_refusal"]


#: The attention implementation a converted model's configuration names (see the module docstring).
ATTN_IMPLEMENTATION = "gpytorch_sgpa"
#: The experts implementation a converted model's configuration names: no such implementation exists, so building
#: the configuration's class without replaying the conversion raises, whatever ``attn_implementation`` it is given.
EXPERTS_IMPLEMENTATION = "gpytorch_sgpa: this checkpoint holds a converted model; load it with gpytorch_sgpa.from_pretrained"


def _json_value(value):
    """``value`` if JSON writes and reads it back unchanged, else ``None`` with ``False``."""
    if value is None or isinstance(value, (bool, int, str)) or (isinstance(value, float) and math.isfinite(value)):
        return value, True
    if isinstance(value, (list, tuple)):
        items = [_json_value(item) for item in value]
        return [item for item, _ in items], all(ok for _, ok in items)
    return None, False


def _refuse(*args, **kwargs):
    raise RuntimeError(
        "this model was loaded from a checkpoint of a model converted by gpytorch_sgpa.convert into the unconverted "
        "class, whose softmax attention has fresh query/key weights; load it with "
        "gpytorch_sgpa.from_pretrained(ModelClass, path), which replays the conversion and loads every weight"
    )


def register_refusal() -> None:
    """Register :data:`ATTN_IMPLEMENTATION` with ``transformers`` (attention and mask functions that
    raise naming :func:`~gpytorch_sgpa.pretrained.from_pretrained`); does nothing if ``transformers`` has not been imported."""
    if "transformers" not in sys.modules:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, _refuse)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, _refuse)


def _pretrained_roots(module: nn.Module, pretrained: type[_Model]) -> list[_Model]:
    """The outermost ``PreTrainedModel``\\ s of ``module``'s tree."""
    if isinstance(module, pretrained):
        return [module]
    return [m for child in module.children() for m in _pretrained_roots(child, pretrained)]


def record_conversion(root: nn.Module, attention: str, attention_kwargs: dict, replaced: dict) -> list[nn.Module]:
    """Append a conversion of ``root`` (``replaced``: ``id(old) -> (old, new)``) to the ``config.sgpa``
    of the ``transformers`` models in or around it (the format: :mod:`gpytorch_sgpa.pretrained`).

    :param root: the module :func:`~gpytorch_sgpa.convert` converted.
    :param attention: the layer type it converted to (one of :data:`~gpytorch_sgpa.transformer.ATTENTION_TYPES`).
    :param attention_kwargs: the layer keyword arguments of the conversion (JSON-serialisable values are saved, the
        others' names listed as ``unsaved_kwargs``).
    :param replaced: the replacements made, ``{id(old): (old, new)}``.

    Returns the ``transformers`` models whose modules were replaced.
    """
    if "transformers" not in sys.modules:  # then no model of it is in the tree; do not import it
        return []
    from transformers import PretrainedConfig, PreTrainedModel

    kwargs, unsaved = {}, []
    for key, value in attention_kwargs.items():
        kept, ok = _json_value(value)
        if ok:
            kwargs[key] = kept
        else:
            unsaved.append(key)
    new = {id(module) for _, module in replaced.values()}
    targets: list[tuple[PretrainedConfig, list[str] | None]] = []
    models: list[nn.Module] = []
    for model in _pretrained_roots(root, PreTrainedModel):
        paths = [name for name, module in model.named_modules() if id(module) in new]
        if paths:
            targets.append((model.config, paths))
            models.append(model)
    configs = {id(config) for config, _ in targets}
    # what an adapter keeps and drops of its family's attention (e.g. DeBERTa-v2's relative-position terms)
    notes = sorted({note for _, module in replaced.values() if (note := getattr(module, "conversion_note", None))})
    for _, module in replaced.values():  # converted below a transformers model: no paths to replay
        config = getattr(module, "config", None)
        if isinstance(config, PretrainedConfig) and id(config) not in configs:
            configs.add(id(config))
            targets.append((config, None))
    for config, modules in targets:
        settings = getattr(config, "sgpa", None) or {
            "attn_implementation": attn_implementation(config),
            "experts_implementation": experts_implementation(config),
            "conversions": [],
        }
        entry = {"attention": attention, "kwargs": kwargs, "modules": modules}
        if notes:
            entry["notes"] = notes
        if unsaved:
            entry["unsaved_kwargs"] = unsaved
        settings["conversions"].append(entry)
        config.sgpa = settings
        config.attn_implementation = ATTN_IMPLEMENTATION
        config.experts_implementation = EXPERTS_IMPLEMENTATION
    if targets:
        register_refusal()
    return models
