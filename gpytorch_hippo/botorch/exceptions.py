"""The warnings of the online BoTorch surrogates (:class:`~gpytorch_hippo.botorch.OnlineGPModel`): BoTorch warnings,
so that BoTorch's loops and the filters of its tutorials (which silence ``RuntimeWarning``) show them."""

from __future__ import annotations

import warnings

from botorch.exceptions.warnings import BotorchWarning

__all__ = ["OnlineGPModelWarning", "InducingApproximationWarning", "warn_posterior_not_restored"]


class OnlineGPModelWarning(BotorchWarning):
    """Where an :class:`~gpytorch_hippo.botorch.OnlineGPModel` does not do what ``SingleTaskGP`` would at the same BoTorch
    call: a ``load_state_dict`` that does not restore the checkpoint's posterior, an exact fit that starts from the
    sparse fit, the sparse approximation's error, a refit rolled back. A ``BotorchWarning``, so BoTorch's loops and the
    filters of its tutorials (which silence ``RuntimeWarning``) show it."""


class InducingApproximationWarning(OnlineGPModelWarning):
    """New inputs where the inducing variables leave more prior variance than the observation noise: there the
    online model's posterior is wider than ``SingleTaskGP``'s on the same data, and its predictions deviate from it."""


def warn_posterior_not_restored() -> None:
    """The :class:`OnlineGPModelWarning` of a warm start by ``load_state_dict`` (one message, so Python's default
    filter shows it once per calling line), for code that meant ``load_state_dict`` as a restore."""
    warnings.warn(
        "load_state_dict of another model's checkpoint loads its hyperparameters (kernel, likelihood, mean) "
        "as SingleTaskGP does and keeps this model's data, posterior and counters: the checkpoint's posterior "
        "is not restored. To restore a checkpointed model use OnlineGPModel.from_state_dict(state_dict, ...); "
        "to warm-start without this warning use model.load_hyperparameters(state_dict)",
        OnlineGPModelWarning,
        stacklevel=4,  # the caller of model.load_state_dict
    )
