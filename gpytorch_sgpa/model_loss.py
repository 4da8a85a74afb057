r"""The loss a converted Hugging Face model returns when it is given ``labels`` (the ``transformers`` idiom that the
stock ``Trainer`` relies on).

A ``transformers`` model given ``labels`` returns its loss in ``outputs.loss``; for a model with SGPA layers the
cross-entropy of one sample is not its training objective.  :func:`gpytorch_sgpa.convert` therefore puts two hooks
on the converted ``PreTrainedModel`` (:func:`install_elbo_loss`); a forward pass given ``labels``:

* in training mode returns ``outputs.loss`` :math:`= -\mathrm{ELBO}` per sequence, ``-elbo(logits,
  kl_divergence(model), labels)`` of the :class:`~gpytorch_sgpa.elbo.SGPAELBO` built for the model (building one
  attaches it; the latest one built is used), and raises if none was built;
* in evaluation mode runs at the posterior mean (:func:`~gpytorch_sgpa.posterior_mean`), so evaluations are
  deterministic, unless sampling is asked for (inside :func:`~gpytorch_sgpa.per_example_noise`); its loss is then
  the negative expected log-likelihood per sequence (without the KL), as ``SGPATrainer``'s evaluation loss.

Without ``labels`` nothing changes: the model samples in both modes.  Causal language models (the models whose
``transformers`` loss shifts the labels) score ``logits[:, :-1]`` against ``labels[:, 1:]``.  The model is marked
``accepts_loss_kwargs = False``: ``Trainer`` then averages the micro-batches' losses of a gradient-accumulation step.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from torch import Tensor, nn

from . import attention
from ._outputs import output_logits
from .attention import SGPAttention, posterior_mean

__all__ = ["attach_elbo", "install_elbo_loss", "shifts_labels"]

_HOOKED = "_sgpa_elbo_loss"
_ELBO = "_sgpa_elbo"
_MEAN_CONTEXT = "_sgpa_mean_context"


def install_elbo_loss(model: nn.Module, kl_divergence: Callable[[nn.Module], Tensor]) -> None:
    """Put the hooks of this module's docstring on ``model``, a converted ``transformers`` model (once).

    :param model: the ``PreTrainedModel`` that holds the converted layers.
    :param kl_divergence: the function that sums the KL terms of the model's SGPA layers after a forward pass
        (:func:`gpytorch_sgpa.kl_divergence`).
    """
    if getattr(model, _HOOKED, False):
        return
    model.register_forward_pre_hook(_before, with_kwargs=True)
    model.register_forward_hook(functools.partial(_after, kl_divergence), with_kwargs=True, always_call=True)
    object.__setattr__(model, _HOOKED, True)
    object.__setattr__(model, "accepts_loss_kwargs", False)


def attach_elbo(elbo: nn.Module) -> None:
    """Make ``elbo`` the loss of every hooked model in ``elbo.model``'s tree (called by ``SGPAELBO``).

    :param elbo: the :class:`~gpytorch_sgpa.elbo.SGPAELBO`.
    """
    model = elbo.model
    if not isinstance(model, nn.Module):
        raise TypeError(f"elbo.model must be a torch.nn.Module, got {type(model).__name__}")
    for module in model.modules():
        if getattr(module, _HOOKED, False):
            object.__setattr__(module, _ELBO, elbo)


def _has_labels(model: nn.Module, kwargs: dict) -> bool:
    return kwargs.get("labels") is not None and any(isinstance(m, SGPAttention) for m in model.modules())


def _before(model: nn.Module, args, kwargs):
    if not _has_labels(model, kwargs):
        return None
    if model.training:
        if model.__dict__.get(_ELBO) is None:
            raise ValueError(
                f"{type(model).__name__} has SGPA layers and was given labels in training mode, so it would return "
                "the cross-entropy of one sample as its loss: build its objective first, "
                "gpytorch_sgpa.SGPAELBO(model, num_data=len(train_dataset)) (the model then returns the negative "
                "ELBO as outputs.loss), or train with gpytorch_sgpa.trainer.SGPATrainer"
            )
        return None
    if not attention.sampling_per_example():  # no sampling asked for: the posterior mean
        context = posterior_mean()
        context.__enter__()
        object.__setattr__(model, _MEAN_CONTEXT, context)
    return None


def shifts_labels(model: nn.Module) -> bool:
    """Whether ``model``'s ``transformers`` loss shifts the labels (a causal language model: the logits at position
    :math:`t` score the token at :math:`t + 1`).  ``Trainer`` reads the model's ``loss_type``, which some causal
    language models (GPT-2) leave unset; their class is then looked up among ``transformers``' causal LMs.

    :param model: the ``transformers`` model (not a ``peft`` wrapper).
    """
    from transformers.loss.loss_utils import LOSS_MAPPING, ForCausalLMLoss
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        return False
    loss_type = getattr(model, "loss_type", None)
    if loss_type in LOSS_MAPPING:
        return LOSS_MAPPING[loss_type] is ForCausalLMLoss
    return type(model).__name__ in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()


def _after(kl_divergence: Callable[[nn.Module], Tensor], model: nn.Module, args, kwargs, output):
    context = model.__dict__.pop(_MEAN_CONTEXT, None)
    if context is not None:
        context.__exit__(None, None, None)
    if output is None or not _has_labels(model, kwargs):  # output is None: the forward raised
        return None
    elbo = model.__dict__.get(_ELBO)
    if elbo is None:  # evaluation without an objective: the model's own loss of the posterior mean
        return None
    labels = kwargs["labels"]
    logits = output[1] if isinstance(output, tuple) else output_logits(output)  # a tuple starts with the loss
    if shifts_labels(model):
        logits, labels = logits[..., :-1, :], labels[..., 1:]
    if model.training:
        loss = -elbo(logits, kl_divergence(model), labels)
    else:
        loss = -elbo.expected_log_likelihood(logits, labels).mean()
    if isinstance(output, tuple):
        return (loss, *output[1:])
    output["loss"] = loss
    return output
