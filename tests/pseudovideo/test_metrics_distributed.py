"""FID across processes: two ``torchrun`` processes, each with its own share of the images, get the FID of
their union, equal to one process on all of them."""

import os
import pathlib
import subprocess
import sys

import pytest
import torch

pytest.importorskip("torchmetrics")
HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import fid_worker  # noqa: E402

from pseudovideo.metrics import frechet_distance  # noqa: E402


@pytest.mark.distributed
def test_two_processes_with_a_share_each_equal_one_process_on_all(tmp_path):
    path = os.pathsep.join([str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")])
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(HERE / "fid_worker.py"),
        str(tmp_path / "fid.pt"),
    ]
    result = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    saved = torch.load(tmp_path / "fid.pt")
    real, fake = fid_worker.sets()
    whole = frechet_distance(real, fake, fid_worker.feature())
    half = frechet_distance(real[0::2], fake[0::2], fid_worker.feature())
    assert saved["world_size"] == 2
    assert saved["fid"] == pytest.approx(whole, rel=1e-6)
    assert abs(half - whole) > 1e-3 * whole  # a process that kept only its own share would differ


def test_distributed_needs_a_process_group():
    real, fake = fid_worker.sets()
    with pytest.raises(RuntimeError, match="process group"):
        frechet_distance(real, fake, fid_worker.feature(), distributed=True)
