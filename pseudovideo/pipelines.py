"""A diffusers ``DiffusionPipeline`` for pseudo-video generation (thesis §5.4.2).

``PseudoVideoPipeline(model, scheduler)`` samples an :class:`~pseudovideo.models.diffusion.AutoregressiveVideoDiffusion`
with any diffusers scheduler: the initial block of ``C`` frames by one reverse chain, then each
later frame by a chain conditioned on the ``C`` frames before it. ``DDPMScheduler`` gives the
thesis's ancestral sampler (1,000 steps), ``DDIMScheduler`` DDIM with ``eta`` (0: deterministic),
and the others (Euler, DPM-Solver, ...) work through ``scale_model_input`` / ``init_noise_sigma``.
Build the scheduler from the model's training schedule::

    pipeline = PseudoVideoPipeline(model, DDIMScheduler.from_config(model.scheduler.config))
    videos = pipeline(batch_size=16, num_inference_steps=50, eta=0.0, generator=torch.Generator().manual_seed(0)).videos

A scheduler whose noise schedule or prediction type differs from the model's raises a ``ValueError``
(its samples would be silently wrong); one that clips where the model does not clip warns.
``save_pretrained`` / ``from_pretrained`` store and rebuild both components, as for any diffusers
pipeline.
"""

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from ._optional import missing
from ._validation import check_generator, check_int, check_real
from .models.diffusion import AutoregressiveVideoDiffusion
from .scaling import to_data_range

try:
    import diffusers
    from diffusers.schedulers.scheduling_utils import SchedulerMixin

    if TYPE_CHECKING:  # diffusers' lazy __init__ gives type checkers its torch-less dummy classes: the defining module
        from diffusers.pipelines.pipeline_utils import DiffusionPipeline
    else:
        from diffusers import DiffusionPipeline
    from diffusers.utils import BaseOutput
except ImportError as _error:
    raise missing("diffusers", "video", "pseudovideo.pipelines") from _error

__all__ = ["PseudoVideoPipeline", "PseudoVideoPipelineOutput", "OUTPUT_TYPES"]

#: ``output_type`` values: ``"model"`` the sampler's frames as they are (model space, unclipped);
#: ``"pt"`` a ``(N, T, C, H, W)`` tensor in ``[0, 1]``; ``"np"`` a ``(N, T, H, W, C)`` float array in
#: ``[0, 1]``; ``"pil"`` one list of ``T`` PIL images per video (the last three clipped for display).
OUTPUT_TYPES = ("model", "pt", "np", "pil")


@dataclass
class PseudoVideoPipelineOutput(BaseOutput):
    """What :class:`PseudoVideoPipeline` returns.

    :param videos: the generated videos, in the form ``output_type`` chose (see :data:`OUTPUT_TYPES`).
    """

    videos: torch.Tensor | np.ndarray | list


class PseudoVideoPipeline(DiffusionPipeline):
    """Autoregressive pseudo-video generation with any diffusers scheduler (module docstring).

    :param model: the trained model sampled.
    :param scheduler: any diffusers scheduler built from the model's training schedule
        (``SchedulerClass.from_config(model.scheduler.config)``).
    """

    model_cpu_offload_seq = "model"  # type: ignore[assignment]  # diffusers leaves the base default None unannotated (typed None)

    def __init__(self, model: AutoregressiveVideoDiffusion, scheduler: diffusers.SchedulerMixin):
        super().__init__()
        if not isinstance(model, AutoregressiveVideoDiffusion):
            raise TypeError(f"model must be an AutoregressiveVideoDiffusion, got {type(model).__name__}")
        if not isinstance(scheduler, SchedulerMixin):
            raise TypeError(f"scheduler must be a diffusers scheduler, got {type(scheduler).__name__}")
        self.register_modules(model=model, scheduler=scheduler)

    @torch.no_grad()
    def __call__(
        self,
        batch_size: int = 1,
        num_inference_steps: int = 50,
        generator: torch.Generator | None = None,
        eta: float = 0.0,
        output_type: str = "np",
        return_dict: bool = True,
    ):
        """``batch_size`` videos of ``model.config.num_frames`` frames, each chain ``num_inference_steps`` long.

        ``eta`` is passed to schedulers whose ``step`` takes it (DDIM: 0 deterministic, 1 DDPM-like);
        ``generator`` draws the initial noise and the schedulers' own noise (ancestral DDPM steps),
        so a seeded generator gives the same videos again. Returns a
        :class:`PseudoVideoPipelineOutput`, or the tuple ``(videos,)`` with ``return_dict=False``.
        """
        check_int(batch_size, "batch_size")
        check_int(num_inference_steps, "num_inference_steps")
        check_generator(generator)
        eta = check_real(eta, "eta", low=0.0)
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"output_type must be one of {OUTPUT_TYPES}, got {output_type!r}")
        self._check_scheduler()
        accepted = inspect.signature(self.scheduler.step).parameters
        step_options = {name: value for name, value in (("eta", eta), ("generator", generator)) if name in accepted}
        model = self.model
        with self.progress_bar(total=model.num_chains * num_inference_steps) as progress:
            videos = model._sample_batch(batch_size, self.scheduler, num_inference_steps, generator, step_options, progress)
        videos = self._convert(videos, output_type)
        return PseudoVideoPipelineOutput(videos=videos) if return_dict else (videos,)

    def _check_scheduler(self):
        trained, sampler = self.model.scheduler, self.scheduler
        if sampler.config.get("num_train_timesteps") != trained.config.num_train_timesteps:
            raise ValueError(
                f"the scheduler has num_train_timesteps={sampler.config.get('num_train_timesteps')}, the "
                f"model was trained with {trained.config.num_train_timesteps}: build the scheduler with "
                "SchedulerClass.from_config(model.scheduler.config)"
            )
        alphas = getattr(sampler, "alphas_cumprod", None)
        if alphas is not None and not torch.allclose(alphas.double().cpu(), trained.alphas_cumprod.double(), rtol=1e-5):
            raise ValueError(
                "the scheduler's noise schedule (alphas_cumprod) differs from the one the model was "
                "trained with: build it with SchedulerClass.from_config(model.scheduler.config)"
            )
        kind = sampler.config.get("prediction_type", "epsilon")
        if kind != trained.config.prediction_type:
            raise ValueError(f"the scheduler reads the UNet's output as {kind!r}, the model predicts {trained.config.prediction_type!r}")
        if sampler.config.get("clip_sample", False) and not trained.config.clip_sample:
            warnings.warn(
                "the scheduler clips predicted frames to [-1, 1] (clip_sample=True) but the model was built "
                "without clipping: generated frames will not have the training frames' distribution",
                UserWarning,
                stacklevel=3,
            )

    @staticmethod
    def _convert(videos: torch.Tensor, output_type: str):
        if output_type == "model":
            return videos
        images = to_data_range(videos.float(), clip=True)
        if output_type == "pt":
            return images
        array = images.permute(0, 1, 3, 4, 2).cpu().numpy()
        if output_type == "np":
            return array
        from PIL import Image

        pixels = (array * 255).round().astype(np.uint8)
        return [[Image.fromarray(frame.squeeze(-1) if frame.shape[-1] == 1 else frame) for frame in video] for video in pixels]
