r"""Image DDPM and autoregressive video diffusion on pseudo videos (thesis §5.4.2, Harvey et al. "Autoreg").

One class covers both. A diffusers ``UNet2DModel`` sees a window of ``context + 1`` frame slots
stacked as channels, plus one indicator channel per slot: ``1`` observed (a clean conditioning
frame), ``0`` latent (being denoised), ``-1`` absent (zeros). It is trained on two tasks,

* initial: frames :math:`1, \dots, C` latent (generated jointly), the last slot absent;
* step :math:`t` (:math:`t = C+1, \dots, T`): frames :math:`t-C, \dots, t-1` observed, frame :math:`t` latent,

with the epsilon-prediction loss of DDPM (thesis eq. (5.2); Ho et al., *Denoising Diffusion Probabilistic
Models*, 2020),

.. math::

    \mathbb{E}\,\lVert \epsilon - \epsilon_\theta(\sqrt{\bar\alpha_t}\, x_0 + \sqrt{1 - \bar\alpha_t}\, \epsilon, t) \rVert^2,

on latent slots only; tasks are drawn in proportion to their use at sampling time (1 initial chain, :math:`T - C` step chains).
With ``num_frames = 1`` (``context = 0``) this is exactly an image DDPM of the same UNet, the
thesis's 1-frame baseline. Sampling runs the reverse chain once for the initial block and once per
later frame, each frame conditioned on the :math:`C` most recent generated frames.

The model is a diffusers ``ModelMixin``/``ConfigMixin``: ``save_pretrained(dir)`` writes its
config (every constructor argument, hence also its training noise schedule) and weights,
``AutoregressiveVideoDiffusion.from_pretrained(dir)`` rebuilds it, and
:class:`pseudovideo.pipelines.PseudoVideoPipeline` samples it with any diffusers scheduler. Its
UNet takes windows with indicator channels, not plain images: passed to diffusers' own
``DDPMPipeline``/``DDIMPipeline`` (whose noise fills the indicator channels) it raises
:class:`IndicatorChannelsError` instead of returning images with the wrong channel count.

Clipping. diffusers' DDPM/DDIM schedulers clip the predicted clean sample :math:`x_0` to
``[-1, 1]`` by default; that is right for images in ``[-1, 1]`` but wrong for Gaussian-noise pseudo
frames, of which a large share lies outside ``[-1, 1]`` in training
(:math:`z_s = \sqrt{1 - \beta}\, z_{s+1} + \sqrt{\beta}\, \epsilon`). Clipping is therefore an explicit
argument, ``clip_sample``, off by default;
:func:`default_clip_sample` gives the right choice per builder (on only where every training frame
lies in ``[-1, 1]``: the image model and blur). Generated frames are returned exactly as the
sampler produced them and fed back as context unchanged.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, NamedTuple

import torch

from probseq._optional import missing
from probseq._validation import check_dtype, check_int, check_tensor

from .._random import randn
from .._validation import check_generator
from ..scaling import check_model_range

try:
    from diffusers import ConfigMixin
    from diffusers.configuration_utils import register_to_config

    if TYPE_CHECKING:  # diffusers' lazy __init__ gives type checkers its torch-less dummy classes: the defining modules
        from diffusers.models.modeling_utils import ModelMixin
        from diffusers.models.unets.unet_2d import UNet2DModel
        from diffusers.schedulers.scheduling_ddim import DDIMScheduler
        from diffusers.schedulers.scheduling_ddpm import DDPMScheduler
    else:
        from diffusers import DDIMScheduler, DDPMScheduler, ModelMixin, UNet2DModel
except ImportError as _error:
    raise missing("diffusers", "video", "pseudovideo.models.diffusion") from _error

OBSERVED, LATENT, ABSENT = 1.0, 0.0, -1.0

#: Whether the sampler may clip predicted frames to ``[-1, 1]`` for each builder's training videos
#: (``"none"``: the image model): only where every training frame of ``[-1, 1]`` images lies in
#: ``[-1, 1]`` (blur is a convex combination of pixels; heat adds noise; the Markov builders add a
#: Gaussian of variance up to ``1 - prod(1 - beta)``).
PREDICTION_TYPES = ("epsilon", "sample", "v_prediction")
CLIP_SAMPLE = {"none": True, "blur": True, "heat": False, "markov_first": False, "markov_high": False}


class TrainingDraws(NamedTuple):
    """The random parts of one training loss: ``tasks`` ``(B,)``, window ``noise`` ``(B, slots, C, H, W)``,
    diffusion ``timesteps`` ``(B,)`` (CPU tensors, drawn by :meth:`AutoregressiveVideoDiffusion.training_draws`).

    :param tasks: ``(B,)`` int64 task per video: 0 the initial block, ``t - C`` the step to frame ``t``.
    :param noise: ``(B, slots, C, H, W)`` standard normal noise of each video's window.
    :param timesteps: ``(B,)`` int64 diffusion timesteps in ``[0, num_train_timesteps)``.
    """

    tasks: torch.Tensor
    noise: torch.Tensor
    timesteps: torch.Tensor


class IndicatorChannelsError(ValueError):
    """The UNet of :class:`AutoregressiveVideoDiffusion` got input whose indicator channels are not slot
    states (``1`` observed, ``0`` latent, ``-1`` absent): e.g. from diffusers' ``DDPMPipeline``."""


class WindowUNet2DModel(UNet2DModel):
    """diffusers' ``UNet2DModel`` for a window of frame slots: its last ``num_indicator_channels`` input
    channels must hold slot states, which it checks (a plain image pipeline fills them with noise)."""

    num_indicator_channels = 0

    def forward(self, sample, timestep, *args, **kwargs):
        if self.num_indicator_channels:
            indicator = sample[:, -self.num_indicator_channels :]
            if not bool(((indicator == OBSERVED) | (indicator == LATENT) | (indicator == ABSENT)).all()):
                raise IndicatorChannelsError(
                    f"this UNet's last {self.num_indicator_channels} input channels are slot indicators (1 observed, "
                    "0 latent, -1 absent), not image channels: it is the denoiser of an AutoregressiveVideoDiffusion "
                    "and cannot run in diffusers' DDPMPipeline/DDIMPipeline; sample it with "
                    "pseudovideo.pipelines.PseudoVideoPipeline(model, scheduler) or model.sample(...)"
                )
        return super().forward(sample, timestep, *args, **kwargs)


def default_clip_sample(augmentation: str) -> bool:
    """``CLIP_SAMPLE[augmentation]``: the right ``clip_sample`` for a model trained on that builder.

    :param augmentation: a pseudo-video method of :data:`pseudovideo.augment.METHODS`, or ``"none"``
        (the 1-frame image model): the keys of ``CLIP_SAMPLE``.
    """
    if not isinstance(augmentation, str) or augmentation not in CLIP_SAMPLE:
        raise ValueError(f"augmentation must be one of {tuple(CLIP_SAMPLE)}, got {augmentation!r}")
    return CLIP_SAMPLE[augmentation]


class AutoregressiveVideoDiffusion(ModelMixin, ConfigMixin):  # type: ignore[misc]  # diffusers' two bases disagree on config_name's type
    r"""p(z_1..z_T) = p(z_1..z_C) prod_t p(z_t | z_{t-C..t-1}), every factor a DDPM of one shared UNet.

    That is, :math:`p(z_{1:T}) = p(z_{1:C}) \prod_{t=C+1}^{T} p(z_t \mid z_{t-C:t-1})`.

    :param num_frames: the frames :math:`T` per video (1: an image DDPM).
    :param context: the conditioning frames :math:`C`, in ``1..num_frames-1`` (0 for ``num_frames=1``).
    :param channels: the frames' channels.
    :param image_size: the frames' height and width in pixels, divisible by ``2 ** (len(block_out_channels) - 1)``.
    :param block_out_channels: the UNet's channels per resolution level.
    :param layers_per_block: the UNet's ResNet layers per block.
    :param num_train_timesteps: the diffusion timesteps of training (at least 2).
    :param clip_sample: clip the predicted clean frames to ``[-1, 1]`` while sampling (diffusers'
        ``clip_sample``); leave it off unless every training frame lies in ``[-1, 1]``
        (:func:`default_clip_sample`).
    :param prediction_type: what the UNet predicts, as in diffusers:
        ``"epsilon"`` the noise (thesis eq. (5.2)), ``"sample"`` the clean frames :math:`x_0`, or
        ``"v_prediction"`` :math:`v = \sqrt{\bar\alpha_t}\, \epsilon - \sqrt{1 - \bar\alpha_t}\, x_0` (Salimans & Ho), whose errors
        the sampler does not amplify by :math:`1 / \sqrt{\bar\alpha_t}` at high noise levels.
    :param beta_schedule: the training noise schedule, any of diffusers' names (``"squaredcos_cap_v2"``, the cosine
        schedule, or ``"linear"``, the thesis's DDPM schedule, ...).
    """

    @register_to_config
    def __init__(
        self,
        num_frames: int,
        context: int,
        channels: int = 1,
        image_size: int = 32,
        block_out_channels: tuple[int, ...] = (32, 64, 64),
        layers_per_block: int = 1,
        num_train_timesteps: int = 1000,
        clip_sample: bool = False,
        prediction_type: str = "epsilon",
        beta_schedule: str = "squaredcos_cap_v2",
    ):
        """Build the UNet and the training noise schedule (the parameters: the class docstring)."""
        super().__init__()
        check_int(num_frames, "num_frames")
        if num_frames == 1 and context != 0:
            raise ValueError(f"an image model (num_frames=1) has context 0, got context={context!r}")
        if num_frames > 1 and not (isinstance(context, int) and 1 <= context < num_frames):
            raise ValueError(f"context must be an integer in 1..num_frames-1={num_frames - 1}, got {context!r}")
        check_int(channels, "channels")
        check_int(image_size, "image_size")
        check_int(num_train_timesteps, "num_train_timesteps", low=2)
        if prediction_type not in PREDICTION_TYPES:
            raise ValueError(f"prediction_type must be one of {PREDICTION_TYPES}, got {prediction_type!r}")
        if not isinstance(clip_sample, bool):
            raise TypeError(f"clip_sample must be a bool, got {type(clip_sample).__name__}")
        if image_size % 2 ** (len(block_out_channels) - 1):
            raise ValueError(
                f"image_size {image_size} must be divisible by 2^(levels-1) = {2 ** (len(block_out_channels) - 1)}; pad the images"
            )
        self.num_frames, self.context, self.channels, self.image_size = num_frames, context, channels, image_size
        self.slots = context + 1
        block_out_channels = tuple(block_out_channels)
        self.unet = WindowUNet2DModel(
            sample_size=image_size,
            in_channels=self.slots * (channels + 1),
            out_channels=self.slots * channels,
            block_out_channels=block_out_channels,
            layers_per_block=layers_per_block,
            down_block_types=("DownBlock2D",) * len(block_out_channels),
            up_block_types=("UpBlock2D",) * len(block_out_channels),
            norm_num_groups=8,
        )
        self.unet.num_indicator_channels = self.slots
        try:
            self.scheduler = DDPMScheduler(  # beta_start/end explicit: from_config carries them to other schedulers
                num_train_timesteps=num_train_timesteps,
                beta_start=0.0001,
                beta_end=0.02,
                beta_schedule=beta_schedule,
                clip_sample=clip_sample,
                prediction_type=prediction_type,
            )
        except NotImplementedError as error:
            raise ValueError(f"beta_schedule {beta_schedule!r} is not one of diffusers' schedules") from error

    @property
    def num_tasks(self) -> int:
        return 1 if self.num_frames == 1 else self.num_frames - self.context + 1

    def task_windows(self, tasks: torch.Tensor):
        """Frame indices ``(B, slots)`` (``-1`` where absent) and slot states ``(B, slots)`` per task.

        :param tasks: ``(B,)`` int64 tasks (:class:`TrainingDraws`).
        """
        slot = torch.arange(self.slots, device=tasks.device)
        if self.num_frames == 1:
            return torch.zeros_like(tasks)[:, None], torch.full((len(tasks), 1), LATENT, device=tasks.device)
        initial = tasks[:, None] == 0
        frame = torch.where(initial, slot.expand(len(tasks), -1), tasks[:, None] - 1 + slot)
        state = torch.where(slot == self.context, LATENT, OBSERVED).expand(len(tasks), -1)
        state = torch.where(initial, torch.where(slot < self.context, LATENT, ABSENT), state)
        frame = torch.where(state == ABSENT, -1, frame)
        return frame, state

    def forward(self, videos: torch.Tensor, generator: torch.Generator | None = None, draws: TrainingDraws | None = None) -> torch.Tensor:
        """The training loss (:meth:`training_loss`): calling the model, as data-parallel wrappers
        (``DistributedDataParallel``, ``accelerate``) require, trains it.

        :param videos: ``(B, T, C, H, W)`` pseudo videos of images in ``[-1, 1]``, the image last.
        :param generator: the random generator of the draws (``None``: PyTorch's global one).
        :param draws: the random parts, from :meth:`training_draws` (``None``: drawn by ``generator``).
        """
        return self.training_loss(videos, generator, draws)

    def training_draws(self, videos: torch.Tensor, generator: torch.Generator | None = None) -> TrainingDraws:
        """The random parts of :meth:`training_loss` for ``videos``: a task, the noise of its window and a
        diffusion timestep per video, drawn by ``generator`` in that order.

        :param videos: ``(B, T, C, H, W)`` pseudo videos of images in ``[-1, 1]``, the image last.
        :param generator: the random generator of the draws (``None``: PyTorch's global one).
        """
        self._check_videos(videos)
        check_generator(generator)
        batch = videos.shape[0]
        tasks = self._draw_tasks(batch, generator)
        shape = (batch, self.slots, self.channels, self.image_size, self.image_size)
        noise = torch.randn(shape, generator=generator, dtype=videos.dtype, device="cpu")
        timesteps = torch.randint(0, self.scheduler.config.num_train_timesteps, (batch,), generator=generator)
        return TrainingDraws(tasks, noise, timesteps)

    def training_loss(
        self, videos: torch.Tensor, generator: torch.Generator | None = None, draws: TrainingDraws | None = None
    ) -> torch.Tensor:
        r"""Mean squared error of the UNet's prediction on latent slots (thesis eq. (5.2) for ``"epsilon"``: the simplified
        loss :math:`\lVert \epsilon - \epsilon_\theta(z_t, t) \rVert^2` of Ho et al. (2020)).

        ``videos`` ``(B, T, C, H, W)``: pseudo videos of images in ``[-1, 1]``. The target is the noise
        ``eps``, the clean frames, or ``v`` by ``prediction_type``. ``draws`` (:meth:`training_draws`)
        fixes the random parts; by default they are drawn by ``generator``.

        :param videos: ``(B, T, C, H, W)`` pseudo videos of images in ``[-1, 1]``, the image last.
        :param generator: the random generator of the draws (``None``: PyTorch's global one).
        :param draws: the random parts, from :meth:`training_draws` (``None``: drawn by ``generator``).
        """
        if draws is None:
            draws = self.training_draws(videos, generator)
        else:
            self._check_videos(videos)
            if not isinstance(draws, TrainingDraws) or len(draws.tasks) != len(videos):
                raise ValueError("draws must be the TrainingDraws of these videos (model.training_draws(videos))")
        batch, device = videos.shape[0], videos.device
        tasks = draws.tasks.to(device)
        frame, state = self.task_windows(tasks)
        clean = videos[torch.arange(batch, device=device)[:, None], frame.clamp_min(0)]
        noise = draws.noise.to(device=device, dtype=clean.dtype)
        timesteps = draws.timesteps.to(device)
        noisy = self.scheduler.add_noise(clean, noise, timesteps)
        prediction = self._predict_noise(noisy, clean, state, timesteps)
        target = self._target(clean, noise, timesteps)
        latent = (state == LATENT)[:, :, None, None, None].to(clean.dtype)
        per_slot = (prediction - target).pow(2).mean(dim=(2, 3, 4), keepdim=True)
        return (per_slot * latent).sum() / latent.sum()

    @torch.no_grad()
    def sample(
        self, num_samples: int, num_inference_steps: int = 50, generator: torch.Generator | None = None, batch_size: int = 256
    ) -> torch.Tensor:
        """Videos ``(N, T, C, H, W)`` in model space, frames generated autoregressively with DDIM (eta = 0).

        Clipped to ``[-1, 1]`` only if the model was built with ``clip_sample=True``; returned in the
        dtype and on the device of the model's parameters.

        :param num_samples: the number of videos :math:`N`.
        :param num_inference_steps: the DDIM steps of each reverse chain.
        :param generator: the random generator of the chains' noise (``None``: PyTorch's global one).
        :param batch_size: the most videos sampled at once (memory).
        """
        check_int(num_samples, "num_samples")
        check_int(num_inference_steps, "num_inference_steps")
        check_int(batch_size, "batch_size")
        check_generator(generator)
        scheduler = DDIMScheduler.from_config(self.scheduler.config)
        chunks = [
            self.sample_batch(min(batch_size, num_samples - start), scheduler, num_inference_steps, generator)
            for start in range(0, num_samples, batch_size)
        ]
        return torch.cat(chunks)

    @torch.no_grad()
    def sample_next_frame(
        self, context_frames: torch.Tensor, num_inference_steps: int = 50, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """A draw of ``z_t ~ p(z_t | z_{t-C..t-1})`` given the ``C`` previous frames ``(B, C, channels, H, W)``.

        A sample, not the conditional mean ``E[z_t | context]`` (average several draws to estimate that).

        :param context_frames: ``(B, C, channels, H, W)``: the ``context`` previous frames, oldest first, in model
            space (a ``ValueError`` on ``[0, 1]`` or ``[0, 255]`` frames, as for the training videos).
        :param num_inference_steps: the DDIM steps of the reverse chain.
        :param generator: the random generator of the chain's noise (``None``: PyTorch's global one).
        """
        if self.num_frames == 1:
            raise ValueError("an image model (num_frames=1) has no context frames to condition on")
        check_tensor(context_frames, "context_frames", floating=True, finite=False)
        expected = (self.context, self.channels, self.image_size, self.image_size)
        if context_frames.dim() != 5 or tuple(context_frames.shape[1:]) != expected:
            raise ValueError(f"context_frames must have shape (B, {', '.join(map(str, expected))}), got {tuple(context_frames.shape)}")
        check_dtype(context_frames, "context_frames", self._dtype())
        check_tensor(context_frames, "context_frames", non_empty=True)
        check_model_range(context_frames, "context_frames", refuse_unit_range=True)
        check_int(num_inference_steps, "num_inference_steps")
        check_generator(generator)
        scheduler = DDIMScheduler.from_config(self.scheduler.config)
        return self._next_frame(context_frames, scheduler, num_inference_steps, generator)

    def predict_next_frame(
        self, context_frames: torch.Tensor, num_inference_steps: int = 50, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Deprecated name of :meth:`sample_next_frame` (it returns a sample, not a prediction).

        :param context_frames: ``(B, C, channels, H, W)``: the ``context`` previous frames, oldest first, in model space.
        :param num_inference_steps: the DDIM steps of the reverse chain.
        :param generator: the random generator of the chain's noise (``None``: PyTorch's global one).
        """
        warnings.warn("predict_next_frame is deprecated: it draws a sample; call sample_next_frame", DeprecationWarning, stacklevel=2)
        return self.sample_next_frame(context_frames, num_inference_steps, generator)

    @property
    def num_chains(self) -> int:
        """Reverse chains per generated video: the initial block, then one per later frame."""
        return self.num_tasks

    def sample_batch(self, batch, scheduler, steps, generator, step_options=None, on_step=None):
        """``batch`` videos sampled at once, every chain run by ``scheduler`` (what :meth:`sample` and
        :class:`~pseudovideo.pipelines.PseudoVideoPipeline` run per batch).

        :param batch: the number of videos.
        :param scheduler: the diffusers scheduler that runs each reverse chain.
        :param steps: the inference steps of each chain.
        :param generator: the random generator of the chains' noise (``None``: PyTorch's global one).
        :param step_options: extra keyword arguments of ``scheduler.step`` (default none).
        :param on_step: ``on_step(index, timestep, sample)``, called after every step; returns the sample to go on
            from (default none).
        """
        shape = (batch, self.slots, self.channels, self.image_size, self.image_size)
        window = torch.zeros(shape, dtype=self._dtype(), device=self.device)
        tasks = torch.zeros(batch, dtype=torch.long, device=self.device)
        _, state = self.task_windows(tasks)
        initial = self._reverse_chain(window, state, scheduler, steps, generator, step_options, on_step)
        frames = list(initial.unbind(1)) if self.num_frames == 1 else list(initial[:, : self.context].unbind(1))
        while len(frames) < self.num_frames:
            context = torch.stack(frames[-self.context :], 1)
            frames.append(self._next_frame(context, scheduler, steps, generator, step_options, on_step))
        return torch.stack(frames, 1)

    def _next_frame(self, context_frames, scheduler, steps, generator, step_options=None, on_step=None):
        batch = len(context_frames)
        state = torch.tensor([OBSERVED] * self.context + [LATENT], device=context_frames.device).expand(batch, -1)
        window = torch.cat([context_frames, torch.zeros_like(context_frames[:, :1])], dim=1)
        return self._reverse_chain(window, state, scheduler, steps, generator, step_options, on_step)[:, -1]

    def _reverse_chain(self, window, state, scheduler, steps, generator, step_options=None, on_step=None):
        """The scheduler's reverse chain from noise in the latent slots; observed slots stay clean.

        Any diffusers scheduler: ``x_T = init_noise_sigma * eps``, then per timestep the UNet sees
        ``scale_model_input(x_t)`` and ``step`` gives ``x_{t-1}`` (DDIM's ``eta``, DDPM's ancestral
        noise drawn by ``generator``, or by one generator per video from a list). ``set_timesteps`` restarts
        multistep schedulers' history.
        """
        scheduler.set_timesteps(steps, device=window.device)
        latent = (state == LATENT)[:, :, None, None, None]
        # drawn in float32 whatever the model's dtype: a seeded generator gives the same chain in every dtype
        noise = randn(window.shape, generator, torch.float32, window.device).to(window.dtype)
        sample = torch.where(latent, noise * scheduler.init_noise_sigma, window)
        for index, timestep in enumerate(scheduler.timesteps):
            timesteps = torch.full((len(window),), int(timestep), device=window.device)
            prediction = self._predict_noise(scheduler.scale_model_input(sample, timestep), window, state, timesteps)
            stepped = scheduler.step(prediction, timestep, sample, **(step_options or {})).prev_sample
            sample = torch.where(latent, stepped.to(window.dtype), window)
            if on_step is not None:
                sample = torch.where(latent, on_step(index, timestep, sample), window)
        return sample

    def _predict_noise(self, noisy, clean, state, timesteps):
        """UNet input: noisy latent slots, clean observed slots, zero absent slots, and the state channels."""
        batch, slots, channels, height, width = clean.shape
        expanded = state[:, :, None, None, None]
        inputs = torch.where(expanded == LATENT, noisy, torch.where(expanded == OBSERVED, clean, torch.zeros_like(clean)))
        indicator = state[:, :, None, None].to(clean.dtype).expand(-1, -1, height, width)
        stacked = torch.cat([inputs.reshape(batch, slots * channels, height, width), indicator], dim=1)
        return self.unet(stacked, timesteps).sample.view(batch, slots, channels, height, width)

    def _target(self, clean, noise, timesteps):
        kind = self.scheduler.config.prediction_type
        if kind == "epsilon":
            return noise
        if kind == "sample":
            return clean
        return self.scheduler.get_velocity(clean, noise, timesteps)

    def _draw_tasks(self, batch, generator):
        """Task 0 (initial block) once per ``T - C`` step tasks, as at sampling time."""
        return torch.randint(0, self.num_tasks, (batch,), generator=generator)

    def _dtype(self) -> torch.dtype:
        return next(self.unet.parameters()).dtype

    def _check_videos(self, videos):
        check_tensor(videos, "videos", floating=True, finite=False)
        expected = (self.num_frames, self.channels, self.image_size, self.image_size)
        if videos.dim() != 5 or tuple(videos.shape[1:]) != expected:
            raise ValueError(f"videos must have shape (B, {', '.join(map(str, expected))}), got {tuple(videos.shape)}")
        check_dtype(videos, "videos", self._dtype())
        check_tensor(videos, "videos", non_empty=True)
        check_model_range(videos[:, -1], "videos' last frames (the images)", refuse_unit_range=True)
