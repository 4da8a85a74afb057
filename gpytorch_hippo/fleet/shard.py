"""One shard of a :class:`~gpytorch_hippo.fleet.StreamFleet`: one batched :class:`~gpytorch_hippo.OnlineSGPR`
over the shard's streams, durable after every task and exactly-once per task id.

The state of a shard is ``(stream_ids, task_ids, model.state_dict())``: the streams in the order of the
model's batch dimension, the ids of the tasks absorbed so far (with a digest of each task's content) and the
batched model. After each task it is written to ``checkpoint_dir/shard-<k>.pt`` atomically (a temporary file
in the same directory, flushed and synced, then ``os.replace``): a reader sees the state before the task or
after it, never a mixture. A task id already in ``task_ids`` is skipped, so a task delivered again after a
crash (whether this shard wrote its checkpoint before the crash or not) is absorbed exactly once; delivered
again with other content, it raises :class:`TaskConflictError`. A shard writes only over the file it loaded or
wrote last: a file replaced by another writer (a second fleet on the same directory) raises.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import tempfile
from collections.abc import Callable, Hashable, Mapping
from typing import NamedTuple

import torch
from linear_operator import to_dense
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor

from .._validation import floating_dtype
from ..online import OnlineSGPR
from ..online import frozen_copy as _frozen_copy
from ..online import to_working_dtype as _working

__all__ = ["Shard", "PackedTask", "StreamDataError", "TimeResolutionError", "TaskConflictError", "CHECKPOINT_FORMAT"]

#: version of the checkpoint files' layout
CHECKPOINT_FORMAT = 1


class StreamDataError(ValueError):
    """Bad data of one or more streams (NaN or infinite values, mismatched shapes); ``stream_ids`` names them.

    :param message: the error message.
    :param stream_ids: the ids of the streams with bad data (stored as a list).
    """

    def __init__(self, message: str, stream_ids: list):
        super().__init__(message)
        self.stream_ids = list(stream_ids)


class TimeResolutionError(StreamDataError):
    """Inputs of one or more streams that the model's dtype cannot hold without moving them: integer times that
    change, distinct times that become equal, or times moved by more than 1 % of their stream's median spacing
    (e.g. epoch seconds in a float32 model: subtract an origin first, e.g. with a ``TimeAxis``, or build the
    models in float64)."""


class TaskConflictError(ValueError):
    """A task id delivered again with content other than the content absorbed under that id (checked by a digest
    stored in the checkpoints). A task id names one content: give new data a new task id."""


def task_conflict(task_id, shards: list[int]) -> TaskConflictError:
    """The error for ``task_id`` delivered again with other data than ``shards`` absorbed.

    :param task_id: the task delivered again.
    :param shards: the indices of the shards whose stored digest of the task differs from the new data's.
    """
    return TaskConflictError(
        f"task {task_id!r} was absorbed before with other data (shard(s) {shards}): a task delivered again must carry "
        "the same data (the same streams, inputs and observations); give new data a new task id"
    )


def checkpoint_path(checkpoint_dir: str | os.PathLike, index: int) -> str:
    """The file of shard ``index`` in ``checkpoint_dir``.

    :param checkpoint_dir: the fleet's checkpoint directory.
    :param index: the shard's index (``shard-<index>.pt``, four digits).
    """
    return os.path.join(os.fspath(checkpoint_dir), f"shard-{index:04d}.pt")


def atomic_save(obj, path: str) -> None:
    """``torch.save(obj)`` to ``path`` through a temporary file in the same directory and ``os.replace``.

    :param obj: what to save (anything ``torch.save`` takes).
    :param path: the destination file; its directory must exist.
    """
    directory = os.path.dirname(path) or "."
    handle, temporary = tempfile.mkstemp(prefix=".tmp-", suffix=".pt", dir=directory)
    try:
        with os.fdopen(handle, "wb") as file:
            torch.save(obj, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise


def set_prior_summary(model: OnlineSGPR) -> None:
    r"""Store the prior as ``model``'s summary: :math:`\Lambda' = 0`, :math:`\eta' = 0`
    (:math:`q(v) = \mathcal{N}(0, I) = p(v)`), :math:`L' = \operatorname{chol}(K_{uu})`, :math:`\mu'_u = m(u)`.
    The next update of such a stream is exactly its first one (every term of the stored task is multiplied by
    :math:`\Lambda'` or :math:`\eta'`).

    :param model: the (batched) online model whose stored summary is overwritten in place.
    """
    ivs, kernel = model.inducing_variables, model.covar_module
    with torch.no_grad():
        chol = psd_safe_cholesky(_working(to_dense(ivs.Kuu(kernel))))
        shift = torch.zeros(chol.shape[:-1], dtype=chol.dtype, device=chol.device)
        prior_mean = ivs.prior_mean(model.mean_module)
        prior_mean = shift if prior_mean is None else _working(prior_mean).expand(shift.shape)
        model.posterior_chol, model.posterior_precision = chol, torch.zeros_like(chol)
        model.posterior_shift, model.posterior_prior_mean = shift, prior_mean.clone()
        model.posterior_inducing_variables = _frozen_copy(ivs)
        model.posterior_mean_module = _frozen_copy(model.mean_module)


#: a key of stream ``s``'s own module in a batch of per-stream modules (``BatchedInducingVariables.streams``)
_STREAM_MODULE = re.compile(r"(?:^|\.)streams\.(\d+)\.")


def grow_state(old: dict, new: dict, old_streams: int, new_streams: int) -> dict:
    """The state of a model of ``new_streams`` streams whose first ``old_streams`` are ``old``'s (``new``: the state
    of a fresh ``model_factory(new_streams)``, primed with the prior summary):

    * a tensor whose shape depends on the number of streams (``(S, ...)``) takes ``old``'s rows, then ``new``'s
      last ones;
    * a tensor of the same shape in both (shared hyperparameters, counters), or a module's extra state, is ``old``'s;
    * an entry of an existing stream's own module (``streams.<s>.*``, ``s < old_streams``) is ``old``'s, whatever
      its shape (e.g. the breakpoints of HiPPO bases whose clock has moved);
    * an entry of ``new`` only is ``new``'s (the new streams' own modules, e.g. ``streams.<s>.*`` of
      ``BatchedInducingVariables`` of HiPPO bases), an entry of ``old`` only is ``old``'s
      (buffers a fresh model allocates at its first task, e.g. ``OnlineSGPR.seen_input_range``).

    :param old: the ``state_dict`` of the model of ``old_streams`` streams.
    :param new: the ``state_dict`` of a fresh model of ``new_streams`` streams.
    :param old_streams: the number of streams of ``old``.
    :param new_streams: the number of streams of ``new``, at least ``old_streams``.
    """
    grown = {}
    for key, fresh in new.items():
        stored = old.get(key)
        own = _STREAM_MODULE.search(key)
        if stored is not None and own is not None and int(own.group(1)) < old_streams:
            grown[key] = stored  # an existing stream's own module (e.g. HiPPO bases whose clock has moved)
        elif stored is None or not isinstance(stored, Tensor) or stored.shape == fresh.shape:
            grown[key] = fresh if stored is None else stored
        elif (
            stored.dim() == fresh.dim() >= 1
            and stored.shape[1:] == fresh.shape[1:]
            and (stored.shape[0], fresh.shape[0]) == (old_streams, new_streams)
        ):
            grown[key] = torch.cat([stored, fresh[old_streams:].to(stored.dtype)])
        else:
            raise RuntimeError(
                f"{key!r} has shape {tuple(stored.shape)} for {old_streams} streams and {tuple(fresh.shape)} for "
                f"{new_streams}: model_factory must put the stream dimension first (GPyTorch's batch_shape=(S,))"
            )
    for key in old.keys() - new.keys():
        grown[key] = old[key]
    return grown


#: a stream with more than this many times the median number of points of the streams in a shard's task is updated
#: in a model of its own rows (:func:`backlog_rows`), so that its backlog does not pad every row of the shard
BACKLOG_FACTOR = 8


def backlog_rows(counts: Tensor) -> list[int]:
    """The rows whose count exceeds :data:`BACKLOG_FACTOR` times the median count of the rows with points.

    :param counts: the number of points of each row ``(S,)``.
    """
    present = counts[counts > 0]
    if present.numel() < 2:
        return []
    limit = BACKLOG_FACTOR * float(present.median())
    return [row for row, count in enumerate(counts.tolist()) if count > limit]


def _renamed(key: str, rows: list[int]) -> str | None:
    """``key`` of a stream's own module ``streams.<j>.`` as ``streams.<rows[j]>.``; ``None`` for other keys."""
    own = _STREAM_MODULE.search(key)
    return None if own is None else key[: own.start(1)] + str(rows[int(own.group(1))]) + key[own.end(1) :]


def _per_stream(whole, part, num_streams: int, num_rows: int) -> bool:
    """Whether ``whole`` (``(num_streams, ...)``) and ``part`` (``(num_rows, ...)``) are one tensor's rows."""
    return (
        isinstance(whole, Tensor)
        and isinstance(part, Tensor)
        and whole.dim() >= 1
        and (whole.shape[0], part.shape[0]) == (num_streams, num_rows)
        and whole.shape[1:] == part.shape[1:]
    )


def select_rows(whole: dict, fresh: dict, rows: list[int], num_streams: int) -> dict:
    """The state of a model of the streams ``rows`` of a model of ``num_streams`` streams (the inverse of
    :func:`put_rows`): per-stream tensors (``(S, ...)``) take those rows, a stream's own module (``streams.<s>.*``) is
    renumbered, shared entries are copied.

    :param whole: the ``state_dict`` of the model of ``num_streams`` streams.
    :param fresh: the ``state_dict`` of ``model_factory(len(rows))`` primed with the prior summary (for the shapes).
    :param rows: the rows to select, in the order of the new model's rows.
    :param num_streams: the number of streams of ``whole``.
    """
    selected = {}
    for key, value in fresh.items():
        source = _renamed(key, rows)
        if source is not None:
            selected[key] = whole[source]
        elif key not in whole:
            selected[key] = value
        else:
            selected[key] = whole[key][rows] if _per_stream(whole[key], value, num_streams, len(rows)) else whole[key]
    return selected


def put_rows(whole: dict, part: dict, rows: list[int], num_streams: int) -> dict:
    """``whole`` with its streams ``rows`` replaced by the streams of ``part`` (a model of ``len(rows)`` streams, as
    :func:`select_rows` made it); shared entries (counters, the extra state) stay ``whole``'s.

    :param whole: the ``state_dict`` of the model of ``num_streams`` streams.
    :param part: the ``state_dict`` of the model of the streams ``rows``.
    :param rows: the rows of ``whole`` that ``part``'s rows replace, in ``part``'s row order.
    :param num_streams: the number of streams of ``whole``.
    """
    merged = dict(whole)
    for key, value in part.items():
        target = _renamed(key, rows)
        if target is not None:
            merged[target] = value
        elif key in whole and _per_stream(whole[key], value, num_streams, len(rows)):
            merged[key] = whole[key].clone()
            merged[key][rows] = value.to(whole[key].dtype)
    return merged


class PackedTask(NamedTuple):
    """The part of a task for one shard, packed for transport (a few tensors, not one per stream):
    ``x (P, n, d)``, ``y (P, n)`` padded, ``counts (P,)`` the points of stream ``stream_ids[i]``.

    :param stream_ids: the ``P`` stream ids, in row order.
    :param x: inputs ``(P, n, d)``, zero-padded after each stream's ``counts[i]`` points.
    :param y: observations ``(P, n)``, NaN-padded.
    :param counts: the number of points of each stream ``(P,)`` (long).
    """

    stream_ids: list
    x: Tensor
    y: Tensor
    counts: Tensor

    @classmethod
    def from_mapping(cls, data: Mapping[Hashable, tuple[Tensor, Tensor]], dtype: torch.dtype | None = None) -> PackedTask:
        """Pack ``{stream_id: (X (n_s, d), y (n_s,))}``: zeros pad ``x``, NaN pads ``y``.

        :param data: the mapping from stream id to its inputs ``(n_s, d)`` and observations ``(n_s,)``.
        :param dtype: the dtype of the packed tensors (the model's); ``None`` (default): the promoted dtype of the
            floating tensors, integers counting as float64.
        """
        stream_ids = list(data)
        pairs = [data[s] for s in stream_ids]
        n = max((y.shape[0] for _, y in pairs), default=0)
        dims = max((x.shape[-1] for x, _ in pairs), default=1)
        if dtype is None:
            dtypes = [t.dtype if t.is_floating_point() else torch.float64 for pair in pairs for t in pair]
            dtype = functools.reduce(torch.promote_types, dtypes, torch.float32)
        x = torch.zeros(len(pairs), n, dims, dtype=dtype)
        y = torch.full((len(pairs), n), torch.nan, dtype=dtype)
        counts = torch.tensor([ys.shape[0] for _, ys in pairs], dtype=torch.long)
        for row, (xs, ys) in enumerate(pairs):
            x[row, : ys.shape[0]], y[row, : ys.shape[0]] = xs, ys
        return cls(stream_ids, x, y, counts)

    def digest(self) -> str:
        """SHA-256 of the task's content: each stream's id, inputs and observations (dtype and shape included), the
        streams in the order of their ids' ``repr`` (the same content in another order has the same digest)."""
        digest = hashlib.sha256()
        for row in sorted(range(len(self.stream_ids)), key=lambda i: repr(self.stream_ids[i])):
            count = int(self.counts[row])
            x, y = self.x[row, :count].contiguous(), self.y[row, :count].contiguous()
            digest.update(f"{self.stream_ids[row]!r}:{tuple(x.shape)}:{x.dtype}".encode())
            digest.update(x.numpy().tobytes() + y.numpy().tobytes())
        return digest.hexdigest()

    def padded(self, stream_ids: list) -> tuple[Tensor, Tensor, Tensor]:
        """``(X (S, n, d), y (S, n), mask (S, n))`` over the shard's ``stream_ids`` (rows of streams absent
        from the task: no point), ``False`` in ``mask`` at padding.

        :param stream_ids: all the shard's stream ids (a superset of the task's), in the model's row order.
        """
        rows = torch.tensor([stream_ids.index(s) for s in self.stream_ids], dtype=torch.long)
        x = torch.zeros(len(stream_ids), *self.x.shape[1:], dtype=self.x.dtype)
        y = torch.full((len(stream_ids), self.y.shape[1]), torch.nan, dtype=self.y.dtype)
        mask = torch.zeros(len(stream_ids), self.y.shape[1], dtype=torch.bool)
        x[rows], y[rows] = self.x, self.y
        mask[rows] = torch.arange(self.y.shape[1]) < self.counts.unsqueeze(-1)
        return x, y, mask


class Shard:
    """One batched :class:`~gpytorch_hippo.OnlineSGPR` over the streams ``stream_ids`` (batch row ``i``:
    stream ``stream_ids[i]``), built by ``model_factory(num_streams)``.

    **Growth.** A task with streams the shard does not hold yet rebuilds the model as
    ``model_factory(S + n_new)`` and loads the old model's state into its first ``S`` rows
    (:func:`grow_state`): the old streams' summaries and hyperparameters are copied exactly, the new
    streams start from the factory's hyperparameters and the prior summary (:func:`set_prior_summary`),
    so their first task is their first update. The new streams join in the order of the task's mapping.

    **Backlogs.** Streams with more than :data:`BACKLOG_FACTOR` times the median number of points of the task's
    streams are updated in a model of their rows only (:func:`select_rows`, :func:`put_rows`): the batched update
    of the others is padded to their own longest stream, not to the backlog.

    :param index: the shard's index (its checkpoint is ``checkpoint_dir/shard-<index>.pt``).
    :param model_factory: ``model_factory(num_streams)`` builds a batched :class:`~gpytorch_hippo.OnlineSGPR` of
        batch shape ``(num_streams,)``.
    :param checkpoint_dir: directory of the checkpoints; ``None`` (default): none are written.
    :param before_update: ``before_update(model, X, mask)``, called before each batched update (e.g. to
        advance the inducing variables of the streams with points in the task to their new time; leave the
        other streams' variables as they are).
    :param resume: load ``checkpoint_dir``'s file of this shard if it exists.
    """

    def __init__(
        self,
        index: int,
        model_factory: Callable[[int], OnlineSGPR],
        checkpoint_dir=None,
        before_update: Callable | None = None,
        resume: bool = False,
    ):
        self.index = index
        self.model_factory = model_factory
        self.checkpoint_dir = None if checkpoint_dir is None else os.fspath(checkpoint_dir)
        self.before_update = before_update
        self.stream_ids: list = []
        #: the absorbed task ids and the digest of each one's content (``None``: absorbed by an older version)
        self.task_digests: dict = {}
        self.model: OnlineSGPR | None = None
        self._file_version: tuple | None = None
        if resume and self.checkpoint_dir is not None and os.path.exists(checkpoint_path(self.checkpoint_dir, index)):
            self.load()

    # ------------------------------------------------------------------ state
    @property
    def task_ids(self) -> set:
        """The ids of the tasks this shard has absorbed."""
        return set(self.task_digests)

    def state(self) -> dict:
        """What the checkpoint holds: format, index, stream ids, absorbed task ids (sorted by ``repr``) and their
        digests, model state."""
        return {
            "format": CHECKPOINT_FORMAT,
            "index": self.index,
            "stream_ids": list(self.stream_ids),
            "task_ids": sorted(self.task_digests, key=repr),
            "task_digests": dict(self.task_digests),
            "model": None if self.model is None else self.model.state_dict(),
        }

    def _checkpoint_version(self) -> tuple | None:
        """``(device, inode, mtime, size)`` of the checkpoint file (``None``: no file): ``os.replace`` by any writer changes it."""
        if self.checkpoint_dir is None:
            return None
        try:
            stat = os.stat(checkpoint_path(self.checkpoint_dir, self.index))
        except FileNotFoundError:
            return None
        return stat.st_dev, stat.st_ino, stat.st_mtime_ns, stat.st_size

    def check_sole_writer(self) -> None:
        """Raise if the checkpoint file is not the one this shard loaded or wrote last (another fleet wrote to
        ``checkpoint_dir``: writing now would drop that fleet's tasks)."""
        if self.checkpoint_dir is not None and self._checkpoint_version() != self._file_version:
            raise RuntimeError(
                f"{checkpoint_path(self.checkpoint_dir, self.index)} was written by another fleet since this one loaded or "
                "wrote it: two fleets cannot write to one checkpoint directory. Close the other fleet (or let its process "
                "end), then resume with StreamFleet.restore"
            )

    def save(self) -> None:
        """Write :meth:`state` atomically to ``checkpoint_dir`` (nothing without one)."""
        if self.checkpoint_dir is not None:
            atomic_save(self.state(), checkpoint_path(self.checkpoint_dir, self.index))
            self._file_version = self._checkpoint_version()

    def load(self) -> None:
        """Replace the in-memory state by the checkpoint's (a ``RuntimeError`` without a ``checkpoint_dir``)."""
        if self.checkpoint_dir is None:
            raise RuntimeError(f"shard {self.index} has no checkpoint_dir to load its checkpoint from")
        path = checkpoint_path(self.checkpoint_dir, self.index)
        version = self._checkpoint_version()
        state = torch.load(path, weights_only=True, map_location="cpu")
        if state.get("format") != CHECKPOINT_FORMAT or state.get("index") != self.index:
            raise RuntimeError(f"{path} is not a checkpoint of shard {self.index} in format {CHECKPOINT_FORMAT}")
        self.stream_ids, self._file_version = list(state["stream_ids"]), version
        self.task_digests = state.get("task_digests", dict.fromkeys(state["task_ids"]))
        self.model = None
        if state["model"] is not None:
            model = self._build(len(self.stream_ids))
            model.load_state_dict(state["model"])
            self.model = model

    def dtype(self) -> torch.dtype:
        """The floating dtype of the shard's models (a model of one stream is built to read it before the first task)."""
        return floating_dtype((self.model or self._build(1)).covar_module)

    def _build(self, num_streams: int) -> OnlineSGPR:
        model = self.model_factory(num_streams)
        if not isinstance(model, OnlineSGPR):
            raise TypeError(f"model_factory({num_streams}) must return an OnlineSGPR, got {type(model).__name__}")
        return model

    def _grown(self, new_streams: list) -> OnlineSGPR:
        """The model of ``stream_ids + new_streams``, the old streams' state copied exactly."""
        old, total = len(self.stream_ids), len(self.stream_ids) + len(new_streams)
        model = self._build(total)
        if self.model is None:
            return model
        if self.model.has_posterior:
            set_prior_summary(model)
        model.load_state_dict(grow_state(self.model.state_dict(), model.state_dict(), old, total))
        return model

    # ------------------------------------------------------------------ tasks
    def update(self, task_id, task: PackedTask | Mapping[Hashable, tuple[Tensor, Tensor]]) -> dict:
        """Absorb task ``task_id`` (this shard's part: a :class:`PackedTask`, or a mapping stream id ->
        ``(X (n, d), y (n,))``, checked by the fleet) unless it was absorbed before; then write the
        checkpoint. Returns ``{"absorbed": bool, "stream_ids": [...], "digest": str}`` (the digest of the content absorbed).

        :param task_id: the task's id (any hashable value; a repeated id with the same content is skipped).
        :param task: this shard's part of the task.
        :raises TaskConflictError: if ``task_id`` was absorbed with other content.
        :raises RuntimeError: if another writer replaced the checkpoint since this shard loaded or wrote it.
        """
        if not isinstance(task, PackedTask):
            task = PackedTask.from_mapping(task, self.dtype())
        digest = task.digest()
        if task_id in self.task_digests:
            if self.task_digests[task_id] not in (None, digest):
                raise task_conflict(task_id, [self.index])
            return {"absorbed": False, "stream_ids": list(self.stream_ids), "digest": self.task_digests[task_id]}
        self.check_sole_writer()
        new_streams = [s for s in task.stream_ids if s not in self.stream_ids]
        model = self._grown(new_streams) if new_streams else self.model
        stream_ids = self.stream_ids + new_streams
        if model is not None and int(task.counts.sum()) > 0:
            x, y, mask = (tensor.to(model.num_tasks.device) for tensor in task.padded(stream_ids))
            backlog = backlog_rows(mask.sum(-1))
            if backlog:  # the other streams padded to their own longest, the backlog in a model of its rows
                rest = mask.clone()
                rest[backlog] = False
                width = int(rest.sum(-1).max())
                self._update(model, stream_ids, x[:, :width], y[:, :width], rest[:, :width])
                model = self._with_rows_updated(model, stream_ids, backlog, x[backlog], y[backlog], mask[backlog])
            else:
                self._update(model, stream_ids, x, y, mask)
        self.model, self.stream_ids = model, stream_ids
        self.task_digests[task_id] = digest
        self.save()
        return {"absorbed": True, "stream_ids": list(self.stream_ids), "digest": digest}

    def _update(self, model: OnlineSGPR, stream_ids: list, x: Tensor, y: Tensor, mask: Tensor) -> None:
        """One batched update of ``model`` (its rows: ``stream_ids``), after the hook; errors name the streams."""
        if self.before_update is not None:
            self.before_update(model, x, mask)
        try:
            model.update(x, y, mask=mask)
        except ValueError as error:
            raise _named_streams(error, stream_ids) from error

    def _with_rows_updated(self, model: OnlineSGPR, stream_ids: list, rows: list[int], x: Tensor, y: Tensor, mask: Tensor) -> OnlineSGPR:
        """``model`` with its streams ``rows`` updated by ``(x, y, mask)`` (``len(rows)`` rows) in a model of those rows
        only (``model_factory(len(rows))``, their state selected by :func:`select_rows`, then put back)."""
        part = self._build(len(rows))
        set_prior_summary(part)
        state = model.state_dict()
        part.load_state_dict(select_rows(state, part.state_dict(), rows, len(stream_ids)))
        self._update(part, [stream_ids[row] for row in rows], x, y, mask)
        merged = self._build(len(stream_ids))
        set_prior_summary(merged)
        merged.load_state_dict(put_rows(state, part.state_dict(), rows, len(stream_ids)))
        return merged

    def predict(self, stream_ids: list, x: Tensor, observation_noise: bool = False) -> tuple[Tensor, Tensor]:
        """Mean and variance ``(len(stream_ids), n)`` of the latent ``f`` (``observation_noise``: of ``y``)
        at ``x`` (``(len(stream_ids), n, d)``) for streams of this shard, on the CPU (the model may live on
        another device: tasks are moved to it).

        :param stream_ids: ids of streams of this shard.
        :param x: inputs ``(len(stream_ids), n, d)``, row ``i`` for stream ``stream_ids[i]``.
        :param observation_noise: ``False`` (default): the latent ``f``; ``True``: ``y``, with the likelihood's noise.
        """
        rows = [self.stream_ids.index(s) for s in stream_ids]
        model = self.model
        if model is None:
            raise RuntimeError(f"shard {self.index} holds no stream yet: update it with a task before predicting")
        inputs = x[:1].expand(len(self.stream_ids), *x.shape[1:]).clone()
        inputs[rows] = x
        inputs = inputs.to(model.num_tasks.device)
        model.eval()
        with torch.no_grad():
            output = model(inputs)
            if observation_noise:
                output = model.likelihood(output)
            return output.mean[rows].cpu(), output.variance[rows].cpu()

    def summary(self) -> dict:
        """``{"stream_ids": [...], "task_digests": {task_id: digest}}`` of this shard."""
        return {"stream_ids": list(self.stream_ids), "task_digests": dict(self.task_digests)}


def _named_streams(error: ValueError, stream_ids: list) -> ValueError:
    """The batched model's error about stream indices (``stream(s) [i, ...]``) as a :class:`StreamDataError`
    naming the stream ids; any other error unchanged."""
    found = re.search(r"stream\(s\) \[([\d, ]+)\]", str(error))
    if found is None:
        return error
    named = [stream_ids[int(i)] for i in found.group(1).split(",")]
    return StreamDataError(f"stream(s) {named}: {error}", named)
