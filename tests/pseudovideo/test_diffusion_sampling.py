"""Sampling matches training: generated context frames have the marginals of the training pseudo
frames (no hidden clipping), and ``sample()`` runs in the model's dtype (float64, bfloat16, autocast)."""

import math

import pytest
import torch

from pseudovideo import make_pseudo_video
from pseudovideo.models.diffusion import CLIP_SAMPLE, AutoregressiveVideoDiffusion, default_clip_sample

# Training pseudo videos: constant images x = -0.9 and one first-order Markov step with beta = 0.5, so
# frame 1 is N(-0.9 sqrt(0.5), 0.5) per pixel: mean -0.636, s.d. 0.707, 31.2 % of its pixels outside [-1, 1].
BETA, PIXEL = 0.5, -0.9
FRAME_1_MEAN, FRAME_1_STD = PIXEL * math.sqrt(1 - BETA), math.sqrt(BETA)
FRAME_1_OUTSIDE = 0.5 * math.erfc((1 + FRAME_1_MEAN) / FRAME_1_STD / math.sqrt(2)) + 0.5 * math.erfc(
    (1 - FRAME_1_MEAN) / FRAME_1_STD / math.sqrt(2)
)


def training_videos(batch, generator):
    images = torch.full((batch, 1, 4, 4), PIXEL)
    return make_pseudo_video(images, 2, "markov_first", generator=generator, beta_start=BETA, beta_end=BETA)


@pytest.fixture(scope="module")
def trained():
    """A 2-frame model (context 1) trained for 300 steps on the videos above (~7 s)."""
    torch.manual_seed(0)
    model = AutoregressiveVideoDiffusion(
        2, 1, image_size=4, block_out_channels=(8, 16), num_train_timesteps=100, prediction_type="v_prediction"
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, 300)
    generator = torch.Generator().manual_seed(0)
    for _ in range(300):
        loss = model.training_loss(training_videos(64, generator), generator)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    return model.eval()


def test_the_reference_marginals_are_those_of_the_training_frames():
    frame = training_videos(20_000, torch.Generator().manual_seed(3))[:, 0]
    assert abs(frame.mean() - FRAME_1_MEAN) < 0.01 and abs(frame.std() - FRAME_1_STD) < 0.01
    assert abs((frame.abs() > 1).double().mean() - FRAME_1_OUTSIDE) < 0.01


def test_generated_context_frames_have_the_training_marginals(trained):
    # 512 videos x 16 pixels: the sampling error of the mean is ~0.03 (pixels of one video are correlated
    # through the model), of the s.d. and of the share outside [-1, 1] ~0.01-0.02
    frame = trained.sample(512, 50, torch.Generator().manual_seed(1))[:, 0]
    assert abs(frame.mean() - FRAME_1_MEAN) < 0.1
    assert abs(frame.std() / FRAME_1_STD - 1) < 0.12
    assert abs((frame.abs() > 1).double().mean() - FRAME_1_OUTSIDE) < 0.06


def test_clipping_changes_the_marginals_and_is_opt_in(trained):
    """The sampler diffusers' schedulers give by default (``clip_sample=True``) puts every generated
    pixel in [-1, 1], where 31 % of the training frame's pixels are not: what the model used to do."""
    clipped = AutoregressiveVideoDiffusion(
        2, 1, image_size=4, block_out_channels=(8, 16), num_train_timesteps=100, prediction_type="v_prediction", clip_sample=True
    ).eval()
    clipped.load_state_dict(trained.state_dict())
    frame = clipped.sample(512, 50, torch.Generator().manual_seed(1))[:, 0]
    assert frame.abs().max() <= 1 and FRAME_1_OUTSIDE > 0.3
    assert trained.scheduler.config.clip_sample is False and clipped.scheduler.config.clip_sample is True


def test_clipping_defaults_per_builder():
    assert AutoregressiveVideoDiffusion(2, 1, image_size=4, block_out_channels=(8, 16)).scheduler.config.clip_sample is False
    assert [default_clip_sample(m) for m in ("markov_first", "markov_high", "heat")] == [False] * 3
    assert default_clip_sample("blur") and default_clip_sample("none") and set(CLIP_SAMPLE) >= {"none", "blur"}
    # blur frames of [-1, 1] images stay in [-1, 1] (clipping cannot change their distribution); Markov ones do not
    images = torch.rand(64, 1, 8, 8, generator=torch.Generator().manual_seed(0)) * 2 - 1
    assert make_pseudo_video(images, 8, "blur").abs().max() <= 1
    assert make_pseudo_video(images, 8, "markov_first", generator=torch.Generator().manual_seed(0)).abs().max() > 1
    with pytest.raises(ValueError, match="augmentation"):
        default_clip_sample("noise")
    with pytest.raises(TypeError, match="clip_sample"):
        AutoregressiveVideoDiffusion(2, 1, image_size=4, block_out_channels=(8, 16), clip_sample="yes")
    with pytest.raises(ValueError, match="prediction_type"):
        AutoregressiveVideoDiffusion(2, 1, image_size=4, block_out_channels=(8, 16), prediction_type="x0")


def tiny(dtype=torch.float32):
    torch.manual_seed(0)
    return AutoregressiveVideoDiffusion(3, 1, image_size=4, block_out_channels=(8, 16), num_train_timesteps=50).to(dtype).eval()


def test_sample_runs_in_float64_and_matches_float32():
    reference = tiny().sample(3, 4, torch.Generator().manual_seed(2))
    double = tiny(torch.float64).sample(3, 4, torch.Generator().manual_seed(2))
    assert double.dtype == torch.float64 and reference.dtype == torch.float32
    torch.testing.assert_close(double.float(), reference, rtol=1e-3, atol=1e-4)


def test_sample_runs_in_bfloat16_and_under_autocast():
    reference = tiny().sample(3, 4, torch.Generator().manual_seed(2))
    half = tiny(torch.bfloat16).sample(3, 4, torch.Generator().manual_seed(2))
    assert half.dtype == torch.bfloat16 and torch.isfinite(half.float()).all()
    assert (half.float() - reference).abs().mean() < 0.1 * reference.abs().mean()  # bfloat16: ~3 digits
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = tiny().sample(3, 4, torch.Generator().manual_seed(2))
    assert mixed.dtype == torch.float32 and (mixed - reference).abs().mean() < 0.1 * reference.abs().mean()
    context = reference[:, :1].double()
    assert tiny(torch.float64).sample_next_frame(context, 4, torch.Generator().manual_seed(0)).dtype == torch.float64


def test_predict_next_frame_is_a_deprecated_name_of_sample_next_frame():
    model, context = tiny(), torch.zeros(2, 1, 1, 4, 4)
    with pytest.warns(DeprecationWarning, match="sample_next_frame"):
        old = model.predict_next_frame(context, 3, torch.Generator().manual_seed(0))
    assert torch.equal(old, model.sample_next_frame(context, 3, torch.Generator().manual_seed(0)))
