"""``experiments.captured_variance``: the per-task captured fraction of a fresh LegS memory at the
stream's end is the one OHSGPR actually holds after streaming every task through the runner."""

import pytest
import torch

from experiments.hippo import captured_variance, online


def test_fresh_memory_at_the_end_equals_the_streamed_ohsgpr_memory():
    # Reference: the runner's OHSGPR after task 10, its Lyapunov-carried Kuu advanced task by task
    # (a different code path from the fresh spectral evaluation at t_end), scored on the same test points.
    rows, model, data = online.run_method("irradiance", "ohsgpr", 20, seed=1)
    tasks = online.split_tasks(data, 10, 1)
    streamed = [float(model.inducing_variables.captured_variance(model.covar_module, task.test_x)) for task in tasks]
    ratio, fresh = captured_variance.captured_by_task("irradiance", [10, 20], seed=1)
    torch.testing.assert_close(torch.tensor(fresh[20]), torch.tensor(streamed), rtol=1e-6, atol=1e-8)
    lengthscale = float(model.covar_module.base_kernel.lengthscale)
    assert ratio == pytest.approx(float(data.x.max() - data.x.min()) / lengthscale)
    assert all(a < b + 1e-12 for a, b in zip(fresh[10], fresh[20]))  # more variables keep more, task by task


def test_cli_prints_a_row_per_seed_and_size_and_names_bad_arguments(tmp_path, capsys):
    out = tmp_path / "captured.csv"
    captured_variance.main(["--dataset", "irradiance", "--num-inducing", "8,16", "--csv", str(out)])
    printed = capsys.readouterr().out
    assert printed.count("\n| 0 |") == 2 and out.read_text().count("\n") == 1 + 2 * 10
    with pytest.raises(SystemExit):
        captured_variance.main(["--dataset", "irradiance", "--num-inducing", "8,x"])
    assert "--num-inducing" in capsys.readouterr().err
    with pytest.raises(ValueError, match="dataset"):
        captured_variance.captured_by_task("diabetes", [8], seed=0)  # multidimensional inputs: not a series
