"""Training through Hugging Face ``accelerate``, as diffusers' own training scripts do.

:func:`train` runs ``steps`` optimiser steps of a model whose ``forward`` returns its training
loss (``AutoregressiveVideoDiffusion``, ``HeatHVAE``) or whose named method does (``loss=``: the
token priors' ``"loss"``; the method then runs inside a module that the data-parallel wrapper
calls, so that gradients are still averaged), on one process or, launched with ``torchrun
--nproc-per-node N`` or ``accelerate launch --multi_gpu --num_processes N`` (CPU processes where there
is no GPU; accelerate's ``--cpu`` flag would start a single process), on ``N`` data-parallel
processes: each draws its own batches (its generator is seeded by the seed and its rank) and the
gradients are averaged across processes, so one step of ``N`` processes with batches ``B_1..B_N``
is one step on their concatenation (exactly, where every video has the same number of latent slots). It also gives

* gradient accumulation (``accumulation`` micro-batches per optimiser step),
* mixed precision (``"bf16"``/``"fp16"``, accelerate's autocast),
* an EMA of the weights (diffusers' ``EMAModel``),
* checkpoints (``accelerator.save_state``: weights, optimiser, EMA, the data generator and the step
  count) every ``checkpoint_every`` steps, from which ``resume=True`` continues exactly as the
  uninterrupted run would have.

:func:`make_ema` and :func:`ema_weights` give the same EMA to a loop of your own and evaluate with it.

Needs the ``accelerate`` package (``pip install "probseq[video]"``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn
from tqdm import tqdm

from probseq._optional import require
from probseq._validation import check_int

MIXED_PRECISION = ("no", "bf16", "fp16")


class _LossOf(nn.Module):
    """``forward(*args)`` = ``model.<method>(*args)``: what the data-parallel wrapper calls."""

    def __init__(self, model: nn.Module, method: str):
        super().__init__()
        self.model, self.method = model, method

    def forward(self, *args):
        return getattr(self.model, self.method)(*args)


class TrainingProgress:
    """What a checkpoint keeps beside the model and optimiser: the step count and the data generator.

    :param generator: the process's data generator (its state is saved and restored).
    """

    def __init__(self, generator: torch.Generator):
        self.generator, self.step = generator, 0

    def state_dict(self) -> dict:
        return {"step": self.step, "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        """Restore the step count and the generator's state.

        :param state: a state of :meth:`state_dict` (``step`` and the generator's state).
        """
        self.step = int(state["step"])
        self.generator.set_state(state["generator"])


class TrainingResult(NamedTuple):
    """What :func:`train` returns: the unwrapped ``model``, its ``ema`` (or ``None``), the
    ``accelerator`` (``is_main_process``, ``num_processes``, ...) and this process's data ``generator``
    in its state after training.

    :param model: the trained model, unwrapped, in evaluation mode.
    :param ema: the ``EMAModel`` of its weights, or ``None`` (``ema_decay=0``).
    :param accelerator: the ``accelerate.Accelerator`` of the run.
    :param generator: this process's data generator, in its state after training.
    """

    model: nn.Module
    ema: Any
    accelerator: Any
    generator: torch.Generator


def rank_seed(seed: int, rank: int) -> int:
    """The data generator's seed of process ``rank``: ``seed`` on rank 0, distinct on the others.

    :param seed: the run's seed.
    :param rank: the process index.
    """
    return seed + 1_000_003 * rank


def train(
    model: nn.Module,
    next_batch: Callable[[torch.Generator], torch.Tensor],
    steps: int,
    *,
    optimizer_factory: Callable = lambda parameters: torch.optim.Adam(parameters, lr=5e-4),
    scheduler_factory: Callable | None = None,
    loss: str = "forward",
    batch_loss: Callable | None = None,
    generator: torch.Generator | None = None,
    accumulation: int = 1,
    mixed_precision: str = "no",
    ema_decay: float = 0.0,
    checkpoint_dir: str | Path | None = None,
    checkpoint_every: int = 0,
    resume: bool = False,
    seed: int = 0,
    cpu: bool = False,
    progress: bool = True,
    description: str = "training",
):
    """``steps`` optimiser steps of ``model`` on batches ``next_batch(generator)``: a :class:`TrainingResult`.

    Each micro-batch's loss is ``batch_loss(wrapped, batch, generator)`` (default
    ``wrapped(batch, generator)``), ``wrapped`` calling ``model.forward`` or the method named by
    ``loss``; its draws come from the process's generator after ``next_batch``'s. That generator
    is ``generator`` on process 0 when given (the run then continues its stream; default: seeded by
    ``seed``) and seeded by :func:`rank_seed` on the others. ``scheduler_factory(optimizer)`` adds a
    learning-rate schedule stepped once per optimiser step. ``resume=True`` loads
    ``checkpoint_dir`` if it holds a checkpoint (the run then continues from its step).

    :param model: the model; its ``forward`` (or the method ``loss``) returns the training loss.
    :param next_batch: ``next_batch(generator)`` returns one micro-batch (a tensor, moved to the accelerator's device).
    :param steps: the total number of optimiser steps, >= 0 (a resumed run counts those already done).
    :param optimizer_factory: ``optimizer_factory(parameters)`` builds the optimiser (default Adam at ``lr = 5e-4``).
    :param scheduler_factory: ``scheduler_factory(optimizer)`` builds a learning-rate schedule stepped once per optimiser
        step; ``None`` (the default): none.
    :param loss: the name of the model's method that returns the loss (default ``"forward"``).
    :param batch_loss: ``batch_loss(wrapped, batch, generator)`` computes a micro-batch's loss; ``None`` (the default):
        ``wrapped(batch, generator)``.
    :param generator: the data generator of process 0, whose stream the run continues; ``None`` (the default): seeded
        by ``seed``.
    :param accumulation: the micro-batches per optimiser step, a positive int (default 1).
    :param mixed_precision: ``"no"`` (the default), ``"bf16"`` or ``"fp16"`` (``MIXED_PRECISION``).
    :param ema_decay: the decay of the weights' EMA, in ``[0, 1)`` (default 0: no EMA).
    :param checkpoint_dir: the folder of the checkpoints; ``None`` (the default): no checkpoints.
    :param checkpoint_every: the optimiser steps between checkpoints, >= 0 (default 0: none).
    :param resume: whether to continue from the checkpoint in ``checkpoint_dir`` if it holds one (default ``False``).
    :param seed: the seed of the data generators (default 0).
    :param cpu: whether to train on the CPU even where an accelerator is available (default ``False``).
    :param progress: whether to show a tqdm progress bar on the main process (default ``True``).
    :param description: the progress bar's label (default ``"training"``).
    """
    accelerate = require("accelerate", "video", "pseudovideo.training")
    check_int(steps, "steps", low=0)
    check_int(accumulation, "accumulation")
    check_int(checkpoint_every, "checkpoint_every", low=0)
    if mixed_precision not in MIXED_PRECISION:
        raise ValueError(f"mixed_precision must be one of {MIXED_PRECISION}, got {mixed_precision!r}")
    if (checkpoint_every or resume) and checkpoint_dir is None:
        raise ValueError("checkpoint_every and resume need a checkpoint_dir")
    accelerator = accelerate.Accelerator(gradient_accumulation_steps=accumulation, mixed_precision=mixed_precision, cpu=cpu)
    if not isinstance(loss, str) or not callable(getattr(model, loss, None)):
        raise ValueError(f"loss must name a method of the model, got {loss!r}")
    inner = model
    optimizer = optimizer_factory(model.parameters())
    schedule = scheduler_factory(optimizer) if scheduler_factory is not None else None
    wrapped, optimizer = accelerator.prepare(model if loss == "forward" else _LossOf(model, loss), optimizer)
    if generator is None or accelerator.process_index != 0:
        generator = torch.Generator().manual_seed(rank_seed(seed, accelerator.process_index))
    state = TrainingProgress(generator)
    ema = make_ema(inner, ema_decay)
    accelerator.register_for_checkpointing(state)
    if ema is not None:
        accelerator.register_for_checkpointing(ema)
    if schedule is not None:
        accelerator.register_for_checkpointing(schedule)
    if resume and checkpoint_dir is not None and (Path(checkpoint_dir) / "custom_checkpoint_0.pkl").is_file():
        accelerator.load_state(str(checkpoint_dir))
    batch_loss = batch_loss or (lambda module, batch, rng: module(batch, rng))
    wrapped.train()
    bar = tqdm(
        total=steps, initial=state.step, desc=description, leave=False, disable=not progress or not accelerator.is_local_main_process
    )
    while state.step < steps:
        for _ in range(accumulation):
            with accelerator.accumulate(wrapped):
                batch = next_batch(state.generator).to(accelerator.device)
                accelerator.backward(batch_loss(wrapped, batch, state.generator))
                optimizer.step()
                optimizer.zero_grad()
        if schedule is not None:
            schedule.step()
        if ema is not None:
            ema.step(inner.parameters())
        state.step += 1
        bar.update()
        if checkpoint_every and state.step % checkpoint_every == 0:
            accelerator.save_state(str(checkpoint_dir))
    bar.close()
    inner.eval()
    return TrainingResult(inner, ema, accelerator, state.generator)


def make_ema(model: nn.Module, decay: float):
    """diffusers' ``EMAModel`` of ``model``'s parameters, or ``None`` for ``decay == 0``.

    :param model: the trained model whose parameters are averaged.
    :param decay: the EMA decay :math:`D`, in ``[0, 1)``; 0: no average.
    """
    if not 0.0 <= decay < 1.0:
        raise ValueError(f"--ema-decay must lie in [0, 1), got {decay}")
    if decay == 0.0:
        return None
    from diffusers.training_utils import EMAModel

    return EMAModel(model.parameters(), decay=decay)


@contextmanager
def ema_weights(model: nn.Module, ema):
    """Inside the block ``model`` holds the averaged weights (``ema`` from :func:`make_ema`); then its own.

    :param model: the model whose parameters are swapped for the block.
    :param ema: the ``EMAModel`` of :func:`make_ema`, or ``None`` (then ``model`` keeps its own weights).
    """
    if ema is None:
        yield model
        return
    ema.store(model.parameters())
    ema.copy_to(model.parameters())
    try:
        yield model
    finally:
        ema.restore(model.parameters())
