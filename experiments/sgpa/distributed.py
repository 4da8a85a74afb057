r"""Data-parallel training of the chapter-3 runners with PyTorch's ``torch.distributed``.

Launch a runner with ``torchrun --nproc-per-node N -m experiments.sgpa.calibration ...``:
:func:`init_from_environment` reads torchrun's ``RANK`` / ``WORLD_SIZE`` and joins the process
group (NCCL when CUDA is available, gloo otherwise).  Each training step then splits the global
mini-batch of ``batch_size`` examples into :math:`N` contiguous shards (:func:`shard`); every rank
runs its shard through :class:`~torch.nn.parallel.DistributedDataParallel`, which averages the
gradients.  Why that gives the single-process step:

* the per-rank loss is :math:`-(\mathrm{ELL}_r - w\, \mathrm{KL}_{\mathrm{weighted},r})` with :math:`\mathrm{ELL}_r` and the amortised KL
  averaged over the rank's :math:`n_r` sequences and the global KL :math:`\mathrm{KL}_g / \mathtt{num\_data}` once (``num_data`` is
  the size of the whole training set on every rank, :class:`~gpytorch_sgpa.elbo.SGPAELBO`);
* scaled by :math:`N n_r / B` (:math:`B` the global batch), the average over ranks is
  :math:`\sum_r (n_r / B)\, \mathrm{loss}_r`: per-sequence terms become the global-batch means and the global KL,
  present on every rank, is counted :math:`\sum_r n_r / B = 1` time, not :math:`N` times.

Random streams: the batch order comes from a generator seeded by the run's seed (the same on every
rank, so the shards partition the batch); sampler and dropout noise from the global RNG reseeded
per rank with :func:`rank_seed` (different per rank, reproducible per seed).  Evaluation and CSV
writing happen on rank 0 only; decisions that depend on noisy evaluations (checkpoint selection)
are broadcast from rank 0 (:func:`broadcast_from_main`) so every rank keeps the same model.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
import torch.distributed as dist

_joined_here = False  # whether init_from_environment created the default process group

__all__ = ["broadcast_from_main", "init_from_environment", "is_main", "rank_seed", "shard", "shutdown", "world"]


def init_from_environment() -> tuple[int, int]:
    """Join the process group torchrun describes (``WORLD_SIZE`` > 1) once; ``(rank, world_size)``.

    Without torchrun (no ``WORLD_SIZE``, or 1) nothing is initialised and ``(0, 1)`` is returned.
    """
    global _joined_here
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend=backend)
        _joined_here = True
    return world()


def shutdown() -> None:
    """Leave the process group if :func:`init_from_environment` joined it (a caller's own group stays)."""
    global _joined_here
    if _joined_here and dist.is_initialized():
        dist.destroy_process_group()
    _joined_here = False


def world() -> tuple[int, int]:
    """``(rank, world_size)`` of the initialised default process group, else ``(0, 1)``."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def is_main() -> bool:
    """``True`` on rank 0 (and without ``torch.distributed``): the rank that evaluates and writes."""
    return world()[0] == 0


def shard(index: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    r"""Rank ``rank``'s contiguous part of a global batch's ``index`` (sizes differ by at most 1).

    :param index: the global batch's example indices, ``(n,)`` with :math:`n \ge` ``world_size``.
    :param rank: this process's rank, in ``[0, world_size)``.
    :param world_size: the number of processes.
    """
    if len(index) < world_size:
        raise ValueError(
            f"a batch of {len(index)} examples cannot be split over world_size={world_size} ranks; "
            "use a batch size (and a data set size modulo it) of at least world_size"
        )
    return torch.tensor_split(index, world_size)[rank]


def rank_seed(seed: int, rank: int) -> int:
    """Seed of rank ``rank``'s noise stream: distinct per rank, a fixed function of ``seed``.

    :param seed: the run's seed.
    :param rank: the process's rank.
    """
    return (seed * 1_000_003 + rank * 7_919) % (2**63 - 1)


def broadcast_from_main(compute: Callable[[], float]) -> float:
    """``compute()`` on rank 0, its value on every rank (no call elsewhere); plain call without a group.

    :param compute: the function computing the value, called on rank 0 only.
    """
    rank, world_size = world()
    if world_size == 1:
        return compute()
    # NCCL broadcasts CUDA tensors only
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    value = torch.tensor([compute() if rank == 0 else 0.0], dtype=torch.float64, device=device)
    dist.broadcast(value, src=0)
    return float(value)


def average_gradients(parameters) -> None:
    """All-reduce (mean) the gradients of ``parameters`` that DDP does not manage (e.g. a likelihood's).

    :param parameters: the parameters whose ``.grad`` is averaged over the ranks in place (those without one are skipped).
    """
    world_size = world()[1]
    for parameter in parameters:
        if parameter.grad is not None:
            dist.all_reduce(parameter.grad)
            parameter.grad.div_(world_size)
