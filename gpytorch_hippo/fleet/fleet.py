"""A fleet of streams sharded over batched :class:`~gpytorch_hippo.OnlineSGPR` models, in process or on Ray actors."""

from __future__ import annotations

import collections
import copy
import json
import os
import zlib
from collections.abc import Callable, Hashable, Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from probseq._optional import require

from ..online import OnlineSGPR
from ..timeaxis import TimeAxis, align_on_index, as_time_axis, is_datetime_like, restore_time_axis
from .shard import PackedTask, Shard, StreamDataError, TimeResolutionError, task_conflict

__all__ = ["StreamFleet", "ENGINES", "shard_of"]

#: the engines :class:`StreamFleet` runs on
ENGINES = ("local", "ray")
_FLEET_FILE = "fleet.json"
# the positional arguments of Shard: index, model_factory, checkpoint_dir, before_update
_ShardArguments = tuple[int, Callable[[int], OnlineSGPR], str | None, Callable | None]


def shard_of(stream_id, num_shards: int) -> int:
    r"""The shard of ``stream_id``: :math:`\mathrm{crc32}(\mathrm{repr}(s)) \bmod \mathrm{num\_shards}`, the same in
    every process and whatever the order in which streams arrive (so a re-delivered task finds the same shards).

    :param stream_id: the stream's id (an int or a str, or a NumPy scalar of one: its Python value's ``repr`` is hashed).
    :param num_shards: the number of shards, a positive int.
    """
    return zlib.crc32(repr(_as_id(stream_id)).encode()) % num_shards


def _as_id(value, name: str = "a stream id") -> int | str:
    """``value`` as the plain ``int`` or ``str`` the checkpoints store: NumPy scalars (``np.str_``, ``np.int64``, what
    pandas columns give) become their Python value, so an id names one stream whatever its type.

    :param value: the id.
    :param name: what the id is, for the error message.
    :raises TypeError: for anything but an int or a str (``bool`` included).
    """
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"{name} must be an int or a str (stored in the checkpoints), got {type(value).__name__}: {value!r}")
    return str(value) if isinstance(value, str) else int(value)


def _as_tensor(values, name: str, stream_id) -> Tensor:
    """``values`` as a tensor: integers stay int64 (checked exactly when packed), other numbers become float64."""
    if isinstance(values, Tensor):
        return values
    try:
        array = np.asarray(values)
        return torch.as_tensor(array.astype(np.int64 if array.dtype.kind in "iu" else np.float64))
    except (TypeError, ValueError):
        raise StreamDataError(
            f"stream {stream_id!r}: {name} must be a tensor or an array of numbers, got {type(values).__name__}", [stream_id]
        ) from None


def _times(values, time_axis: TimeAxis | None, what: str, stream_ids: list):
    """``values`` through ``time_axis`` if they are calendar times (a ``TypeError`` saying how without an axis; a
    :class:`StreamDataError` naming ``stream_ids`` for times the axis refuses)."""
    if not is_datetime_like(values):
        return values
    if time_axis is None:
        raise TypeError(
            f"{what}: X holds calendar times: build the fleet with time_axis=TimeAxis('h') (or another unit, and "
            "origin=) to convert them, or pass numbers"
        )
    try:
        return time_axis(values)
    except ValueError as error:
        raise StreamDataError(f"{what}: {error}", stream_ids) from error


def _stream_data(stream_id, pair, time_axis: TimeAxis | None = None) -> tuple[Tensor, Tensor]:
    """``(X (n, d), y (n,))`` of one stream, finite, calendar times through ``time_axis``; a :class:`StreamDataError`
    naming the stream otherwise."""
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        raise StreamDataError(f"stream {stream_id!r}: expected a pair (X, y), got {type(pair).__name__}", [stream_id])
    try:
        aligned = align_on_index(pair[0], pair[1], ("X", "y"))
    except ValueError as error:
        raise StreamDataError(f"stream {stream_id!r}: {error}", [stream_id]) from None
    x = _as_tensor(_times(pair[0], time_axis, f"stream {stream_id!r}", [stream_id]), "X", stream_id)
    y = _as_tensor(aligned, "y", stream_id)
    if x.dim() == 1:
        x = x.unsqueeze(-1)
    if y.dim() != 1 or x.dim() != 2 or x.shape[0] != y.shape[0]:
        raise StreamDataError(
            f"stream {stream_id!r}: expected X of shape (n, d) or (n,) and y of shape (n,), got {tuple(x.shape)} and {tuple(y.shape)}",
            [stream_id],
        )
    for name, values in (("X", x), ("y", y)):
        if values.is_floating_point() and not bool(torch.isfinite(values).all()):
            raise StreamDataError(
                f"stream {stream_id!r}: {name} contains NaN or infinite values (leave missing observations out of the stream's task)",
                [stream_id],
            )
    return x, y


def _packed_inputs(x: Tensor, dtype: torch.dtype, what: str, stream_ids: list) -> Tensor:
    r"""``x`` (``(..., d)``) in the models' ``dtype``; a :class:`TimeResolutionError` naming ``stream_ids`` if that moves
    an integer input, makes two distinct inputs equal, or moves one by more than 1 % of its column's median spacing."""
    packed = x.to(dtype)
    if x.dtype == dtype or (x.is_floating_point() and torch.finfo(x.dtype).bits <= torch.finfo(dtype).bits):
        return packed
    columns = x.shape[-1] if x.dim() else 1
    exact = x.reshape(-1, columns).to(torch.float64).sort(0).values
    rounded = packed.reshape(-1, columns).to(torch.float64).sort(0).values
    moved = (rounded - exact).abs()
    if not x.is_floating_point():
        lost = bool((moved > 0).any())
    else:
        gaps = exact.diff(dim=0)
        merged = bool(((gaps > 0) & (rounded.diff(dim=0) == 0)).any())
        spacing = torch.stack(
            [column[column > 0].median() if bool((column > 0).any()) else column.new_tensor(torch.inf) for column in gaps.T]
        )
        lost = merged or bool((moved > 0.01 * spacing).any())
    if lost:
        raise TimeResolutionError(
            f"{what}: the models' {dtype} cannot hold these inputs (given as {x.dtype}) without moving them "
            f"by up to {float(moved.max()):g}: subtract an origin first (StreamFleet(time_axis=TimeAxis(unit, origin=...)) "
            "for calendar times), or build the models in float64",
            stream_ids,
        )
    return packed


class _LocalEngine:
    """The shards as objects of this process."""

    def __init__(self, make_shard: Callable[[int, bool], Shard], num_shards: int, resume: bool):
        self.shards = [make_shard(k, resume) for k in range(num_shards)]

    def call(self, method: str, arguments: Mapping[int, tuple]) -> dict:
        return {k: getattr(self.shards[k], method)(*args) for k, args in arguments.items()}

    def close(self) -> None:
        self.shards = []


class _ShardActor:
    """A :class:`~gpytorch_hippo.fleet.shard.Shard` as a Ray actor (``ray.remote(_ShardActor)``)."""

    def __init__(self, shard_arguments: _ShardArguments, resume: bool):
        torch.set_num_threads(1)
        self.shard = Shard(*shard_arguments, resume=resume)

    def call(self, method: str, args: tuple):
        return getattr(self.shard, method)(*args)

    def pid(self) -> int:
        return os.getpid()


class _RayEngine:
    """One Ray actor per shard. A call that finds its actor dead (``ray.kill``, a killed process) replaces
    the actor by a new one loaded from the shard's checkpoint and sends the call again: the shard's task ids
    make that exactly-once."""

    def __init__(
        self,
        shard_arguments: Callable[[int], _ShardArguments],
        num_shards: int,
        resume: bool,
        ray_init: dict | None,
        actor_options: dict | None,
        max_restarts: int,
    ):
        self.ray = require("ray", "fleet", "StreamFleet(engine='ray')")
        if not self.ray.is_initialized():
            self.ray.init(**({"include_dashboard": False} | dict(ray_init or {})))
        self.remote = self.ray.remote(_ShardActor).options(**dict(actor_options or {}))
        self.shard_arguments, self.max_restarts, self.restarts = shard_arguments, max_restarts, 0
        self.actors = [self.remote.remote(shard_arguments(k), resume) for k in range(num_shards)]

    def restart(self, k: int) -> None:
        """Replace shard ``k``'s actor by one that resumes from the checkpoint."""
        if self.shard_arguments(k)[2] is None:
            raise RuntimeError(f"shard {k}'s actor died and the fleet has no checkpoint_dir: its streams' state is lost")
        if self.restarts >= self.max_restarts:
            raise RuntimeError(f"shard {k}'s actor died and {self.restarts} restarts were spent (max_restarts)")
        self.restarts += 1
        try:
            self.ray.kill(self.actors[k], no_restart=True)
        except Exception:  # noqa: BLE001 - an actor that is gone already
            pass
        self.actors[k] = self.remote.remote(self.shard_arguments(k), True)

    def call(self, method: str, arguments: Mapping[int, tuple]) -> dict:
        """``{k: shard_k.method(*arguments[k])}``, the shards working in parallel; a shard whose actor is dead
        is restarted from its checkpoint and called again (once: a new actor that dies too raises)."""
        pending = {k: self.actors[k].call.remote(method, args) for k, args in arguments.items()}
        results, restarted = {}, set()
        while pending:
            k, reference = next(iter(pending.items()))
            try:
                results[k] = self.ray.get(reference)
                del pending[k]
            except self.ray.exceptions.RayActorError as error:
                if k in restarted:
                    raise RuntimeError(f"shard {k}'s actor died again after a restart from its checkpoint") from error
                restarted.add(k)
                self.restart(k)
                pending[k] = self.actors[k].call.remote(method, arguments[k])
        return results

    def close(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor, no_restart=True)
        self.actors = []


class StreamFleet:
    r"""Online GPs of many streams, sharded: shard ``k`` holds one batched :class:`~gpytorch_hippo.OnlineSGPR`
    (``model_factory(num_streams)``) for the streams ``s`` with :func:`shard_of` ``(s, num_shards) = k``.

    Each stream's posterior is its own single-stream model's (the batch dimension keeps streams independent):
    after tasks :math:`1, \dots, T` stream ``s`` holds :math:`q_T^{(s)}(u)` from exactly the tasks that had data of ``s``.

    **Durable and exactly-once.** With ``checkpoint_dir``, every shard writes ``(stream_ids, task_ids,
    state_dict)`` atomically after each :meth:`update` (temporary file, then ``os.replace``), and skips a
    ``task_id`` it absorbed before. So a task delivered again, after a crash at any point (some shards had
    written their checkpoint, others not), is absorbed exactly once by every shard; :meth:`restore` resumes
    a fleet from the directory in a new process, and the Ray engine replaces a dead actor by one loaded from
    its checkpoint before sending its call again. A task id delivered again with other data raises
    :class:`~gpytorch_hippo.fleet.shard.TaskConflictError` (the checkpoints hold a digest of each task), and a
    shard refuses to write over a checkpoint that another fleet wrote since it loaded it.

    :param model_factory: ``model_factory(num_streams)`` returns a batched ``OnlineSGPR`` with
        ``batch_shape=(num_streams,)`` (stream dimension first in every per-stream tensor); with the Ray
        engine it must be picklable (cloudpickle: functions, closures, ``functools.partial``).
    :param engine: ``"local"`` (shards in this process) or ``"ray"`` (one Ray actor per shard;
        ``pip install "probseq[fleet]"``).
    :param num_shards: :math:`k \ge 1`.
    :param checkpoint_dir: directory of the checkpoints (created); ``None``: no checkpoints, no recovery.
    :param before_update: ``before_update(model, X, mask)``, called on a shard's batched model before each update
        (``X (S, n, d)``, ``mask (S, n)``), e.g. to advance HiPPO inducing variables of the streams in the task.
    :param ray_init: keyword arguments of ``ray.init`` when Ray is not started yet, e.g. ``{"num_cpus": 4}``
        for a local instance (the default: Ray's own, without the dashboard) or ``{"address": "ray://head:10001"}``
        to attach to a cluster.
    :param actor_options: options of the shard actors (``num_cpus``, ``resources``, ...).
    :param max_restarts: how many dead actors the Ray engine replaces in this fleet's lifetime.
    :param time_axis: a :class:`~gpytorch_hippo.timeaxis.TimeAxis` (or its unit, e.g. ``"h"``) that turns calendar
        times (pandas ``DatetimeIndex``/``Series``, ``datetime64``) of every stream into numbers
        :math:`(t - \mathrm{origin}) / \mathrm{unit}` before any shard sees them; without ``origin=``, the origin is the
        earliest time of the first task with calendar times. Saved in ``checkpoint_dir`` with its origin.
        ``None`` (default): numbers only (calendar times raise a ``TypeError``).
    """

    def __init__(
        self,
        model_factory: Callable[[int], OnlineSGPR],
        engine: str = "local",
        num_shards: int = 1,
        checkpoint_dir: str | os.PathLike | None = None,
        before_update: Callable | None = None,
        ray_init: dict | None = None,
        actor_options: dict | None = None,
        max_restarts: int = 100,
        time_axis: TimeAxis | str | None = None,
    ):
        if checkpoint_dir is not None and os.path.exists(os.path.join(os.fspath(checkpoint_dir), _FLEET_FILE)):
            raise FileExistsError(f"{checkpoint_dir} holds a fleet already: resume it with StreamFleet.restore")
        self.time_axis = as_time_axis(time_axis)
        self._input_dim: int | None = None
        self._start(model_factory, engine, num_shards, checkpoint_dir, before_update, ray_init, actor_options, max_restarts, resume=False)
        self._save_manifest()

    def _save_manifest(self) -> None:
        """Write ``fleet.json``: the number of shards, the time axis (with its origin), the inputs' dimension."""
        if self.checkpoint_dir is not None:
            manifest = {
                "num_shards": self.num_shards,
                "time_axis": None if self.time_axis is None else self.time_axis.state(),
                "input_dim": self._input_dim,
            }
            atomic_save_json(manifest, os.path.join(self.checkpoint_dir, _FLEET_FILE))

    def _start(
        self, model_factory, engine, num_shards, checkpoint_dir, before_update, ray_init, actor_options, max_restarts, resume: bool
    ) -> None:
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
        if not isinstance(num_shards, int) or isinstance(num_shards, bool) or num_shards < 1:
            raise ValueError(f"num_shards must be a positive int, got {num_shards!r}")
        if not callable(model_factory):
            raise TypeError(f"model_factory must be callable as model_factory(num_streams), got {type(model_factory).__name__}")
        self.engine, self.num_shards = engine, num_shards
        self.checkpoint_dir = None if checkpoint_dir is None else os.fspath(checkpoint_dir)
        if self.checkpoint_dir is not None:
            os.makedirs(self.checkpoint_dir, exist_ok=True)

        def shard_arguments(k: int) -> _ShardArguments:
            return (k, model_factory, self.checkpoint_dir, before_update)

        self._engine: _LocalEngine | _RayEngine
        if engine == "local":
            self._engine = _LocalEngine(lambda k, resume: Shard(*shard_arguments(k), resume=resume), num_shards, resume)
        else:
            self._engine = _RayEngine(shard_arguments, num_shards, resume, ray_init, actor_options, max_restarts)
        self._members: list[list] = [[] for _ in range(num_shards)]
        #: per shard, the absorbed task ids and their contents' digests
        self._task_ids: list[dict] = [{} for _ in range(num_shards)]
        self._dtype: torch.dtype | None = None
        if resume:
            for k, summary in self._engine.call("summary", {k: () for k in range(num_shards)}).items():
                self._members[k], self._task_ids[k] = summary["stream_ids"], summary["task_digests"]

    @classmethod
    def restore(
        cls,
        checkpoint_dir: str | os.PathLike,
        model_factory: Callable[[int], OnlineSGPR],
        engine: str = "local",
        before_update: Callable | None = None,
        ray_init: dict | None = None,
        actor_options: dict | None = None,
        max_restarts: int = 100,
        time_axis: TimeAxis | str | None = None,
    ) -> StreamFleet:
        """The fleet whose checkpoints are in ``checkpoint_dir`` (its ``num_shards`` and time axis read from there),
        each shard at its last written task; deliver again the tasks after the last one :meth:`update` returned
        from (tasks a shard absorbed already are skipped). The other arguments: as for the constructor.

        :param checkpoint_dir: the directory a fleet wrote its checkpoints to (with its ``fleet.json``).
        :param model_factory: ``model_factory(num_streams)``, building the same models as the fleet's did.
        :param engine: ``"local"`` (default) or ``"ray"``; need not be the one the fleet ran on.
        :param before_update: ``before_update(model, X, mask)`` before each shard update; ``None`` (default): none.
        :param ray_init: keyword arguments of ``ray.init`` (Ray engine); ``None`` (default): Ray's own.
        :param actor_options: options of the shard actors (Ray engine); ``None`` (default): none.
        :param max_restarts: how many dead actors the Ray engine replaces (default 100).
        :param time_axis: ``None`` (default): the saved one; a ``TimeAxis`` or unit must agree with it (a ``ValueError``
            otherwise; one without an origin takes the saved origin).
        """
        manifest = os.path.join(os.fspath(checkpoint_dir), _FLEET_FILE)
        if not os.path.exists(manifest):
            raise FileNotFoundError(f"{manifest} not found: {checkpoint_dir} holds no fleet")
        with open(manifest) as file:
            saved = json.load(file)
        num_shards = saved["num_shards"]
        fleet = cls.__new__(cls)
        given = as_time_axis(time_axis)  # a copy takes the saved origin: the caller's axis stays as it was
        fleet.time_axis = restore_time_axis(None if given is None else copy.deepcopy(given), saved.get("time_axis"))
        fleet._input_dim = saved.get("input_dim")
        fleet._start(model_factory, engine, num_shards, checkpoint_dir, before_update, ray_init, actor_options, max_restarts, resume=True)
        return fleet

    # ------------------------------------------------------------------ membership
    @property
    def stream_ids(self) -> list:
        """Every stream, shard by shard, each shard's in the order of its batch dimension."""
        return [s for members in self._members for s in members]

    @property
    def shards(self) -> list[list]:
        """``shards[k]``: the stream ids of shard ``k`` (row ``i`` of its batched model is ``shards[k][i]``)."""
        return [list(members) for members in self._members]

    @property
    def task_ids(self) -> set:
        """The tasks every shard has absorbed."""
        return set.intersection(*(set(task_ids) for task_ids in self._task_ids))

    def shard_of(self, stream_id) -> int:
        """The shard that holds (or will hold) ``stream_id``.

        :param stream_id: the stream's id (an int or a str).
        """
        return shard_of(stream_id, self.num_shards)

    # ------------------------------------------------------------------ tasks
    def update(self, task_id: int | str, data: Mapping[Hashable, tuple]) -> bool:
        """Absorb task ``task_id``: ``data`` maps stream id -> ``(X (n, d) or (n,), y (n,))`` (tensors, arrays, pandas
        objects; calendar times with ``time_axis``).

        Streams absent from ``data`` are left exactly as they were; new stream ids join their shard. The data
        are checked before any shard sees them: :class:`StreamDataError` naming the stream (NaN or infinite
        values, mismatched shapes, inputs of another dimension than the other streams'), :class:`TimeResolutionError`
        (inputs the models' dtype cannot hold), :class:`~gpytorch_hippo.fleet.shard.TaskConflictError` (``task_id``
        absorbed before with other data). Every shard records ``task_id`` with a digest of its part and writes its
        checkpoint. Returns whether
        any shard absorbed the task now (``False``: it was delivered before with the same data, nothing changed).

        :param task_id: the task's id, an int or a str (or a NumPy scalar of one; stored in the checkpoints).
        :param data: mapping stream id (int or str, or a NumPy scalar of one) -> ``(X, y)``, ``X`` ``(n, d)`` or
            ``(n,)``, ``y`` ``(n,)``, finite.
        """
        task_id = _as_id(task_id, "task_id")
        if not isinstance(data, Mapping):
            raise TypeError(f"data must be a mapping stream_id -> (X, y), got {type(data).__name__}")
        data = {_as_id(stream_id): pair for stream_id, pair in data.items()}
        time_axis = self._task_time_axis(data)
        streams = {stream_id: _stream_data(stream_id, pair, time_axis) for stream_id, pair in data.items()}
        dims = self._check_dimensions(streams)
        dtype = self._model_dtype()
        parts: dict[int, dict] = {k: {} for k in range(self.num_shards)}
        for stream_id, (x, y) in streams.items():
            parts[self.shard_of(stream_id)][stream_id] = (_packed_inputs(x, dtype, f"stream {stream_id!r}", [stream_id]), y.to(dtype))
        packed = {k: PackedTask.from_mapping(part, dtype) for k, part in parts.items()}
        stored = {k: self._task_ids[k].get(task_id) for k in packed}
        conflicts = [k for k, task in packed.items() if stored[k] is not None and stored[k] != task.digest()]
        if conflicts:
            raise task_conflict(task_id, conflicts)
        if time_axis is not self.time_axis:
            self.time_axis = time_axis
            self._save_manifest()  # before any shard sees the task: a shard's times are on the saved axis
        results = self._engine.call("update", {k: (task_id, task) for k, task in packed.items()})
        for k, result in results.items():
            self._members[k] = result["stream_ids"]
            self._task_ids[k][task_id] = result["digest"]
        if self._input_dim is None and dims is not None:  # the models took inputs of this dimension
            self._input_dim = dims
            self._save_manifest()
        return any(result["absorbed"] for result in results.values())

    def _task_time_axis(self, data: Mapping) -> TimeAxis | None:
        """The time axis of this task: the fleet's, or, if it has no origin yet and the task has calendar times, a
        copy whose origin is the task's earliest time (the fleet takes it once every stream has been checked)."""
        axis = self.time_axis
        if axis is None or axis.origin is not None:
            return axis
        probes = []
        for stream_id, pair in data.items():
            if isinstance(pair, (tuple, list)) and len(pair) == 2 and is_datetime_like(pair[0]) and np.size(pair[0]):
                probe = copy.deepcopy(axis)  # no origin: it takes the stream's earliest time (and zone)
                _times(pair[0], probe, f"stream {stream_id!r}", [stream_id])
                probes.append(probe)
        return min(probes, key=lambda probe: str(probe.origin)) if probes else axis  # ISO strings of datetime64[ns] sort as times

    def _check_dimensions(self, streams: Mapping[Hashable, tuple[Tensor, Tensor]]) -> int | None:
        """The task's input dimension ``d``, the same for every stream with points and the fleet's (a
        :class:`StreamDataError` naming the other streams); ``None`` for a task without points."""
        dims = {stream_id: x.shape[-1] for stream_id, (x, _) in streams.items() if x.shape[0]}
        if not dims:
            return None
        counts = collections.Counter(dims.values())
        expected = self._input_dim if self._input_dim is not None else counts.most_common(1)[0][0]
        other = [stream_id for stream_id, d in dims.items() if d != expected]
        if other:
            raise StreamDataError(
                f"stream(s) {other[:10]}: X has {dims[other[0]]} column(s) where the fleet's streams have {expected} "
                f"(X of every stream: (n, {expected}){' or (n,)' if expected == 1 else ''})",
                other,
            )
        return expected

    def _model_dtype(self) -> torch.dtype:
        """The floating dtype of the shards' models (asked of shard 0 once)."""
        if self._dtype is None:
            self._dtype = self._engine.call("dtype", {0: ()})[0]
        return self._dtype

    def predict(self, stream_ids: Sequence, X, observation_noise: bool = False) -> tuple[Tensor, Tensor]:
        """Mean and variance ``(len(stream_ids), n)`` of each stream's latent ``f`` at ``X`` (with
        ``observation_noise``: of ``y``, the likelihood's noise added). ``X``: ``(n, d)`` or ``(n,)``, the
        same inputs for every stream, or ``(len(stream_ids), n, d)``, each stream's own; calendar times with
        ``time_axis``.

        :param stream_ids: ids of streams the fleet holds.
        :param X: the inputs (tensor, array or pandas object), as above.
        :param observation_noise: ``False`` (default): the latent ``f``; ``True``: ``y``, with the likelihood's noise.
        """
        stream_ids = [_as_id(s) for s in stream_ids]
        known = {s: k for k, members in enumerate(self._members) for s in members}
        unknown = [s for s in stream_ids if s not in known]
        if unknown:
            raise KeyError(f"unknown stream id(s) {unknown[:10]}: the fleet holds {len(known)} streams (StreamFleet.stream_ids)")
        if self.time_axis is not None and self.time_axis.origin is None and is_datetime_like(X):
            raise ValueError(
                "X holds calendar times but the fleet's time axis has no origin yet (no task had calendar times): "
                "build the fleet with time_axis=TimeAxis(unit, origin=...)"
            )
        x = _as_tensor(_times(X, self.time_axis, "X of predict", stream_ids), "X", "predict")
        if x.dim() in (1, 2):
            x = x.reshape(x.shape[0], -1).expand(len(stream_ids), -1, -1)
        if x.dim() != 3 or x.shape[0] != len(stream_ids):
            raise ValueError(f"X must have shape (n, d), (n,) or ({len(stream_ids)}, n, d), got {tuple(x.shape)}")
        x = _packed_inputs(x, self._model_dtype(), "X of predict", stream_ids)
        rows: dict[int, list[int]] = {}
        for i, s in enumerate(stream_ids):
            rows.setdefault(known[s], []).append(i)
        results = self._engine.call("predict", {k: ([stream_ids[i] for i in r], x[r], observation_noise) for k, r in rows.items()})
        mean = torch.empty(x.shape[:2], dtype=next(iter(results.values()))[0].dtype)
        variance = torch.empty_like(mean)
        for k, (m, v) in results.items():
            mean[rows[k]], variance[rows[k]] = m, v
        return mean, variance

    def close(self) -> None:
        """Release the shards (the Ray engine kills its actors; Ray itself keeps running)."""
        self._engine.close()

    def __enter__(self) -> StreamFleet:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def atomic_save_json(obj, path: str) -> None:
    """``obj`` as JSON in ``path``, written through a temporary file and ``os.replace``.

    :param obj: a JSON-serialisable object.
    :param path: the destination file; its directory must exist.
    """
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "w") as file:
        json.dump(obj, file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
