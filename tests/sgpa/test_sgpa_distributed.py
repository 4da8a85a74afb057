"""Data-parallel training: one DDP step with 2 gloo processes equals one
single-process step on the same global batch; the global KL is counted once."""

import os
import pathlib
import subprocess
import sys

import pytest
import torch

from experiments.sgpa import distributed

HERE = pathlib.Path(__file__).resolve().parent
#: the runners and workers import the experiments/ tree of the repository root
PYTHONPATH = os.pathsep.join(filter(None, [str(HERE.parents[1]), os.environ.get("PYTHONPATH")]))
sys.path.insert(0, str(HERE))
import ddp_step_worker  # noqa: E402
from vader_fixtures import fake_vader_corpora  # noqa: E402


def _torchrun(args, tmp_path, timeout=300, env=None):  # ~15 s unloaded; the shared machine can be 10x slower
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": PYTHONPATH, **(env or {})}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]
    result = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.parametrize("beta", [1.0, "auto"])
def test_two_process_step_equals_single_process_step(tmp_path, beta):
    """Also with ``beta="auto"``: both ranks choose the β of the global batch (not of their shard)."""
    _torchrun([str(HERE / "ddp_step_worker.py"), str(tmp_path / "ddp.pt"), str(beta)], tmp_path)
    saved = torch.load(tmp_path / "ddp.pt")
    assert saved["world_size"] == 2
    model, elbo = ddp_step_worker.run_step(beta)
    assert saved["kl_weight"] == pytest.approx(elbo.kl_weight, rel=1e-12)
    assert (elbo.kl_weight < 1.0) == (beta == "auto")
    single = ddp_step_worker.snapshot(model)
    assert single.keys() == saved["state"].keys()
    for name, (parameter, gradient) in single.items():
        ddp_parameter, ddp_gradient = saved["state"][name]
        torch.testing.assert_close(ddp_gradient, gradient, rtol=1e-9, atol=1e-12, msg=name)
        torch.testing.assert_close(ddp_parameter, parameter, rtol=0, atol=1e-6, msg=name)
    # the global KL's gradient is a visible part of the global variational parameters' gradient,
    # so counting it once per rank would have changed them
    global_kl_gradient = torch.autograd.grad(model.global_kl() / elbo.num_data, model.layers[0].attention.global_chol_lower)[0]
    assert global_kl_gradient.abs().max() > 1e-3 * single["layers.0.attention.global_chol_lower"][1].abs().max()


def test_shard_and_rank_seed():
    index = torch.arange(7)
    parts = [distributed.shard(index, rank, 3) for rank in range(3)]
    assert torch.equal(torch.cat(parts), index) and [len(p) for p in parts] == [3, 2, 2]
    with pytest.raises(ValueError, match="world_size"):
        distributed.shard(torch.arange(1), 0, 2)
    seeds = {distributed.rank_seed(seed, rank) for seed in range(3) for rank in range(4)}
    assert len(seeds) == 12 and distributed.rank_seed(5, 1) == distributed.rank_seed(5, 1)
    assert distributed.world() == (0, 1) and distributed.is_main()
    assert distributed.broadcast_from_main(lambda: 2.5) == 2.5


def test_calibration_runner_under_torchrun_writes_once_with_world_size(tmp_path):
    import csv

    out = tmp_path / "out"
    _torchrun(
        [
            "-m",
            "experiments.sgpa.calibration",
            "--quick",
            "--dataset",
            "digits",
            "--methods",
            "sgpa",
            "--train-size",
            "64",
            "--val-size",
            "32",
            "--test-size",
            "32",
            "--ood-size",
            "32",
            "--batch-size",
            "16",
            "--no-progress",
            "--threads",
            "1",
            "--out",
            str(out),
        ],
        tmp_path,
    )
    with open(out / "results.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [(row["method"], row["world_size"]) for row in rows] == [("sgpa", "2")]
    assert 0 <= float(rows[0]["accuracy"]) <= 1 and float(rows[0]["kl_final"]) > 0


def test_language_model_runner_under_torchrun_trains_and_rank_0_writes(tmp_path):
    """The language-model runner end to end under torchrun (2 gloo processes, tiny corpora): every
    method trains data-parallel (ragged padded sequences, the SGPA decoder's ELBO), one CSV with
    ``world_size`` 2 is written and the table is printed once (rank 0 only)."""
    import csv

    from experiments.sgpa import language_model as lm

    archive = tmp_path / "vader.tar.gz"
    fake_vader_corpora(archive)
    out = tmp_path / "out"
    result = _torchrun(
        [
            "-m",
            "experiments.sgpa.language_model",
            "--quick",
            "--methods",
            "mle-sdp,mcd,sgpa",
            "--seeds",
            "1",
            "--train-size",
            "60",
            "--test-size",
            "30",
            "--shift-size",
            "20",
            "--batch-size",
            "16",
            "--no-progress",
            "--threads",
            "1",
            "--out",
            str(out),
        ],
        tmp_path,
        env={"PROBSEQ_VADER_ARCHIVE": str(archive)},
    )
    with open(out / "results.csv") as handle:
        reader = csv.DictReader(handle)
        assert tuple(reader.fieldnames) == lm.CSV_COLUMNS
        rows = list(reader)
    assert [(row["method"], row["seed"], row["world_size"]) for row in rows] == [
        (method, "0", "2") for method in ("mle-sdp", "mcd", "sgpa")
    ]
    for row in rows:
        assert float(row["token_nll"]) > 0 and 0 <= float(row["accuracy"]) <= 1
    assert list(out.iterdir()) == [out / "results.csv"]
    for method in ("mle-sdp", "mcd", "sgpa"):
        assert result.stdout.count(f"| vader_lm | {method} | 1 |") == 1, result.stdout
    assert result.stderr.count("rows written to") == 1, result.stderr[-3000:]


def test_two_process_trainer_run_equals_one_process_on_the_concatenated_batches(tmp_path):
    """SGPATrainer under torchrun (2 gloo processes of 4 sequences per step, ``beta="auto"``, annealing)
    against the package's own loop on batches of 8 in one process (attention noise off: each rank draws its own)."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    import trainer_worker as worker

    import gpytorch_sgpa

    _torchrun([str(HERE / "trainer_worker.py"), str(tmp_path / "ddp.pt"), str(tmp_path / "out")], tmp_path)
    saved = torch.load(tmp_path / "ddp.pt")
    assert saved["world_size"] == 2
    with gpytorch_sgpa.posterior_mean():
        reference, reference_elbo = worker.package_loop(worker.model(), 8, 3, 0.5, "auto", 2)
    assert saved["beta"] == pytest.approx(reference_elbo.beta, rel=1e-6)
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(saved["state"][name], value, rtol=1e-6, atol=1e-7, msg=name)
