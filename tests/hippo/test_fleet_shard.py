"""A fleet's shard (gpytorch_hippo.fleet.shard): growing its batched model when streams join, the rules for
merging saved states, and checkpoints written atomically.

References: the shard's own state before growing (copied exactly), a single-stream OnlineSGPR for a new stream,
and states written out by hand.
"""

import os

import pytest
import torch
from test_fleet import STREAMS, model_factory, shard_data, single_model, tasks

from gpytorch_hippo.fleet import Shard
from gpytorch_hippo.fleet import shard as shard_module


def test_growing_a_shard_copies_the_old_streams_exactly_and_starts_new_ones_from_the_prior():
    shard = Shard(0, model_factory)
    data = tasks()[0]
    shard.update("t0", shard_data(data, STREAMS[:3]))
    before = shard.model.state_dict()
    shard.update("t1", {"meter-7": (data["meter-4"][0].unsqueeze(-1), data["meter-4"][1])})  # a new stream only
    after = shard.model.state_dict()
    assert shard.stream_ids == STREAMS[:3] + ["meter-7"]
    assert int(after.pop("num_tasks")) == int(before.pop("num_tasks")) + 1
    for key, value in before.items():
        grown = after[key]
        if not isinstance(value, torch.Tensor):  # the model's extra state (its time axis)
            assert grown == value, key
            continue
        assert torch.equal(grown if grown.shape == value.shape else grown[:3], value), key
    alone = single_model()
    alone.update(*data["meter-4"])
    for name in ("posterior_precision", "posterior_shift"):
        torch.testing.assert_close(getattr(shard.model, name)[3], getattr(alone, name), rtol=0, atol=1e-10)


def test_grow_state_rules():
    """Rows of per-stream tensors appended, shared tensors and extra state kept, entries of one side taken from it."""
    old = {
        "noise": torch.tensor([[1.0], [2.0]]),
        "shared": torch.tensor([5.0, 6.0]),
        "streams.1.t": torch.tensor(1.0),
        "streams.1._extra_state": {"dt": 0.1},
        "seen_input_range": torch.tensor([0.0, 3.0]),
    }
    new = {
        "noise": torch.tensor([[9.0], [9.0], [7.0]]),
        "shared": torch.tensor([0.0, 0.0]),
        "streams.1.t": torch.tensor(0.0),
        "streams.1._extra_state": {"dt": 0.5},
        "streams.2.t": torch.tensor(4.0),
    }
    grown = shard_module.grow_state(old, new, 2, 3)
    assert torch.equal(grown["noise"], torch.tensor([[1.0], [2.0], [7.0]])) and torch.equal(grown["shared"], old["shared"])
    assert grown["streams.1.t"] == 1.0 and grown["streams.1._extra_state"] == {"dt": 0.1} and grown["streams.2.t"] == 4.0
    assert torch.equal(grown["seen_input_range"], old["seen_input_range"]) and len(grown) == 6
    with pytest.raises(RuntimeError, match="stream dimension first"):
        shard_module.grow_state({"z": torch.zeros(4, 2)}, {"z": torch.zeros(4, 3)}, 2, 3)


def test_atomic_save_leaves_the_old_file_when_writing_fails(tmp_path, monkeypatch):
    path = str(tmp_path / "state.pt")
    shard_module.atomic_save({"a": 1}, path)

    def failing_save(obj, file):
        file.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(shard_module.torch, "save", failing_save)
    with pytest.raises(OSError, match="disk full"):
        shard_module.atomic_save({"a": 2}, path)
    monkeypatch.undo()
    assert torch.load(path) == {"a": 1} and os.listdir(tmp_path) == ["state.pt"]
