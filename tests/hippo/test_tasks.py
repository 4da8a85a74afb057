"""One task of an online sparse GP as tensors (gpytorch_hippo.tasks): pandas datetimes and labels, missing
targets, per-point noise, ragged batches of streams, and the errors that name the fix.

References: the same task converted by hand (hours since the origin, rows kept by position, padding written out).
"""

import numpy as np
import pandas as pd
import pytest
import torch

from gpytorch_hippo import InducingPoints, TimeAxis
from gpytorch_hippo.tasks import prepare_task

DT = torch.float64
POINTS = InducingPoints(torch.linspace(0, 48, 5, dtype=DT).unsqueeze(-1))


def test_pandas_times_with_gaps_nan_and_shuffled_labels_equal_the_task_converted_by_hand():
    hours = pd.DatetimeIndex(["2024-03-01 00:00", "2024-03-01 01:00", "2024-03-01 05:00", "2024-03-02 02:30"])
    readings = pd.Series([1.0, np.nan, 3.0, 4.0], index=hours)
    shuffled = readings.iloc[[2, 0, 3, 1]]  # pandas aligns on labels, so must the task
    noise = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=DT)
    task = prepare_task(
        readings.index, shuffled, POINTS, DT, time_axis=TimeAxis("h", origin=pd.Timestamp("2024-03-01")), noise=noise, missing="drop"
    )
    # by hand: hours since the origin of the rows whose reading is not NaN, and their noise
    torch.testing.assert_close(task.x, torch.tensor([[0.0], [5.0], [26.5]], dtype=DT), rtol=0, atol=0)
    torch.testing.assert_close(task.y, torch.tensor([1.0, 3.0, 4.0], dtype=DT), rtol=0, atol=0)
    torch.testing.assert_close(task.noise, torch.tensor([0.1, 0.3, 0.4], dtype=DT), rtol=0, atol=0)
    assert task.mask is None
    with pytest.raises(ValueError, match="missing='drop'"):
        prepare_task(readings.index, shuffled, POINTS, DT, time_axis=TimeAxis("h", origin=pd.Timestamp("2024-03-01")))


def test_numbers_of_any_kind_become_the_models_dtype_and_a_task_with_nothing_is_none():
    task = prepare_task(np.array([1, 2, 3]), [0.5, 0.25, 0.125], POINTS, torch.float32, noise=torch.tensor(0.01))
    assert task.x.dtype == task.y.dtype == task.noise.dtype == torch.float32
    assert task.x.shape == (3, 1) and task.noise.shape == (3,)
    torch.testing.assert_close(task.x.squeeze(-1), torch.tensor([1.0, 2.0, 3.0]))
    all_missing = pd.Series([np.nan, np.nan], index=[0.0, 1.0])
    assert prepare_task(all_missing.index, all_missing, POINTS, DT, missing="drop") is None


def test_a_ragged_batch_is_padded_with_its_own_streams_inputs_and_zero_targets():
    x = torch.tensor([[1.0, 2.0, 9.0], [4.0, np.nan, 9.0], [7.0, 8.0, 9.0]], dtype=DT)
    y = torch.tensor([[1.0, 2.0, np.nan], [3.0, np.nan, np.nan], [5.0, 6.0, 7.0]], dtype=DT)
    mask = torch.tensor([[True, True, False], [True, False, False], [True, True, True]])
    task = prepare_task(x, y, POINTS, DT, streams=3, mask=mask)
    # by hand: each padded entry takes its stream's first input and target 0
    expected_x = torch.tensor([[1.0, 2.0, 1.0], [4.0, 4.0, 4.0], [7.0, 8.0, 9.0]], dtype=DT).unsqueeze(-1)
    expected_y = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0], [5.0, 6.0, 7.0]], dtype=DT)
    torch.testing.assert_close(task.x, expected_x, rtol=0, atol=0)
    torch.testing.assert_close(task.y, expected_y, rtol=0, atol=0)
    assert torch.equal(task.mask, mask)
    y[2, 1] = np.nan  # at an observed entry: named, not spread
    with pytest.raises(ValueError, match=r"stream\(s\) \[2\]"):
        prepare_task(x, y, POINTS, DT, streams=3, mask=mask)
    assert prepare_task(x, y, POINTS, DT, streams=3, mask=torch.zeros(3, 3, dtype=torch.bool)) is None


def test_bad_tasks_raise_errors_that_name_the_fix():
    times = pd.date_range("2024-01-01", periods=3, freq="h")
    with pytest.raises(TypeError, match=r"time_axis=TimeAxis\('h'\)"):
        prepare_task(times, [1.0, 2.0, 3.0], POINTS, DT)
    with pytest.raises(ValueError, match=r"train_y must have shape \(3,\)"):
        prepare_task(torch.zeros(3, dtype=DT), torch.zeros(2, dtype=DT), POINTS, DT)
    with pytest.raises(ValueError, match="positive variances"):
        prepare_task(torch.zeros(3, dtype=DT), torch.zeros(3, dtype=DT), POINTS, DT, noise=torch.tensor(0.0))
    with pytest.raises(ValueError, match="'raise' or 'drop'"):
        prepare_task(torch.zeros(3, dtype=DT), torch.zeros(3, dtype=DT), POINTS, DT, missing="impute")
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        prepare_task(torch.zeros(2, 3, dtype=DT), torch.zeros(2, 3, dtype=DT), POINTS, DT, streams=2, mask=torch.ones(2, 3))
