"""Mini-batch training and timed prediction shared by the chapter-3 experiment runners."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from gpytorch_sgpa.baselines.prediction import logits_of

from . import distributed


@dataclass
class Split:
    """Aligned examples: ``features`` (images ``N x C x H x W`` or token ids ``N x T``), an optional
    key padding mask ``N x T`` (True = padding) and integer ``labels`` ``N``.

    :param features: images ``(N, C, H, W)`` or token ids ``(N, T)``.
    :param labels: the labels, ``(N,)`` integers (or targets ``(N, T)`` for language models).
    :param padding_mask: bool ``(N, T)``, ``True`` at padding; ``None`` (the default): no padding.
    """

    features: torch.Tensor
    labels: torch.Tensor
    padding_mask: torch.Tensor | None = None

    def __post_init__(self):
        if self.labels.shape[0] != self.features.shape[0]:
            raise ValueError(f"labels has {self.labels.shape[0]} rows but features has {self.features.shape[0]}")
        if self.padding_mask is not None and self.padding_mask.shape != self.features.shape[:2]:
            raise ValueError(f"padding_mask must have shape {tuple(self.features.shape[:2])}")

    def __len__(self) -> int:
        return self.features.shape[0]

    def batch(self, index):
        """``(inputs, forward_kwargs, labels)`` for the rows in ``index``.

        :param index: the rows to take (an index tensor or anything a tensor accepts as an index).
        """
        kwargs = {} if self.padding_mask is None else {"key_padding_mask": self.padding_mask[index]}
        return self.features[index], kwargs, self.labels[index]

    def subset(self, index) -> Split:
        """The split of the rows in ``index``.

        :param index: the rows to keep (an index tensor or anything a tensor accepts as an index).
        """
        return Split(self.features[index], self.labels[index], None if self.padding_mask is None else self.padding_mask[index])


def _batches(num_items: int, batch_size: int, generator: torch.Generator | None):
    order = torch.randperm(num_items, generator=generator) if generator is not None else torch.arange(num_items)
    return [order[start : start + batch_size] for start in range(0, num_items, batch_size)]


def mle_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy: mean over inputs for class labels ``(B,)``; for token sequences ``(B, L)``
    (logits ``(B, L, C)``, ``-100`` = ignore) the summed per-sequence NLL averaged over sequences,
    the scale of :class:`~gpytorch_sgpa.elbo.SGPAELBO`'s expected log-likelihood.

    :param logits: the logits, ``(B, C)`` or ``(B, L, C)``.
    :param labels: class labels ``(B,)`` or token targets ``(B, L)`` (``-100`` = ignore).
    """
    if labels.dim() == 1:
        return torch.nn.functional.cross_entropy(logits, labels)
    return torch.nn.functional.cross_entropy(logits.transpose(1, -1), labels, reduction="sum") / labels.shape[0]


def learning_rate_factor(step: int, total_steps: int, final_ratio: float = 0.1, warmup_steps: int = 0) -> float:
    r"""The learning rate of update ``step`` (from 0) over ``lr``: a linear warm-up from ``final_ratio``
    to 1 over ``warmup_steps`` updates, then a linear decay from 1 to ``final_ratio`` at the last update
    ``total_steps - 1`` (thesis App. B.4: ``lr`` decaying linearly to :math:`\text{lr\_final} = \text{final\_ratio} \cdot \text{lr}`;
    the SGPA authors' code warms up from ``lr_final`` first).

    :param step: the update's index, from 0.
    :param total_steps: the number of updates of the whole schedule.
    :param final_ratio: the factor at the start of the warm-up and at the last update, ``lr_final / lr`` (default 0.1).
    :param warmup_steps: the number of warm-up updates (default 0).
    """
    if step < warmup_steps:
        return final_ratio + (1.0 - final_ratio) * step / warmup_steps
    return 1.0 - (1.0 - final_ratio) * (step - warmup_steps) / max(total_steps - 1 - warmup_steps, 1)


def train_classifier(
    model: torch.nn.Module,
    data: Split,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    elbo: torch.nn.Module | None = None,
    seed: int = 0,
    progress: bool = True,
    description: str = "train",
    on_epoch_end=None,
    stop_after: int | None = None,
    lr_final: float | None = None,
    warmup_fraction: float = 0.0,
    restart_optimizer_each_epoch: bool = False,
) -> float:
    r"""Adam with a learning rate decaying linearly to ``lr_final`` (default ``lr / 10``; thesis App.
    B.4), after a linear warm-up from ``lr_final`` over :math:`\lceil \text{warmup\_fraction} \cdot \text{steps} \rceil` updates
    (:func:`learning_rate_factor`); ``restart_optimizer_each_epoch`` builds a new Adam (moments
    reset) at every epoch, as the SGPA authors' code does. Returns s/epoch.

    Without ``elbo`` the loss is :func:`mle_loss` of the logits (MLE, with the model's dropout);
    with it, the loss is ``-elbo(logits, kl, labels)`` (thesis eq. (3.18), one sample per input).
    ``on_epoch_end(epoch, model)`` (epochs counted from 1) is called untimed after each epoch.
    ``stop_after = k`` stops after ``k`` of the ``epochs`` epochs, with the learning-rate schedule of
    all ``epochs`` (so the model equals that of the full run after ``k`` epochs).

    Under ``torch.distributed`` (:mod:`.distributed`, e.g. launched by torchrun) ``batch_size`` is
    the global batch: each rank trains on its shard through ``DistributedDataParallel`` with its
    loss scaled by :math:`\text{world\_size} \cdot n_\text{rank} / \text{batch\_size}`, which makes the step that of one process on
    the whole batch (derivation in :mod:`.distributed`); the ranks' noise streams differ.

    :param model: the network; its forward returns logits or ``(logits, kl)``.
    :param data: the training split.
    :param epochs: the epochs of the learning-rate schedule, a positive int.
    :param batch_size: the (global) batch size, a positive int.
    :param lr: the peak learning rate, > 0.
    :param elbo: the :class:`~gpytorch_sgpa.elbo.SGPAELBO` of ``model`` (its parameters are trained); ``None`` (the
        default): MLE.
    :param seed: the seed of the batch order (and of the ranks' noise streams; default 0).
    :param progress: whether to show a tqdm progress bar (default ``True``).
    :param description: the progress bar's label (default ``"train"``).
    :param on_epoch_end: ``on_epoch_end(epoch, model)`` called after each epoch; ``None`` (the default): none.
    :param stop_after: the number of epochs actually trained, in ``[1, epochs]``; ``None`` (the default): ``epochs``.
    :param lr_final: the learning rate at the last update, in ``(0, lr]``; ``None`` (the default): ``lr / 10``.
    :param warmup_fraction: the fraction of the updates warming up, in ``[0, 1)`` (default 0).
    :param restart_optimizer_each_epoch: whether a new Adam is built every epoch (default ``False``).
    """
    if epochs < 1 or batch_size < 1 or lr <= 0:
        raise ValueError(f"epochs, batch_size and lr must be positive, got {epochs}, {batch_size}, {lr}")
    final_ratio = 0.1 if lr_final is None else lr_final / lr
    if not 0 < final_ratio <= 1:
        raise ValueError(f"lr_final must lie in (0, lr={lr}], got {lr_final}")
    if not 0 <= warmup_fraction < 1:
        raise ValueError(f"warmup_fraction must lie in [0, 1), got {warmup_fraction}")
    run_epochs = epochs if stop_after is None else stop_after
    if not 1 <= run_epochs <= epochs:
        raise ValueError(f"stop_after must lie in [1, epochs={epochs}], got {stop_after}")
    rank, world_size = distributed.world()
    generator = torch.Generator().manual_seed(seed)
    trained_parameters = list((elbo if elbo is not None else model).parameters())
    optimizer = torch.optim.Adam(trained_parameters, lr=lr)
    wrapped, unmanaged = model, []
    if world_size > 1:
        last = len(data) % batch_size or batch_size
        if min(batch_size, last, len(data)) < world_size:
            raise ValueError(
                f"every batch needs >= world_size={world_size} examples; batch_size={batch_size} "
                f"with {len(data)} examples leaves a batch of {min(last, len(data))}"
            )
        torch.manual_seed(distributed.rank_seed(seed, rank))
        wrapped = DistributedDataParallel(model)  # broadcasts rank 0's parameters and buffers
        in_model = {id(p) for p in model.parameters()}
        unmanaged = [p for p in (elbo.parameters() if elbo is not None else ()) if id(p) not in in_model]
    steps_per_epoch = -(-len(data) // batch_size)
    total_steps = epochs * steps_per_epoch
    warmup_steps = math.ceil(warmup_fraction * total_steps)
    step = 0
    model.train()
    elapsed = 0.0
    bar = tqdm(total=run_epochs * steps_per_epoch, desc=description, disable=not progress or rank != 0, leave=False)
    for epoch in range(1, run_epochs + 1):
        start = time.perf_counter()
        if restart_optimizer_each_epoch and epoch > 1:
            optimizer = torch.optim.Adam(trained_parameters, lr=lr)
        for index in _batches(len(data), batch_size, generator):
            global_size = len(index)
            if world_size > 1:
                index = distributed.shard(index, rank, world_size)
            inputs, kwargs, labels = data.batch(index)
            output = wrapped(inputs, **kwargs)
            if elbo is None:
                loss = mle_loss(logits_of(output), labels)
            else:
                loss = -elbo(output[0], output[1], labels)
            if world_size > 1:
                loss = loss * (world_size * len(index) / global_size)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if unmanaged:
                distributed.average_gradients(unmanaged)
            for group in optimizer.param_groups:
                group["lr"] = lr * learning_rate_factor(step, total_steps, final_ratio, warmup_steps)
            optimizer.step()
            step += 1
            bar.update()
            if not bar.disable and bar.n % 20 == 0:  # reading the loss makes the host wait for the device
                bar.set_postfix(loss=f"{float(loss.detach()):.3f}")
        if loss.is_cuda:  # the epoch's time includes its queued GPU work
            torch.cuda.synchronize(loss.device)
        elapsed += time.perf_counter() - start
        if on_epoch_end is not None:
            on_epoch_end(epoch, model)
    bar.close()
    model.eval()
    return elapsed / run_epochs


@torch.no_grad()
def predict_in_batches(predict_fn, data: Split, batch_size: int) -> tuple[torch.Tensor, float]:
    """Concatenated ``predict_fn(inputs, **kwargs)`` over batches, and the mean seconds per batch.

    :param predict_fn: called as ``predict_fn(inputs, **kwargs)`` per batch (``kwargs``: the padding mask, if any).
    :param data: the split to predict.
    :param batch_size: the examples per batch.
    """
    outputs, elapsed = [], 0.0
    batches = _batches(len(data), batch_size, None)
    for index in batches:
        inputs, kwargs, _ = data.batch(index)
        start = time.perf_counter()
        outputs.append(predict_fn(inputs, **kwargs))
        elapsed += time.perf_counter() - start
    return torch.cat(outputs), elapsed / len(batches)
