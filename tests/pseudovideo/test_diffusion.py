"""Video diffusion: the 1-frame model is DDPM's epsilon loss exactly, the Autoreg task windows follow
the thesis (C = 2 for 4 frames), conditioning is learned, and the runner's --quick CSV contract."""

import csv

import pytest
import torch

from experiments.pseudovideo.diffusion import COLUMNS, main
from pseudovideo.models.diffusion import ABSENT, LATENT, OBSERVED, AutoregressiveVideoDiffusion


def tiny(num_frames, context, image_size=4):
    torch.manual_seed(0)
    return AutoregressiveVideoDiffusion(num_frames, context, image_size=image_size, block_out_channels=(8, 16), num_train_timesteps=100)


def test_one_frame_loss_is_the_ddpm_epsilon_loss():
    model = tiny(1, 0)
    images = torch.rand(6, 1, 1, 4, 4) * 2 - 1
    loss = model.training_loss(images, torch.Generator().manual_seed(5))
    generator = torch.Generator().manual_seed(5)  # same draws in the same order: task, noise, timestep
    torch.randint(0, 1, (6,), generator=generator)
    noise = torch.randn(6, 1, 1, 4, 4, generator=generator)
    timesteps = torch.randint(0, 100, (6,), generator=generator)
    abar = model.scheduler.alphas_cumprod[timesteps].view(6, 1, 1, 1)
    noisy = abar.sqrt() * images[:, 0] + (1 - abar).sqrt() * noise[:, 0]
    inputs = torch.cat([noisy, torch.zeros(6, 1, 4, 4)], dim=1)  # indicator channel: latent (0)
    expected = (model.unet(inputs, timesteps).sample - noise[:, 0]).pow(2).mean()
    torch.testing.assert_close(loss, expected)


def test_autoreg_task_windows_for_four_frames_and_context_two():
    model = tiny(4, 2)
    frame, state = model.task_windows(torch.arange(model.num_tasks))
    # task 0: z_1, z_2 generated jointly; tasks 1, 2: z_3 | z_1, z_2 and z_4 | z_2, z_3
    assert frame.tolist() == [[0, 1, -1], [0, 1, 2], [1, 2, 3]]
    assert state.tolist() == [[LATENT, LATENT, ABSENT], [OBSERVED, OBSERVED, LATENT], [OBSERVED, OBSERVED, LATENT]]


def test_conditioning_is_learned():
    # videos of constant images, all frames equal to +1 or all to -1: z_t given z_{t-1} is deterministic
    model = tiny(3, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0)
    for _ in range(150):
        signs = torch.randint(0, 2, (32, 1, 1, 1, 1), generator=generator) * 2.0 - 1
        loss = model.training_loss(signs.expand(32, 3, 1, 4, 4), generator)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    context = torch.cat([torch.ones(16, 1, 1, 4, 4), -torch.ones(16, 1, 1, 4, 4)])
    predicted = model.eval().sample_next_frame(context, 20, torch.Generator().manual_seed(1))
    # a tiny, briefly trained model only leans towards the answer (+1 / -1): the group means differ by
    # 0.34 here; were the context ignored the difference would be 0 with s.d. ~0.1 (16 samples a group)
    assert predicted[:16].mean() - predicted[16:].mean() > 0.25


def test_sampling_shapes_and_determinism():
    model = tiny(4, 2).eval()
    first = model.sample(3, 2, torch.Generator().manual_seed(0), batch_size=2)
    again = model.sample(3, 2, torch.Generator().manual_seed(0), batch_size=2)
    other = model.sample(3, 2, torch.Generator().manual_seed(1), batch_size=2)
    assert first.shape == (3, 4, 1, 4, 4)
    assert torch.equal(first, again) and not torch.allclose(first, other)


@pytest.mark.parametrize(
    "args, match",
    [
        ((0, 0), "num_frames"),
        ((1, 1), "context"),
        ((4, 4), "context"),
        ((4, 0), "context"),
    ],
)
def test_bad_construction_is_named(args, match):
    with pytest.raises(ValueError, match=match):
        AutoregressiveVideoDiffusion(*args, image_size=4, block_out_channels=(8, 16))


def test_bad_calls_are_named():
    model = tiny(4, 2)
    with pytest.raises(ValueError, match="videos"):
        model.training_loss(torch.zeros(2, 3, 1, 4, 4))
    with pytest.raises(ValueError, match="context_frames"):
        model.sample_next_frame(torch.zeros(2, 1, 1, 4, 4))
    with pytest.raises(ValueError, match="image_size"):
        AutoregressiveVideoDiffusion(2, 1, image_size=6, block_out_channels=(8, 16, 16))


@pytest.mark.filterwarnings("ignore::pseudovideo.metrics.MetricReliabilityWarning")  # quick runs score 16 images
def test_quick_run_writes_the_csv_contract(tmp_path):
    rows = main(
        [
            "--dataset",
            "digits",
            "--downsample",
            "1",
            "--frames",
            "1,2",
            "--augmentation",
            "markov_high",
            "--seeds",
            "1",
            "--quick",
            "--quiet",
            "--out",
            str(tmp_path),
            "--classifier-cache",
            str(tmp_path / "cache"),
        ]
    )
    with open(tmp_path / "results.csv") as handle:
        reader = csv.DictReader(handle)
        assert reader.fieldnames == COLUMNS
        written = list(reader)
    assert [(r["model"], r["frames"], r["augmentation"]) for r in written] == [
        ("image_ddpm", "1", "none"),
        ("video_diffusion", "2", "markov_high"),
    ]
    assert written[0]["psnr"] == "" and float(written[1]["psnr"]) > 0
    assert float(written[0]["out_of_range"]) == 0.0  # the image model's sampler clips to [-1, 1]
    assert 0.0 <= float(written[1]["out_of_range"]) <= 1.0
    assert all(float(r["fid"]) > 0 and 1 <= float(r["is"]) <= 10 for r in written) and len(rows) == 2
    assert (tmp_path / "pseudo_videos_2frames.png").is_file() and (tmp_path / "samples_1frame_none_seed0.png").is_file()


@pytest.mark.filterwarnings("ignore::pseudovideo.metrics.MetricReliabilityWarning")  # quick runs score 16 images
def test_first_seed_reproduces_that_seed_of_a_longer_run(tmp_path):
    """Splitting seeds across processes (``--first-seed``) must give the rows of one run over all seeds:
    a model seeded by its position in the loop instead of its seed would fail this."""
    common = [
        "--dataset",
        "digits",
        "--downsample",
        "1",
        "--frames",
        "2",
        "--augmentation",
        "markov_first",
        "--quick",
        "--quiet",
        "--classifier-cache",
        str(tmp_path / "cache"),
    ]
    both = main(common + ["--seeds", "2", "--out", str(tmp_path / "both")])
    second = main(common + ["--seeds", "1", "--first-seed", "1", "--out", str(tmp_path / "second")])
    assert [r["seed"] for r in both] == [0, 1] and [r["seed"] for r in second] == [1]
    assert {k: both[1][k] for k in ("fid", "is", "psnr")} == {k: second[0][k] for k in ("fid", "is", "psnr")}
    assert both[0]["fid"] != both[1]["fid"]


@pytest.mark.filterwarnings("ignore::pseudovideo.metrics.MetricReliabilityWarning")  # quick runs score 16 images
def test_train_timesteps_reach_the_saved_model_and_the_csv(tmp_path):
    """Table 5.4's 1-frame model trains with 4,000 diffusion timesteps: the option must reach the model's scheduler."""
    args = ["--dataset", "digits", "--downsample", "1", "--frames", "1", "--seeds", "1", "--quick", "--quiet"]
    args += ["--train-timesteps", "4000", "--save-models", "--out", str(tmp_path), "--classifier-cache", str(tmp_path / "cache")]
    (row,) = main(args)
    reloaded = AutoregressiveVideoDiffusion.from_pretrained(tmp_path / "model_1frame_none_seed0")
    assert reloaded.scheduler.config.num_train_timesteps == 4000 and row["train_timesteps"] == 4000
