"""diffusers citizenship: save/load round trips (weights, config, training schedule; identical samples),
the pseudo-video pipeline against diffusers' own DDPMPipeline/DDIMPipeline, and the image model's UNet
refusing those pipelines by name."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from diffusers import DDIMPipeline, DDIMScheduler, DDPMPipeline, DDPMScheduler, EulerDiscreteScheduler
from diffusers.models.unets.unet_2d import UNet2DOutput
from PIL import Image

from pseudovideo.models.diffusion import AutoregressiveVideoDiffusion, IndicatorChannelsError
from pseudovideo.pipelines import SCHEDULERS, PseudoVideoPipeline

# diffusers' EulerDiscreteScheduler hands NumPy 2 a tensor whose __array__ has no copy keyword (diffusers' own
# deprecation, not this package's)
pytestmark = [
    pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:__array_wrap__ must accept context:DeprecationWarning"),  # DEIS, KDPM2 (same)
]


def tiny(num_frames=3, context=1, **options):
    torch.manual_seed(0)
    return AutoregressiveVideoDiffusion(
        num_frames, context, image_size=4, block_out_channels=(8, 16), num_train_timesteps=50, **options
    ).eval()


def arguments(config):
    """The constructor arguments a config records (diffusers adds private ``_...`` keys; JSON makes tuples lists)."""
    return {key: list(value) if isinstance(value, tuple) else value for key, value in config.items() if not key.startswith("_")}


def quiet(pipeline):
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


@pytest.mark.parametrize("options", [{}, {"clip_sample": True, "prediction_type": "v_prediction", "beta_schedule": "linear"}])
def test_save_and_load_round_trip_weights_config_schedule_and_samples(tmp_path, options):
    model = tiny(**options)
    model.save_pretrained(tmp_path)
    loaded = AutoregressiveVideoDiffusion.from_pretrained(tmp_path).eval()
    assert arguments(loaded.config) == arguments(model.config) and arguments(model.config)["num_frames"] == 3
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))
    assert dict(loaded.scheduler.config) == dict(model.scheduler.config)
    torch.testing.assert_close(loaded.scheduler.alphas_cumprod, model.scheduler.alphas_cumprod, rtol=0, atol=0)
    first = model.sample(3, 4, torch.Generator().manual_seed(1))
    assert torch.equal(first, loaded.sample(3, 4, torch.Generator().manual_seed(1)))


def test_pipeline_round_trips_and_reproduces_under_a_generator(tmp_path):
    pipeline = quiet(PseudoVideoPipeline(tiny(), DDPMScheduler.from_config(tiny().scheduler.config)))
    videos = pipeline(batch_size=3, num_inference_steps=6, generator=torch.Generator().manual_seed(2), output_type="model").videos
    again = pipeline(batch_size=3, num_inference_steps=6, generator=torch.Generator().manual_seed(2), output_type="model").videos
    assert videos.shape == (3, 3, 1, 4, 4) and torch.equal(videos, again)
    pipeline.save_pretrained(tmp_path)
    loaded = quiet(PseudoVideoPipeline.from_pretrained(tmp_path))
    assert isinstance(loaded.model, AutoregressiveVideoDiffusion) and isinstance(loaded.scheduler, DDPMScheduler)
    reloaded = loaded(batch_size=3, num_inference_steps=6, generator=torch.Generator().manual_seed(2), output_type="model").videos
    assert torch.equal(videos, reloaded)


def test_deterministic_ddim_pipeline_is_model_sample():
    model = tiny()
    pipeline = quiet(PseudoVideoPipeline(model, DDIMScheduler.from_config(model.scheduler.config)))
    videos = pipeline(batch_size=2, num_inference_steps=4, generator=torch.Generator().manual_seed(3), eta=0.0, output_type="model").videos
    torch.testing.assert_close(videos, model.sample(2, 4, torch.Generator().manual_seed(3)), rtol=0, atol=0)
    stochastic = pipeline(
        batch_size=2, num_inference_steps=4, generator=torch.Generator().manual_seed(3), eta=1.0, output_type="model"
    ).videos
    assert not torch.allclose(stochastic, videos)


class ImageDenoiser(torch.nn.Module):
    """The image model's UNet as diffusers' image pipelines expect it: it appends the indicator channel
    (latent, 0) that ``AutoregressiveVideoDiffusion`` feeds its UNet."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.config = SimpleNamespace(sample_size=model.image_size, in_channels=model.channels)

    @property
    def device(self):
        return self.model.device

    @property
    def dtype(self):
        return self.model.dtype

    def forward(self, image, timestep):
        indicator = torch.zeros_like(image[:, :1])
        return UNet2DOutput(sample=self.model.unet(torch.cat([image, indicator], 1), timestep).sample)


@pytest.mark.parametrize(
    "pipeline_class, scheduler_class, options",
    [
        (DDPMPipeline, DDPMScheduler, {}),  # ancestral sampling, the thesis's sampler
        (DDIMPipeline, DDIMScheduler, {"eta": 1.0}),  # stochastic DDIM
        (DDIMPipeline, DDIMScheduler, {"eta": 0.0}),
    ],
)
def test_image_model_pipeline_equals_diffusers_own_pipeline(pipeline_class, scheduler_class, options):
    model = tiny(1, 0)
    scheduler = scheduler_class.from_config(model.scheduler.config)
    ours = quiet(PseudoVideoPipeline(model, scheduler))(
        batch_size=3, num_inference_steps=7, generator=torch.Generator().manual_seed(4), output_type="np", **options
    ).videos
    reference = quiet(pipeline_class(unet=ImageDenoiser(model), scheduler=scheduler_class.from_config(model.scheduler.config)))
    theirs = reference(batch_size=3, num_inference_steps=7, generator=torch.Generator().manual_seed(4), output_type="np", **options).images
    assert ours.shape == (3, 1, 4, 4, 1) and theirs.shape == (3, 4, 4, 1)
    np.testing.assert_allclose(ours[:, 0], theirs, rtol=0, atol=1e-6)


def test_diffusers_ddpm_pipeline_on_the_raw_unet_is_refused_by_name():
    model = tiny(1, 0)
    pipeline = quiet(DDPMPipeline(unet=model.unet, scheduler=DDPMScheduler.from_config(model.scheduler.config)))
    with pytest.raises(IndicatorChannelsError, match="PseudoVideoPipeline"):
        pipeline(batch_size=2, num_inference_steps=2)
    assert issubclass(IndicatorChannelsError, ValueError)


def test_output_types_progress_and_other_schedulers(capsys):
    model = tiny()
    pipeline = PseudoVideoPipeline(model, EulerDiscreteScheduler.from_config(model.scheduler.config))
    raw = pipeline(batch_size=2, num_inference_steps=3, generator=torch.Generator().manual_seed(5), output_type="model")
    assert f"{model.num_chains * 3}/{model.num_chains * 3}" in capsys.readouterr().err  # one bar over every chain
    quiet(pipeline)
    run = dict(batch_size=2, num_inference_steps=3)
    tensor = pipeline(**run, generator=torch.Generator().manual_seed(5), output_type="pt").videos
    torch.testing.assert_close(tensor, ((raw.videos + 1) / 2).clamp(0, 1))
    array = pipeline(**run, generator=torch.Generator().manual_seed(5)).videos  # "np", diffusers' video default
    np.testing.assert_allclose(array, tensor.permute(0, 1, 3, 4, 2).numpy())
    frames = pipeline(**run, generator=torch.Generator().manual_seed(5), output_type="pil").videos
    assert len(frames) == 2 and len(frames[0]) == 3 and isinstance(frames[0][0], Image.Image)
    (videos,) = pipeline(**run, generator=torch.Generator().manual_seed(5), output_type="pt", return_dict=False)
    assert torch.equal(videos, tensor)


def test_mismatched_schedulers_and_arguments_are_named():
    model = tiny()
    with pytest.raises(ValueError, match="num_train_timesteps"):
        PseudoVideoPipeline(model, DDPMScheduler())(num_inference_steps=2)
    with pytest.raises(ValueError, match="alphas_cumprod"):
        PseudoVideoPipeline(model, DDPMScheduler(num_train_timesteps=50))(num_inference_steps=2)  # linear betas
    with pytest.raises(ValueError, match="predicts 'epsilon'"):
        config = dict(model.scheduler.config, prediction_type="v_prediction")
        PseudoVideoPipeline(model, DDPMScheduler.from_config(config))(num_inference_steps=2)
    with pytest.warns(UserWarning, match="clip"):
        config = dict(model.scheduler.config, clip_sample=True)
        quiet(PseudoVideoPipeline(model, DDIMScheduler.from_config(config)))(num_inference_steps=2)
    pipeline = quiet(PseudoVideoPipeline(model, DDIMScheduler.from_config(model.scheduler.config)))
    with pytest.raises(ValueError, match="output_type"):
        pipeline(num_inference_steps=2, output_type="gif")
    with pytest.raises(ValueError, match="eta"):
        pipeline(num_inference_steps=2, eta=-1.0)
    with pytest.raises(TypeError, match="model"):
        PseudoVideoPipeline(model.unet, pipeline.scheduler)
    with pytest.raises(ValueError, match="beta_schedule"):
        AutoregressiveVideoDiffusion(2, 1, image_size=4, block_out_channels=(8, 16), beta_schedule="cosine-ish")


def test_ema_weights_are_diffusers_ema_and_restored():
    from diffusers.training_utils import EMAModel

    from pseudovideo.training import ema_weights, make_ema

    model = tiny()
    assert make_ema(model, 0.0) is None
    ema = make_ema(model, 0.9)
    assert isinstance(ema, EMAModel)
    reference = [p.detach().clone() for p in model.parameters()]  # the average, by hand
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    videos = torch.rand(4, 3, 1, 4, 4, generator=torch.Generator().manual_seed(0)) * 2 - 1
    for step in range(1, 6):
        loss = model.training_loss(videos, torch.Generator().manual_seed(step))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ema.step(model.parameters())
        decay = 0.0 if step == 1 else min(0.9, step / (9 + step))  # EMAModel's warm-up: the first step copies
        reference = [decay * r + (1 - decay) * p.detach() for r, p in zip(reference, model.parameters())]
    trained = [p.detach().clone() for p in model.parameters()]
    with ema_weights(model, ema):
        for averaged, expected in zip(model.parameters(), reference):
            torch.testing.assert_close(averaged.detach(), expected)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), trained))
    with pytest.raises(ValueError, match="ema-decay"):
        make_ema(model, 1.0)


@pytest.mark.filterwarnings("ignore::pseudovideo.metrics.MetricReliabilityWarning")  # quick runs score 16 images
def test_runner_saves_ema_models_that_reload(tmp_path, capsys):
    from experiments.pseudovideo.diffusion import main

    main(
        [
            "--dataset",
            "digits",
            "--downsample",
            "1",
            "--frames",
            "2",
            "--augmentation",
            "markov_high",
            "--seeds",
            "1",
            "--quick",
            "--quiet",
            "--ema-decay",
            "0.5",
            "--save-models",
            "--out",
            str(tmp_path),
            "--classifier-cache",
            str(tmp_path / "cache"),
        ]
    )
    assert "processes: 1 (no data parallelism" in capsys.readouterr().out
    loaded = AutoregressiveVideoDiffusion.from_pretrained(tmp_path / "model_2frame_markov_high_seed0")
    assert loaded.config.num_frames == 2 and loaded.config.clip_sample is False  # markov_high: no clipping
    assert loaded.config.prediction_type == "v_prediction"  # the runner's default


@pytest.mark.filterwarnings("ignore::pseudovideo.metrics.MetricReliabilityWarning")  # quick runs score 16 images
@pytest.mark.parametrize("runner", ["hvae", "tokens"])
def test_hvae_and_tokens_runners_evaluate_the_ema_of_the_trained_weights(tmp_path, monkeypatch, runner):
    r"""The weights a runner evaluates with ``--ema-decay 0.5`` are the moving average, computed by hand, of the
    weights after each optimiser step: :math:`\bar w_k = d_k \bar w_{k-1} + (1 - d_k) w_k`, with diffusers'
    warm-up :math:`d_1 = 0`, :math:`d_k = \min(0.5, k / (9 + k))`."""
    import importlib

    from torch.optim.optimizer import register_optimizer_step_post_hook

    module = importlib.import_module(f"experiments.pseudovideo.{runner}")
    steps, evaluated = {}, []  # the weights after each step, by the first parameter's id; those evaluated

    def weights(parameters):
        return [p.detach().clone() for p in parameters]

    def after_step(optimizer, args, kwargs):
        parameters = [p for group in optimizer.param_groups for p in group["params"]]
        steps.setdefault(id(parameters[0]), []).append(weights(parameters))

    if runner == "hvae":
        sample = module.HeatHVAE.sample

        def spy(model, *args, **kwargs):
            evaluated.append((id(next(model.parameters())), weights(model.parameters())))
            return sample(model, *args, **kwargs)

        monkeypatch.setattr(module.HeatHVAE, "sample", spy)
        options = []
    else:
        optimise = module.optimise

        def spy(model, *args, **kwargs):
            result = optimise(model, *args, **kwargs)
            evaluated.append((id(next(model.parameters())), weights(model.parameters())))
            return result

        monkeypatch.setattr(module, "optimise", spy)
        options = ["--frames", "1", "--model", "tokenizer"]
    common = [
        "--dataset",
        "digits",
        "--downsample",
        "1",
        "--seeds",
        "1",
        "--quick",
        "--quiet",
        "--classifier-cache",
        str(tmp_path / "cache"),
    ]
    handle = register_optimizer_step_post_hook(after_step)
    try:
        module.main(common + options + ["--out", str(tmp_path / "ema"), "--ema-decay", "0.5"])
    finally:
        handle.remove()
    assert evaluated
    for key, got in evaluated:
        trajectory = steps[key]
        assert len(trajectory) >= 2
        average = trajectory[0]
        for k, step in enumerate(trajectory[1:], start=2):
            decay = min(0.5, k / (9 + k))
            average = [decay * a + (1 - decay) * w for a, w in zip(average, step)]
        for value, want in zip(got, average, strict=True):
            torch.testing.assert_close(value, want)
        assert any(not torch.allclose(a, w) for a, w in zip(average, trajectory[-1]))  # the average is not the last weights


def exact_gaussian_denoiser(model, monkeypatch, std=0.75):
    """Replace the UNet by the exact denoiser of data ``N(0, std^2)``: ``E[x_0 | x_t] = sqrt(abar) std^2 x_t / (abar std^2 + 1 - abar)``."""
    alphas = model.scheduler.alphas_cumprod
    kind = model.config.prediction_type

    def forward(sample, timestep, *args, **kwargs):
        noisy = sample[:, : model.channels]
        abar = alphas[timestep.long()].to(noisy.dtype).view(-1, 1, 1, 1)
        denominator = abar * std**2 + 1 - abar
        clean, noise = abar.sqrt() * std**2 * noisy / denominator, (1 - abar).sqrt() * noisy / denominator
        output = {"epsilon": noise, "sample": clean, "v_prediction": abar.sqrt() * noise - (1 - abar).sqrt() * clean}[kind]
        return UNet2DOutput(sample=output)

    monkeypatch.setattr(model.unet, "forward", forward)
    return model


@pytest.mark.parametrize("schedule", ["squaredcos_cap_v2", "linear"])
@pytest.mark.parametrize("name", SCHEDULERS)
def test_every_named_scheduler_samples_the_data_scale(monkeypatch, name, schedule):
    import diffusers

    model = exact_gaussian_denoiser(
        AutoregressiveVideoDiffusion(1, 0, image_size=4, block_out_channels=(8, 16), beta_schedule=schedule), monkeypatch
    )
    pipeline = quiet(PseudoVideoPipeline(model, getattr(diffusers, name).from_config(model.scheduler.config)))
    frames = pipeline(batch_size=512, num_inference_steps=50, generator=torch.Generator().manual_seed(0), output_type="model").videos
    assert abs(float(frames.std()) - 0.75) < 0.075  # within 10 % of the data's (DDPM, 50 steps on "linear": 0.68)


@pytest.mark.parametrize(
    "name, options, reason",
    [
        ("HeunDiscreteScheduler", {}, "second-order"),  # frames of standard deviation 3.1 for 0.75
        ("DPMSolverMultistepScheduler", {"use_karras_sigmas": True}, "use_karras_sigmas"),  # diffusers' IndexError
        ("KDPM2DiscreteScheduler", {"use_karras_sigmas": True}, "use_karras_sigmas"),  # NaN frames
        ("EulerDiscreteScheduler", {"use_exponential_sigmas": True}, "use_exponential_sigmas"),
        ("EulerDiscreteScheduler", {"use_beta_sigmas": True}, "beta"),  # standard deviation 0.02
        ("LCMScheduler", {}, "consistency"),
        ("EDMEulerScheduler", {}, "alphas_cumprod"),
    ],
)
def test_schedulers_that_cannot_drive_the_cosine_schedule_are_refused_with_the_reason(name, options, reason):
    import diffusers

    model = tiny()
    scheduler = getattr(diffusers, name).from_config(model.scheduler.config, **options)
    with pytest.raises(ValueError, match=reason):
        quiet(PseudoVideoPipeline(model, scheduler))(num_inference_steps=4)


def test_generic_diffusion_pipeline_loader_rebuilds_the_pipeline(tmp_path):
    from diffusers import DiffusionPipeline

    model = tiny()
    pipeline = quiet(PseudoVideoPipeline(model, DDIMScheduler.from_config(model.scheduler.config)))
    pipeline.save_pretrained(tmp_path)
    loaded = quiet(DiffusionPipeline.from_pretrained(tmp_path, trust_remote_code=True))
    assert type(loaded) is PseudoVideoPipeline and isinstance(loaded.scheduler, DDIMScheduler)
    direct = quiet(PseudoVideoPipeline.from_pretrained(tmp_path))  # no remote code needed through the class itself
    run = dict(batch_size=2, num_inference_steps=3, output_type="model")
    videos = pipeline(**run, generator=torch.Generator().manual_seed(0)).videos
    assert torch.equal(loaded(**run, generator=torch.Generator().manual_seed(0)).videos, videos)
    assert torch.equal(direct(**run, generator=torch.Generator().manual_seed(0)).videos, videos)


def test_a_list_of_generators_draws_each_video_by_its_own_as_diffusers_does():
    model = tiny()
    pipeline = quiet(PseudoVideoPipeline(model, DDPMScheduler.from_config(model.scheduler.config)))  # ancestral: noise every step
    run = dict(num_inference_steps=4, output_type="model")
    together = pipeline(batch_size=3, generator=[torch.Generator().manual_seed(seed) for seed in (5, 6, 7)], **run).videos
    alone = torch.cat([pipeline(batch_size=1, generator=torch.Generator().manual_seed(seed), **run).videos for seed in (5, 6, 7)])
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="one per video"):
        pipeline(batch_size=2, generator=[torch.Generator()], **run)


def test_callback_on_step_end_sees_and_replaces_the_latents():
    model = tiny()
    pipeline = quiet(PseudoVideoPipeline(model, DDIMScheduler.from_config(model.scheduler.config)))
    seen = []

    def zero_at_the_end(pipe, step, timestep, callback_kwargs):
        seen.append((pipe, step, int(timestep)))
        latents = callback_kwargs["latents"]
        return {"latents": torch.zeros_like(latents) if step == 2 else latents}

    videos = pipeline(batch_size=2, num_inference_steps=3, output_type="model", callback_on_step_end=zero_at_the_end).videos
    assert len(seen) == model.num_chains * 3 and all(pipe is pipeline for pipe, _, _ in seen)
    assert [step for _, step, _ in seen] == [0, 1, 2] * model.num_chains
    assert torch.equal(videos, torch.zeros_like(videos))  # every chain's last step replaced by zeros
    with pytest.raises(ValueError, match="latents"):
        pipeline(num_inference_steps=2, callback_on_step_end=zero_at_the_end, callback_on_step_end_tensor_inputs=["noise"])
