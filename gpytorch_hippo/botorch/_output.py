"""What one output of an :class:`~gpytorch_hippo.botorch.OnlineGPModel` is to the modules that fit and update it:
:class:`OutputModel`, the record of the hyperparameters its posterior belongs to, and :func:`own_update`."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any, Protocol

import torch
from torch import Tensor

from ..online import OnlineSGPR

__all__ = ["HyperparameterRecord", "OutputModel", "own_update"]


class HyperparameterRecord:
    """The kernel, likelihood and mean tensors that the stored posterior was computed with (``posterior``) and
    those of the constructor's fit of the sparse bound (``sparse_fit``, ``None`` with ``fit_maxiter=0``), so that a
    change made outside the model's own updates (``own_update`` ``False``) is noticed."""

    def __init__(self) -> None:
        self.posterior: list[Tensor] | None = None
        self.sparse_fit: list[Tensor] | None = None
        self.own_update = False
        #: the kept points (indices) of the last exact fit, ``None``: all (:func:`~gpytorch_hippo.botorch.fit.exact_fit_indices`)
        self.exact_fit_indices: Tensor | None = None
        #: the data ``train_inputs``/``train_targets`` hold during an exact fit of a subsample (``None``: all kept data)
        self.fit_data: tuple[Tensor, Tensor] | None = None
        #: the kernel's and likelihood's states before the first fit, where each scheduled refit on the kept data starts
        #: (as each ``SingleTaskGP`` that BoTorch's loops rebuild starts from its initial values); ``None`` after a reload
        self.initial: list[dict] | None = None

    @staticmethod
    def tensors(online: OnlineSGPR) -> list[Tensor]:
        """The parameters and buffers of ``online``'s kernel, likelihood and mean."""
        modules = (online.covar_module, online.likelihood, online.mean_module)
        return [t for module in modules for t in itertools.chain(module.parameters(), module.buffers())]

    def record(self, online: OnlineSGPR) -> None:
        """Note ``online``'s hyperparameters as those of its stored posterior."""
        self.posterior = [t.detach().clone() for t in self.tensors(online)]

    def differs(self, online: OnlineSGPR, snapshot: list[Tensor] | None) -> bool:
        """Whether ``online``'s hyperparameters differ from ``snapshot`` (``None``: nothing recorded, so ``False``)."""
        if snapshot is None:
            return False
        tensors = self.tensors(online)
        return len(snapshot) != len(tensors) or any(a.shape != b.shape or not torch.equal(a, b.detach()) for a, b in zip(snapshot, tensors))

    def at_sparse_fit(self, online: OnlineSGPR) -> bool:
        """Whether ``online``'s hyperparameters are still those of the constructor's fit of the sparse bound."""
        return self.sparse_fit is not None and not self.differs(online, self.sparse_fit)


class OutputModel(Protocol):
    """A single-output :class:`~gpytorch_hippo.botorch.OnlineGPModel` (or ``model.outputs[j]`` of one with several
    outputs) as the package's fitting and state modules read it."""

    online: OnlineSGPR
    num_updates: Tensor
    known_noise_flag: Tensor
    stored_inputs: Tensor | None
    stored_targets: Tensor | None
    stored_noise: Tensor | None
    hyperparameter_record: HyperparameterRecord
    keep_data: bool
    ordering: str
    fit_maxiter: int
    refit_every: int | None
    num_inducing: int | None
    exact_fit_size: int | None

    @property
    def batch_shape(self) -> torch.Size: ...

    @property
    def likelihood(self) -> Any: ...

    def eval(self) -> Any: ...

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]: ...

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None: ...


@contextlib.contextmanager
def own_update(*models: OutputModel):
    """The models' own hyperparameter changes (online refits, loading) inside the block: no recomputation of their
    posteriors on ``eval()``."""
    previous = [model.hyperparameter_record.own_update for model in models]
    for model in models:
        model.hyperparameter_record.own_update = True
    try:
        yield
    finally:
        for model, flag in zip(models, previous):
            model.hyperparameter_record.own_update = flag
