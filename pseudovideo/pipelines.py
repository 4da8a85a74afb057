r"""A diffusers ``DiffusionPipeline`` for pseudo-video generation (thesis §5.4.2).

``PseudoVideoPipeline(model, scheduler)`` samples an :class:`~pseudovideo.models.diffusion.AutoregressiveVideoDiffusion`
with any diffusers scheduler: the initial block of ``C`` frames by one reverse chain, then each
later frame by a chain conditioned on the ``C`` frames before it. ``DDPMScheduler`` gives the
thesis's ancestral sampler (1,000 steps), ``DDIMScheduler`` DDIM with ``eta`` (0: deterministic),
and the others of :data:`SCHEDULERS` (Euler, DPM-Solver, UniPC, ...) work through ``scale_model_input`` /
``init_noise_sigma``. Build the scheduler from the model's training schedule::

    pipeline = PseudoVideoPipeline(model, DDIMScheduler.from_config(model.scheduler.config))
    videos = pipeline(batch_size=16, num_inference_steps=50, eta=0.0, generator=torch.Generator().manual_seed(0)).videos

A scheduler whose noise schedule or prediction type differs from the model's raises a ``ValueError``
(its samples would be silently wrong); one that clips where the model does not clip warns. A ``ValueError`` also
refuses, with its reason, a scheduler that cannot cross the schedule's largest noise level
:math:`\sigma_{max} = \sqrt{(1 - \bar\alpha_T) / \bar\alpha_T}` (2.0e4 for the default cosine schedule,
157 for ``"linear"``) when it exceeds :data:`SIGMA_MAX_LIMIT`: ``HeunDiscreteScheduler`` (frames of
standard deviation 5.8 for 0.75) and Karras or exponential sigma spacing (diffusers' IndexError or NaN);
also schedulers without the model's ``alphas_cumprod`` (EDM), consistency-model samplers (LCM, TCD) and
flow or beta sigma spacing.
``save_pretrained`` / ``from_pretrained`` store and rebuild both components, as for any diffusers
pipeline; diffusers' generic ``DiffusionPipeline.from_pretrained(folder, trust_remote_code=True)``
loads the folder too (through the one-line module file ``pseudovideo_pipeline.py`` saved with it,
which imports this class: diffusers' convention for pipelines defined outside diffusers).
``callback_on_step_end`` and a list of one generator per video work as in diffusers' pipelines.
"""

from __future__ import annotations

import inspect
import json
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from probseq._optional import missing
from probseq._validation import check_int, check_real

from ._validation import check_generator
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

__all__ = ["PseudoVideoPipeline", "PseudoVideoPipelineOutput", "OUTPUT_TYPES", "SCHEDULERS", "SIGMA_MAX_LIMIT"]

#: ``output_type`` values: ``"model"`` the sampler's frames as they are (model space, unclipped);
#: ``"pt"`` a ``(N, T, C, H, W)`` tensor in ``[0, 1]``; ``"np"`` a ``(N, T, H, W, C)`` float array in
#: ``[0, 1]``; ``"pil"`` one list of ``T`` PIL images per video (the last three clipped for display).
OUTPUT_TYPES = ("model", "pt", "np", "pil")
#: The diffusers schedulers tested to sample the model's schedules (cosine and linear): driving a Gaussian
#: data set's exact denoiser, each gives frames of the data's standard deviation.
SCHEDULERS = (
    "DDPMScheduler",
    "DDIMScheduler",
    "EulerDiscreteScheduler",
    "EulerAncestralDiscreteScheduler",
    "DPMSolverMultistepScheduler",
    "DPMSolverSinglestepScheduler",
    "UniPCMultistepScheduler",
    "DEISMultistepScheduler",
    "PNDMScheduler",
    "LMSDiscreteScheduler",
    "KDPM2DiscreteScheduler",
    "KDPM2AncestralDiscreteScheduler",
)
#: Largest noise level :math:`\sigma_{max} = \sqrt{(1 - \bar\alpha_T) / \bar\alpha_T}` that Karras or exponential
#: sigma spacing and Heun's step can cross (the linear schedule's is 157, the cosine schedule's 2.0e4).
SIGMA_MAX_LIMIT = 1e3
SECOND_ORDER_SCHEDULERS = ("HeunDiscreteScheduler",)
CONSISTENCY_SCHEDULERS = ("LCMScheduler", "TCDScheduler")
#: The module file :meth:`PseudoVideoPipeline.save_pretrained` writes beside ``model_index.json``.
LOADER_MODULE = "pseudovideo_pipeline"


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

    _callback_tensor_inputs = ["latents"]
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
        generator: torch.Generator | list[torch.Generator] | None = None,
        eta: float = 0.0,
        output_type: str = "np",
        return_dict: bool = True,
        callback_on_step_end: Callable | None = None,
        callback_on_step_end_tensor_inputs: Sequence[str] = ("latents",),
    ):
        """``batch_size`` videos of ``model.config.num_frames`` frames, each chain ``num_inference_steps`` long.

        ``eta`` is passed to schedulers whose ``step`` takes it (DDIM: 0 deterministic, 1 DDPM-like);
        ``generator`` draws the initial noise and the schedulers' own noise (ancestral DDPM steps),
        so a seeded generator gives the same videos again; a list of ``batch_size`` generators draws
        video ``i`` by ``generator[i]`` (the same video as ``batch_size=1`` with that generator).
        ``callback_on_step_end(pipeline, step, timestep, {"latents": sample})``, as in diffusers, runs
        after every step of every chain (``step`` counts within the chain) and may return
        ``{"latents": ...}`` to replace the chain's latent frames. Returns a
        :class:`PseudoVideoPipelineOutput`, or the tuple ``(videos,)`` with ``return_dict=False``.
        """
        check_int(batch_size, "batch_size")
        check_int(num_inference_steps, "num_inference_steps")
        if isinstance(generator, list):
            if len(generator) != batch_size:
                raise ValueError(f"a list of generators needs one per video: batch_size={batch_size}, got {len(generator)}")
            for index, one in enumerate(generator):
                check_generator(one, f"generator[{index}]")
        else:
            check_generator(generator)
        eta = check_real(eta, "eta", low=0.0)
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"output_type must be one of {OUTPUT_TYPES}, got {output_type!r}")
        if callback_on_step_end is not None and not callable(callback_on_step_end):
            raise TypeError(f"callback_on_step_end must be callable, got {type(callback_on_step_end).__name__}")
        unknown = set(callback_on_step_end_tensor_inputs) - set(self._callback_tensor_inputs)
        if unknown:
            raise ValueError(f"callback_on_step_end_tensor_inputs may name {self._callback_tensor_inputs}, got {sorted(unknown)}")
        self._check_scheduler()
        accepted = inspect.signature(self.scheduler.step).parameters
        step_options = {name: value for name, value in (("eta", eta), ("generator", generator)) if name in accepted}
        model = self.model
        with self.progress_bar(total=model.num_chains * num_inference_steps) as progress:

            def on_step(step, timestep, latents):
                progress.update()
                if callback_on_step_end is None:
                    return latents
                inputs = {name: latents for name in callback_on_step_end_tensor_inputs}
                returned = callback_on_step_end(self, step, timestep, inputs) or {}
                return returned.get("latents", latents)

            videos = model.sample_batch(batch_size, self.scheduler, num_inference_steps, generator, step_options, on_step)
        videos = self._convert(videos, output_type)
        return PseudoVideoPipelineOutput(videos=videos) if return_dict else (videos,)

    def save_pretrained(self, save_directory, *args, **kwargs):
        """diffusers' ``save_pretrained``, plus the module file through which the generic
        ``DiffusionPipeline.from_pretrained(folder, trust_remote_code=True)`` finds this class
        (diffusers' convention for pipelines defined outside diffusers).

        :param save_directory: the folder written (``model/``, ``scheduler/``, ``model_index.json``).
        :param args: further arguments of diffusers' ``save_pretrained``.
        :param kwargs: further keyword arguments of diffusers' ``save_pretrained``.
        """
        super().save_pretrained(save_directory, *args, **kwargs)
        folder = Path(save_directory)
        index = json.loads((folder / "model_index.json").read_text())
        index["_class_name"] = [LOADER_MODULE, type(self).__name__]
        (folder / "model_index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        (folder / f"{LOADER_MODULE}.py").write_text(
            "# Written by pseudovideo's PseudoVideoPipeline.save_pretrained: the pipeline class, for\n"
            "# DiffusionPipeline.from_pretrained(folder, trust_remote_code=True). Without this file:\n"
            "# pseudovideo.pipelines.PseudoVideoPipeline.from_pretrained(folder).\n"
            f"from pseudovideo.pipelines import {type(self).__name__}  # noqa: F401\n"
        )

    @classmethod
    def load_config(cls, *args, **kwargs):
        """diffusers' ``load_config``; a folder of :meth:`save_pretrained` loads without running its module file,
        as this class is already imported (the parameters: diffusers' ``ConfigMixin.load_config``).

        :param args: diffusers' ``load_config`` arguments.
        :param kwargs: diffusers' ``load_config`` keyword arguments.
        """
        loaded = super().load_config(*args, **kwargs)
        config = loaded[0] if isinstance(loaded, tuple) else loaded
        if config.get("_class_name") == [LOADER_MODULE, cls.__name__]:
            config["_class_name"] = cls.__name__
        return loaded

    def _check_scheduler(self):
        trained, sampler = self.model.scheduler, self.scheduler
        if sampler.config.get("num_train_timesteps") != trained.config.num_train_timesteps:
            raise ValueError(
                f"the scheduler has num_train_timesteps={sampler.config.get('num_train_timesteps')}, the "
                f"model was trained with {trained.config.num_train_timesteps}: build the scheduler with "
                "SchedulerClass.from_config(model.scheduler.config)"
            )
        alphas = getattr(sampler, "alphas_cumprod", None)
        if alphas is None:
            raise ValueError(
                f"{type(sampler).__name__} has no alphas_cumprod: it samples its own noise schedule, not the model's; "
                f"use one of the schedulers of pseudovideo.pipelines.SCHEDULERS"
            )
        if not torch.allclose(alphas.double().cpu(), trained.alphas_cumprod.double(), rtol=1e-5):
            raise ValueError(
                "the scheduler's noise schedule (alphas_cumprod) differs from the one the model was "
                "trained with: build it with SchedulerClass.from_config(model.scheduler.config)"
            )
        reason = self._unusable(sampler, trained)
        if reason:
            raise ValueError(f"{type(sampler).__name__} cannot drive this model's noise schedule: {reason}")
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
    def _unusable(sampler, trained) -> str:
        """Why ``sampler`` cannot drive ``trained``'s schedule (``""``: it can; the module docstring)."""
        abar = trained.alphas_cumprod.double()
        sigma_max = float(((1 - abar[-1]) / abar[-1]).sqrt())
        name = type(sampler).__name__
        if name in CONSISTENCY_SCHEDULERS:
            return "it samples consistency-distilled models (one jump to the clean frame per step), not a DDPM"
        if sampler.config.get("use_flow_sigmas") or sampler.config.get("use_beta_sigmas"):
            return (
                "its flow / beta-distributed noise levels give frames of the wrong scale (measured: standard deviation 0.02-0.6 for 0.75)"
            )
        spaced = [option for option in ("use_karras_sigmas", "use_exponential_sigmas") if sampler.config.get(option)]
        if sigma_max > SIGMA_MAX_LIMIT and (spaced or name in SECOND_ORDER_SCHEDULERS):
            what = f"{spaced[0]}=True" if spaced else "its trapezoidal second-order step"
            return (
                f"the schedule's largest noise level sigma_max = sqrt((1 - abar_T) / abar_T) = {sigma_max:.3g} exceeds "
                f"{SIGMA_MAX_LIMIT:g}, and {what} cannot cross it (diffusers raises an IndexError or returns frames "
                "of the wrong scale); use DDIMScheduler, DPMSolverMultistepScheduler or another scheduler of "
                "pseudovideo.pipelines.SCHEDULERS without that option, or train with beta_schedule='linear'"
            )
        return ""

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
