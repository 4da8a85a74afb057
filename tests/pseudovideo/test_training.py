"""Training through accelerate: one step of 2 CPU processes equals a plain single-process SGD step on
the two processes' concatenated batches and draws, and a run resumed from a checkpoint continues
exactly as the uninterrupted run."""

import os
import pathlib
import subprocess
import sys

import pytest
import torch

pytest.importorskip("accelerate")

from pseudovideo.models.diffusion import TrainingDraws  # noqa: E402
from pseudovideo.training import rank_seed, train  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
#: the runners import the experiments/ tree of the repository root
PYTHONPATH = os.pathsep.join(filter(None, [str(HERE.parents[1]), os.environ.get("PYTHONPATH")]))
sys.path.insert(0, str(HERE))
import accelerate_step_worker as worker  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_accelerator_state():
    """accelerate keeps one process-wide state (mixed precision, ...): each test starts from none, as a run does."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)
    yield
    AcceleratorState._reset_state(True)


@pytest.mark.distributed
def test_two_process_step_equals_single_process_step_on_the_concatenated_batch(tmp_path):
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(HERE / "accelerate_step_worker.py"),
        str(tmp_path / "step.pt"),
    ]
    result = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    saved = torch.load(tmp_path / "step.pt")
    assert saved["world_size"] == 2
    # the reference: each rank's batch and draws, in the order train() makes them, concatenated
    model = worker.tiny_model()
    videos, draws = [], []
    for rank in range(2):
        generator = torch.Generator().manual_seed(rank_seed(0, rank))
        batch = worker.next_batch(generator)
        videos.append(batch)
        draws.append(model.training_draws(batch, generator))
    joint = TrainingDraws(*(torch.cat(parts) for parts in zip(*draws)))
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    loss = model.training_loss(torch.cat(videos), draws=joint)
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= worker.LR * p.grad
    moved = 0
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(saved["state"][name], parameter.detach(), rtol=0, atol=1e-6, msg=name)
        moved += int(not torch.equal(parameter, before[name]))
    assert moved > 10  # the step changed the weights: the comparison is not between two untouched models


@pytest.mark.distributed
def test_two_process_step_of_a_loss_method_equals_single_process_step(tmp_path):
    """The token priors' loss is a method: it still runs inside the data-parallel wrapper (gradients averaged)."""
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(HERE / "accelerate_step_worker.py"),
        str(tmp_path / "step.pt"),
        "prior",
    ]
    result = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    saved = torch.load(tmp_path / "step.pt")
    prior = worker.tiny_prior()
    tokens = torch.cat([worker.next_tokens(torch.Generator().manual_seed(rank_seed(0, rank))) for rank in range(2)])
    prior.loss(tokens).backward()
    with torch.no_grad():
        for p in prior.parameters():
            p -= worker.LR * p.grad
    for name, parameter in prior.named_parameters():
        torch.testing.assert_close(saved["state"][name], parameter.detach(), rtol=0, atol=1e-6, msg=name)
    assert saved["world_size"] == 2


def test_resumed_run_continues_exactly(tmp_path):
    common = dict(
        optimizer_factory=lambda p: torch.optim.Adam(p, lr=1e-2), ema_decay=0.9, seed=3, cpu=True, progress=False, checkpoint_every=2
    )
    whole, whole_ema, _, _ = train(worker.tiny_model(), worker.next_batch, 4, checkpoint_dir=tmp_path / "a", **common)
    train(worker.tiny_model(), worker.next_batch, 2, checkpoint_dir=tmp_path / "b", **common)  # stops at step 2
    resumed, resumed_ema, _, _ = train(worker.tiny_model(), worker.next_batch, 4, checkpoint_dir=tmp_path / "b", resume=True, **common)
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
    for a, b in zip(whole_ema.shadow_params, resumed_ema.shadow_params):
        assert torch.equal(a, b)
    # a fresh run without resume differs (it starts again from step 0)
    fresh, _, _, _ = train(worker.tiny_model(), worker.next_batch, 2, **{**common, "checkpoint_every": 0})
    assert not all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), whole.state_dict().values()))


def test_accumulation_and_mixed_precision_run_and_bad_arguments_are_named(tmp_path):
    model, _, accelerator, _ = train(
        worker.tiny_model(), worker.next_batch, 2, accumulation=2, mixed_precision="bf16", cpu=True, progress=False
    )
    assert accelerator.gradient_accumulation_steps == 2 and accelerator.mixed_precision == "bf16"
    assert all(torch.isfinite(p).all() for p in model.parameters())
    with pytest.raises(ValueError, match="mixed_precision"):
        train(worker.tiny_model(), worker.next_batch, 1, mixed_precision="fp8", cpu=True)
    with pytest.raises(ValueError, match="checkpoint_dir"):
        train(worker.tiny_model(), worker.next_batch, 1, resume=True, cpu=True)


TORCHRUN = ["torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
ACCELERATE = ["accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]  # the guide's accelerate command


@pytest.mark.distributed
@pytest.mark.parametrize(
    "runner, options, csv_name, rows, launcher",
    [
        ("hvae", ["--encoders", "heat"], "hvae_results.csv", 1, ACCELERATE),
        ("tokens", ["--frames", "1", "--model", "tokenizer,ar"], "results.csv", 2, TORCHRUN),
    ],
)
def test_hvae_and_tokens_runners_under_two_processes_write_once(tmp_path, runner, options, csv_name, rows, launcher):
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": PYTHONPATH}
    command = [
        sys.executable,
        "-m",
        *launcher,
        "-m",
        f"experiments.pseudovideo.{runner}",
        "--dataset",
        "digits",
        "--downsample",
        "1",
        "--quick",
        "--quiet",
        *options,
        "--out",
        str(tmp_path),
        "--classifier-cache",
        str(tmp_path / "cache"),
    ]
    result = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len((tmp_path / csv_name).read_text().splitlines()) == 1 + rows
    assert result.stdout.count("processes: 2 (data-parallel") == 1  # said once, by the main process


@pytest.mark.distributed
def test_diffusion_runner_under_two_processes_writes_once(tmp_path):
    """torchrun with 2 CPU processes: they train data-parallel and only the main process evaluates and writes."""
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": PYTHONPATH}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "experiments.pseudovideo.diffusion",
        "--dataset",
        "digits",
        "--downsample",
        "1",
        "--frames",
        "1,2",
        "--augmentation",
        "markov_high",
        "--quick",
        "--quiet",
        "--ema-decay",
        "0.5",
        "--accumulation",
        "2",
        "--out",
        str(tmp_path),
        "--classifier-cache",
        str(tmp_path / "cache"),
    ]
    result = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = (tmp_path / "results.csv").read_text().splitlines()
    assert len(lines) == 3 and lines[1].startswith("digits,image_ddpm") and lines[2].startswith("digits,video_diffusion")
    assert result.stdout.count("video_diffusion") == 1
    assert result.stdout.count("processes: 2 (data-parallel") == 1
