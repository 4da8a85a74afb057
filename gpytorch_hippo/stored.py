r"""What an online sparse GP keeps of the tasks it has absorbed (Bui, Nguyen & Turner 2017), thesis §4.2.2.

Old data are never revisited: a task only touches its own data and the stored summary of the tasks before it,
expressed in the old inducing variables :math:`a` and the mean function of its time. This module holds the
frozen copies of those modules (:func:`frozen_copy`), the stored summary of
:class:`~gpytorch_hippo.online.OnlineSGPR` (:class:`StoredTask`), the check that the mean function can still
be followed (:func:`check_mean_unchanged`) and the allocation that lets a fresh model load a saved task
(:func:`allocate_stored`).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple, TypeVar

import gpytorch
import torch
from torch import Tensor

from .inducing.base import InducingVariables

__all__ = ["StoredTask", "allocate_stored", "check_mean_unchanged", "frozen_copy", "is_stored"]

_ModuleT = TypeVar("_ModuleT", bound=torch.nn.Module)


def frozen_copy(module: _ModuleT, share: bool = True) -> _ModuleT:
    """A detached deep copy of ``module`` (inducing variables, mean function) whose tensors receive
    no gradients; a copy of inducing variables is owned by no variational strategy. ``share``: a module
    with its own ``frozen_copy`` (batched streams' variables) makes it, sharing what is identical.

    :param module: the module to copy (inducing variables, a mean function).
    :param share: ``True`` (default): use the module's own ``frozen_copy`` where it has one (streams in the same state
        share one copied set); ``False``: a plain ``copy.deepcopy``, every tensor its own.
    """
    own_copy = getattr(module, "frozen_copy", None) if share else None
    snapshot = own_copy() if own_copy is not None else copy.deepcopy(module)
    for parameter in snapshot.parameters():
        parameter.requires_grad_(False)
    if isinstance(snapshot, InducingVariables):
        snapshot.variational_owner = None
    return snapshot


def _frozen_copy_to_load(template: torch.nn.Module, state_dict: Mapping[str, Tensor], prefix: str) -> torch.nn.Module:
    """A frozen copy of ``template`` whose tensors take the shapes saved under ``prefix``, so that a
    fresh model can load a stored task whose variables differed from today's (e.g. another ``M``)."""
    snapshot = frozen_copy(template, share=False)  # every stream its own tensors, to take the saved shapes
    for name, tensor in itertools.chain(snapshot.named_parameters(), snapshot.named_buffers()):
        saved = state_dict.get(prefix + name)
        if saved is not None and saved.shape != tensor.shape:
            tensor.data = torch.empty(saved.shape, dtype=tensor.dtype, device=tensor.device)
    return snapshot


def allocate_stored(
    module: torch.nn.Module,
    state_dict: Mapping[str, Tensor],
    prefix: str,
    buffers: Iterable[str],
    copies: Mapping[str, torch.nn.Module],
    marker: str,
) -> None:
    """Allocate the buffers and frozen copies that exist only after a task (``None`` before), so that a fresh
    ``module`` loads the state of a trained one (call it first in ``_load_from_state_dict``).

    :param module: the online model or objective about to load ``state_dict``.
    :param state_dict: the state being loaded.
    :param prefix: the module's prefix in ``state_dict``.
    :param buffers: the names of the buffers to allocate where ``state_dict`` holds them.
    :param copies: attribute name -> the module (today's inducing variables, mean function) whose frozen copy,
        shaped as saved, the attribute gets where it is ``None``.
    :param marker: a buffer whose presence in ``state_dict`` says that a task was stored.
    """
    for name in buffers:
        if prefix + name in state_dict and getattr(module, name) is None:
            setattr(module, name, torch.empty_like(state_dict[prefix + name]))
    for name, template in copies.items():
        if getattr(module, name) is None and prefix + marker in state_dict:
            setattr(module, name, _frozen_copy_to_load(template, state_dict, f"{prefix}{name}."))


def is_stored(parts: Sequence[object], holder: str) -> bool:
    """Whether a task is stored: ``False`` if every part of it is ``None`` (before the first task), ``True`` if none
    is; a task stored in part (a checkpoint without some of its tensors, which torch cannot report missing on a
    fresh module) raises.

    :param parts: the stored modules and tensors.
    :param holder: who holds them, for the message (e.g. ``"the model holds only a part of the stored task"``).
    :raises RuntimeError: for a task stored in part.
    """
    if all(part is None for part in parts):
        return False
    if any(part is None for part in parts):
        raise RuntimeError(f"{holder}: load a complete state_dict")
    return True


def check_mean_unchanged(old_inducing_variables: InducingVariables, old_mean: torch.nn.Module, mean_module: torch.nn.Module) -> None:
    r"""Raise if the mean function changed since a task whose inducing variables project the centred process
    :math:`f - m` (interdomain variables; ``prior_mean`` is ``None``): their prior mean under the new mean would be
    :math:`\int (m_{new} - m_{old}) \phi`, which the interface does not provide. Point inducing variables need no
    check: their old prior mean is stored and the new one is :math:`m_{new}(Z_a)`.

    :param old_inducing_variables: the frozen inducing variables of the stored task.
    :param old_mean: the frozen mean function of the stored task.
    :param mean_module: today's mean function.
    :raises RuntimeError: if ``mean_module`` holds other values than ``old_mean`` and the old variables are interdomain.
    """
    if old_inducing_variables.prior_mean(mean_module) is not None:
        return
    old_state, state = old_mean.state_dict(), mean_module.state_dict()
    if old_state.keys() == state.keys() and all(torch.equal(old_state[k], state[k].detach()) for k in state):
        return
    raise RuntimeError(
        f"the mean function changed since the previous task, but {type(old_inducing_variables).__name__} project "
        "the centred process f - m, so the stored task cannot be re-expressed under the new mean: keep the mean "
        "fixed after the first task (mean_module.requires_grad_(False)), use a ZeroMean, or use InducingPoints"
    )


class StoredTask(NamedTuple):
    r"""What :meth:`~gpytorch_hippo.online.OnlineSGPR.update` keeps of the tasks absorbed so far: frozen copies of the
    inducing variables :math:`a` and of the mean function, and the summary in their coordinates
    :math:`w = L'^{-1}(a - \mu'_a)`: the stored :math:`q(w) \propto \exp(-\tfrac12 w^T \Lambda' w + w^T \eta')\, \mathcal N(w; 0, I)`.

    :param inducing_variables: frozen copy of the inducing variables :math:`a` of the last task.
    :param mean_module: frozen copy of the mean function of the last task.
    :param chol: :math:`L' = \operatorname{chol}(K'_{aa})` at the last task's hyperparameters ``(..., M, M)``.
    :param precision: :math:`\Lambda'`, the precision the tasks added to :math:`q(w)` ``(..., M, M)``.
    :param shift: :math:`\eta'`, the shift the tasks added ``(..., M)``.
    :param prior_mean: :math:`\mu'_a`, the prior mean of :math:`a` at the last task ``(..., M)``.
    """

    inducing_variables: InducingVariables
    mean_module: gpytorch.means.Mean
    chol: Tensor
    precision: Tensor
    shift: Tensor
    prior_mean: Tensor
