"""StreamFleet with the inputs of real workflows: pandas datetimes through a fleet-level TimeAxis, NumPy ids,
integer times, tasks delivered again with other data, two writers of one checkpoint directory, data of the
wrong dimension (each checked before any shard sees the task), a stream with a backlog, a refit with absent
streams and a kernel the chosen HiPPO backend does not take."""

import pathlib
import re

import gpytorch
import numpy as np
import pandas as pd
import pytest
import torch
from test_fleet import DT, STREAMS, TEST_X, model_factory, run, single_model, tasks

from gpytorch_hippo import InducingPoints, OnlineSGPR, TimeAxis
from gpytorch_hippo.fleet import StreamDataError, StreamFleet, TaskConflictError, TimeResolutionError

START = pd.Timestamp("2024-03-01 00:00")


def hourly_frames(seed: int = 0) -> list[dict]:
    """Three tasks of two streams as pandas frames: readings every 5 minutes on [2k, 2k + 2] hours with gaps (rows
    dropped); "route-b" joins in task 1; the first task starts at START."""
    generator = np.random.default_rng(seed)
    out = []
    for k in range(3):
        task = {}
        for i, stream in enumerate(["route-a", "route-b"]):
            if (k, i) == (0, 1):
                continue  # route-b joins in task 1
            picked = generator.choice(np.arange(120 * k + 5, 120 * k + 120, 5), size=8, replace=False)
            minutes = np.concatenate([[120 * k], np.sort(picked)])
            times = START + pd.to_timedelta(minutes, unit="min")
            frame = pd.DataFrame({"y": np.sin((1 + i) * minutes / 60) + 0.1 * generator.standard_normal(9)}, index=times)
            task[stream] = (frame.index, frame["y"])
        out.append(task)
    return out


def as_hours(task: dict) -> dict:
    return {s: (torch.tensor((index - START) / pd.Timedelta(hours=1)), torch.tensor(y.to_numpy())) for s, (index, y) in task.items()}


def test_pandas_datetimes_with_gaps_equal_the_same_hours_given_as_floats(tmp_path):
    frames = hourly_frames()
    reference = StreamFleet(model_factory, num_shards=2)
    for k, task in enumerate(frames):
        reference.update(k, as_hours(task))
    expected = reference.predict(["route-a", "route-b"], TEST_X)
    fleet = StreamFleet(model_factory, num_shards=2, checkpoint_dir=tmp_path, time_axis="h")  # origin: the first task's earliest time
    for k, task in enumerate(frames):
        fleet.update(k, task)
    assert fleet.time_axis.origin == np.datetime64(START)
    probe = START + pd.to_timedelta(TEST_X.numpy(), unit="h")
    for result in (fleet.predict(["route-a", "route-b"], probe), fleet.predict(["route-a", "route-b"], TEST_X)):
        for a, b in zip(expected, result):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert float(expected[1][0, 4]) < 0.5  # the data were learned (the prior's variance is 1)
    restored = StreamFleet.restore(tmp_path, model_factory)  # the axis is in the checkpoint
    assert restored.time_axis.unit == "h" and restored.time_axis.origin == np.datetime64(START)
    for a, b in zip(expected, restored.predict(["route-a", "route-b"], probe)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="origin"):
        StreamFleet.restore(tmp_path, model_factory, time_axis=TimeAxis("h", origin="2024-01-01"))
    with pytest.raises(ValueError, match="unit"):
        StreamFleet.restore(tmp_path, model_factory, time_axis="D")


def test_a_pandas_y_is_aligned_on_the_index_of_its_times_and_other_labels_are_refused():
    frames = hourly_frames()
    expected = StreamFleet(model_factory, time_axis="h")
    shuffled = StreamFleet(model_factory, time_axis="h")
    for k, task in enumerate(frames):
        expected.update(k, task)
        shuffled.update(k, {s: (index, y.sort_values()) for s, (index, y) in task.items()})  # y in another row order
    probe = START + pd.to_timedelta(TEST_X.numpy(), unit="h")
    for a, b in zip(expected.predict(["route-a", "route-b"], probe), shuffled.predict(["route-a", "route-b"], probe)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    index, y = hourly_frames(seed=1)[0]["route-a"]
    with pytest.raises(StreamDataError, match=r"route-a.*y\.to_numpy\(\)"):
        shuffled.update(3, {"route-a": (index, y.reset_index(drop=True))})
    assert 3 not in shuffled.task_ids


def test_datetimes_without_a_time_axis_are_refused_before_any_shard_sees_them():
    fleet = StreamFleet(model_factory, num_shards=2)
    with pytest.raises(TypeError, match=r"time_axis=TimeAxis\('h'\)"):
        fleet.update(0, hourly_frames()[1])
    assert fleet.stream_ids == [] and not any(fleet._task_ids)
    fleet.update(0, as_hours(hourly_frames()[0]))
    with pytest.raises(TypeError, match="time_axis"):
        fleet.predict(["route-a"], START + pd.to_timedelta([1.0], unit="h"))
    axis = StreamFleet(model_factory, time_axis="h")
    axis.update(0, as_hours(hourly_frames()[0]))  # numbers only: the axis has no origin yet
    with pytest.raises(ValueError, match="origin"):
        axis.predict(["route-a"], START + pd.to_timedelta([1.0], unit="h"))


def test_numpy_string_and_integer_ids_are_the_same_streams_as_their_python_values(tmp_path):
    task_list = tasks()
    reference = run(StreamFleet(model_factory, num_shards=3), task_list)
    fleet = StreamFleet(model_factory, num_shards=3, checkpoint_dir=tmp_path)
    for k, data in enumerate(task_list):  # ids as a NumPy string column gives them, every other task
        ids = np.array(list(data)) if k % 2 else list(data)
        assert fleet.update(np.int64(k), {s: data[str(s)] for s in ids})
    assert sorted(fleet.stream_ids) == sorted(STREAMS) and all(type(s) is str for s in fleet.stream_ids)
    assert fleet.task_ids == {0, 1, 2, 3}
    restored = StreamFleet.restore(tmp_path, model_factory)
    for result in (fleet.predict(np.array(STREAMS), TEST_X), restored.predict(STREAMS, TEST_X)):
        for a, b in zip(reference, result):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    assert fleet.shard_of(np.str_("meter-3")) == fleet.shard_of("meter-3")
    with pytest.raises(TypeError, match="stream id"):
        fleet.update(9, {np.bool_(True): task_list[0]["meter-0"]})


def seconds_factory(dtype: torch.dtype):
    """Streams on epoch seconds around 1.7e9: points over 10 minutes, length scale a minute."""
    origin = 1_700_000_000

    def factory(num_streams: int) -> OnlineSGPR:
        batch = torch.Size([num_streams])
        kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(batch_shape=batch), batch_shape=batch).to(dtype)
        kernel.base_kernel.lengthscale = 60.0
        likelihood = gpytorch.likelihoods.GaussianLikelihood(batch_shape=batch).to(dtype)
        likelihood.noise = 0.01
        points = (origin + torch.linspace(0, 600, 12, dtype=torch.float64)).to(dtype).expand(num_streams, 12).unsqueeze(-1).clone()
        return OnlineSGPR(InducingPoints(points, learn=False), kernel, likelihood, captured_variance_warning=None)

    return factory, origin


def test_integer_times_are_packed_in_the_models_dtype_and_a_loss_of_resolution_is_refused():
    factory, origin = seconds_factory(DT)
    seconds = torch.arange(origin + 60, origin + 600, 60)  # int64
    y = torch.sin(torch.arange(seconds.shape[0], dtype=DT))
    fleet = StreamFleet(factory, num_shards=2)
    fleet.update(0, {"route-a": (seconds, y), "route-b": (seconds.numpy()[:4], y[:4].numpy())})
    alone = factory(1)
    alone.update(seconds.to(DT).view(1, -1, 1), y.view(1, -1))
    probe = (origin + torch.arange(0, 600, 30)).to(DT)
    alone.eval()
    with torch.no_grad():
        expected = alone(probe.view(1, -1, 1)).mean[0]
    torch.testing.assert_close(fleet.predict(["route-a"], probe)[0][0], expected, rtol=0, atol=1e-10)
    factory32, _ = seconds_factory(torch.float32)
    fleet32 = StreamFleet(factory32, num_shards=2)
    with pytest.raises(TimeResolutionError, match="route-b") as caught:  # 1,700,000,060 is not a float32
        fleet32.update(0, {"route-a": (torch.tensor([origin]), torch.zeros(1)), "route-b": (seconds, y)})
    assert caught.value.stream_ids == ["route-b"] and fleet32.stream_ids == [] and not any(fleet32._task_ids)
    with pytest.raises(TimeResolutionError, match="float32"):  # float seconds a minute apart merge in float32
        fleet32.update(0, {"route-b": (seconds.to(DT), y)})
    hours = StreamFleet(lambda n: model_factory(n).float(), num_shards=2)
    hours.update(0, {s: (x, y) for s, (x, y) in tasks(1)[0].items()})  # float64 hours on [0, 2]: float32 resolves them
    assert len(hours.stream_ids) == 6


def test_a_task_delivered_again_with_other_data_is_an_error_and_the_same_data_are_skipped(tmp_path):
    task_list = tasks()
    fleet = StreamFleet(model_factory, num_shards=2, checkpoint_dir=tmp_path)
    run(fleet, task_list)
    same = {s: (x.numpy(), y.tolist()) for s, (x, y) in reversed(task_list[2].items())}  # as arrays, in another order
    assert not fleet.update(2, same)
    changed = dict(task_list[2], **{"meter-9": task_list[2]["meter-0"]})  # a new stream in the re-delivered task
    restored = StreamFleet.restore(tmp_path, model_factory)
    for target in (fleet, restored):
        with pytest.raises(TaskConflictError, match="task 2"):
            target.update(2, changed)
        with pytest.raises(TaskConflictError, match="task 3"):
            target.update(3, {**task_list[3], "meter-0": (task_list[3]["meter-0"][0], task_list[3]["meter-0"][1] + 1)})
        assert "meter-9" not in target.stream_ids


def test_a_second_fleet_writing_to_one_checkpoint_directory_is_refused(tmp_path):
    task_list = tasks()
    fleet = StreamFleet(model_factory, num_shards=2, checkpoint_dir=tmp_path)
    for k in range(2):
        fleet.update(k, task_list[k])
    first, second = StreamFleet.restore(tmp_path, model_factory), StreamFleet.restore(tmp_path, model_factory)
    first.update(2, task_list[2])
    with pytest.raises(RuntimeError, match="another fleet"):
        second.update(3, task_list[3])
    assert StreamFleet.restore(tmp_path, model_factory).task_ids == {0, 1, 2}  # the first fleet's task is kept
    first.update(3, task_list[3])
    assert StreamFleet.restore(tmp_path, model_factory).task_ids == {0, 1, 2, 3}


def test_a_stream_of_another_dimension_is_refused_before_any_shard_sees_the_task():
    fleet = StreamFleet(model_factory, num_shards=2)
    task_list = tasks(2)
    fleet.update(0, task_list[0])
    bad = dict(task_list[1])
    x, y = bad["meter-5"]
    bad["meter-5"] = (torch.stack([x, x], -1), y)  # two columns in a fleet of times
    with pytest.raises(StreamDataError, match="meter-5") as caught:
        fleet.update(1, bad)
    assert caught.value.stream_ids == ["meter-5"] and all(shard.task_ids == {0} for shard in fleet._engine.shards)
    fleet.update(1, task_list[1])
    alone = single_model()
    for data in task_list:
        alone.update(*data["meter-5"])
    alone.eval()
    with torch.no_grad():
        torch.testing.assert_close(fleet.predict(["meter-5"], TEST_X)[0][0], alone(TEST_X).mean, rtol=0, atol=1e-8)


def test_the_guides_calendar_example_is_the_fleet_on_hours():
    page = pathlib.Path(__file__).resolve().parents[2] / "docs" / "guide" / "fleet.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    namespace: dict = {}
    for marker in ("StreamFleet.restore(checkpoints", "time_axis=TimeAxis"):
        (block,) = [b for b in blocks if marker in b]
        exec(compile(block, str(page), "exec"), namespace)
    hours = StreamFleet(namespace["model_factory"])
    hours.update("day-1", {"meter-a": (torch.tensor([0.0, 1.5, 4.0], dtype=DT), torch.tensor([0.1, 0.4, 0.3], dtype=DT))})
    torch.testing.assert_close(
        namespace["mean"], hours.predict(["meter-a"], torch.tensor([0.0, 1.5, 4.0], dtype=DT))[0], rtol=0, atol=1e-12
    )


@pytest.mark.parametrize("inducing", ["points", "hippo"])
def test_a_stream_with_a_backlog_is_updated_in_a_model_of_its_own_not_padding_its_shard(inducing):
    """A stream with 300 points in a task where the others have at most 15: the shard's batched update is padded to
    the others' longest, the backlog is absorbed by a model of its row only; every stream still equals its own
    single-stream model (LegS bases with a clock per stream included)."""
    from experiments.hippo.fleet_demo import EmploymentModelFactory

    factory = EmploymentModelFactory(12, horizon=8.0, lengthscale=0.7, inducing=inducing)
    advance = factory.before_update or (lambda model, x, mask: None)
    shapes = []

    def hook(model, x, mask):
        shapes.append(tuple(x.shape))
        advance(model, x, mask)

    task_list = tasks(2)
    t = torch.linspace(2.005, 3.995, 300, dtype=DT)
    task_list[1]["meter-5"] = (t, torch.sin(2 * t))
    fleet = StreamFleet(factory, num_shards=1, before_update=hook)
    for k, data in enumerate(task_list):
        fleet.update(k, data)
    assert shapes[1] == (6, max(y.shape[0] for s, (_, y) in task_list[1].items() if s != "meter-5"), 1) and shapes[2] == (1, 300, 1)
    mean, variance = fleet.predict(STREAMS[:6], TEST_X)
    for row, stream in enumerate(STREAMS[:6]):
        alone = factory(1)
        for data in task_list:
            if stream in data:
                x, y = data[stream][0].view(1, -1, 1), data[stream][1].view(1, -1)
                advance(alone, x, torch.ones(y.shape, dtype=torch.bool))
                alone.update(x, y)
        alone.eval()
        with torch.no_grad():
            reference = alone(TEST_X.view(1, -1, 1))
        torch.testing.assert_close(mean[row], reference.mean[0], rtol=0, atol=1e-8)
        torch.testing.assert_close(variance[row], reference.variance[0], rtol=0, atol=1e-8)


def test_a_fleet_refit_keeps_every_bit_of_a_stream_absent_from_the_task():
    def refitting_factory(num_streams: int) -> OnlineSGPR:
        model = model_factory(num_streams)
        model.refit_every, model.refit_iter = 1, 10  # an L-BFGS fit of the hyperparameters on every task
        return model

    fleet = StreamFleet(refitting_factory, num_shards=1)
    task_list = tasks(2)  # meter-3 is absent from task 1
    fleet.update(0, task_list[0])
    shard = fleet._engine.shards[0]
    row, num_streams = shard.stream_ids.index("meter-3"), len(shard.stream_ids)
    per_stream = {
        k: v[row].clone()
        for k, v in shard.model.state_dict().items()
        if isinstance(v, torch.Tensor) and v.dim() and v.shape[0] == num_streams
    }
    lengthscale = shard.model.covar_module.base_kernel.lengthscale.detach().clone()
    fleet.update(1, task_list[1])
    after = shard.model.state_dict()
    assert {k for k, v in per_stream.items() if not torch.equal(after[k][row], v)} == set()
    assert "covar_module.base_kernel.raw_lengthscale" in per_stream and "posterior_chol" in per_stream
    moved = shard.model.covar_module.base_kernel.lengthscale.detach() != lengthscale
    assert not bool(moved[row].any()) and bool(moved.any())  # the other streams were refitted


def test_a_kernel_the_lyapunov_backend_does_not_take_raises_its_named_error_through_the_fleet():
    from experiments.hippo.fleet_demo import EmploymentModelFactory
    from gpytorch_hippo import HiPPOInducingVariables
    from gpytorch_hippo.inducing.covariances import UnsupportedKernelError

    def periodic_factory(num_streams: int) -> OnlineSGPR:
        batch = torch.Size([num_streams])
        product = gpytorch.kernels.ProductKernel(
            gpytorch.kernels.MaternKernel(nu=1.5, batch_shape=batch), gpytorch.kernels.RBFKernel(batch_shape=batch)
        )
        kernel = gpytorch.kernels.ScaleKernel(product, batch_shape=batch).double()
        variables = HiPPOInducingVariables(8, "legs", t=0.1, method="lyapunov", batch_shape=batch)
        return OnlineSGPR(variables, kernel, gpytorch.likelihoods.GaussianLikelihood(batch_shape=batch).double())

    fleet = StreamFleet(periodic_factory, num_shards=2, before_update=EmploymentModelFactory.advance_clocks)
    t = torch.linspace(0.1, 2, 20, dtype=DT)
    with pytest.raises(UnsupportedKernelError, match="quadrature"):
        fleet.update(0, {"meter-0": (t, torch.sin(t)), "meter-1": (t, torch.cos(t))})
