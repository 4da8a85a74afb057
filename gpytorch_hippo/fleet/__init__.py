"""Fleets of streams: one online GP per stream, streams batched into shards, shards in process or on Ray actors.

:class:`StreamFleet` shards stream ids over ``k`` batched :class:`~gpytorch_hippo.OnlineSGPR` models,
absorbs tasks ``{stream_id: (X, y)}`` exactly once per task id, checkpoints every shard after every task
and resumes from the checkpoints (:meth:`StreamFleet.restore`). The Ray engine needs
``pip install "probseq[fleet]"``; from a checkout of the repository, ``python -m experiments.hippo.fleet_demo --out DIR``
runs the demo.
"""

from .fleet import ENGINES, StreamFleet, shard_of
from .shard import PackedTask, Shard, StreamDataError, TaskConflictError, TimeResolutionError

__all__ = ["StreamFleet", "StreamDataError", "TimeResolutionError", "TaskConflictError", "Shard", "PackedTask", "ENGINES", "shard_of"]
