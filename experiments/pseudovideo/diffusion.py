"""Image DDPM vs autoregressive video diffusion on pseudo videos (thesis Table 5.3), CPU-sized.

``python -m experiments.pseudovideo.diffusion --dataset fashion_mnist --frames 1,4,8
--augmentation markov_first,markov_high,blur --seeds S --out DIR [--quick]``

Every model shares one UNet architecture, optimiser and number of training steps; the 1-frame model
is the image DDPM (augmentation ``none``). Training goes through ``accelerate``
(:mod:`pseudovideo.training`): ``torchrun --standalone --nproc-per-node N -m
experiments.pseudovideo.diffusion ...`` or ``accelerate launch --multi_gpu --num_processes N -m ...`` (also on
CPUs: accelerate's ``--cpu`` launches one process) trains data-parallel (each process draws ``--batch-size``
videos per micro-batch), with ``--accumulation``, ``--mixed-precision``, ``--ema-decay`` and
``--checkpoint-every``/``--resume``; the main process evaluates and writes. Context windows: ``C = T // 2`` (2 for 4 frames, 4 for 8).
Writes ``DIR/results.csv`` (``dataset,model,frames,augmentation,seed,fid,is,psnr,out_of_range,train_s,classifier_accuracy,train_timesteps``,
``classifier_accuracy`` the metric classifier's held-out accuracy), sample
grids and generated videos (``DIR/samples_*.png``) and the training pseudo videos
(``DIR/pseudo_videos_*.png``), and prints the table. Metrics use the last frame of each sample, in
``[0, 1]`` (clipped for display and metrics only: the frames fed back as context are the sampler's
output; ``--clip-sample`` chooses whether the sampler itself clips, by default only for the image
model and blur, whose training frames lie in ``[-1, 1]``), against held-out images:

* ``fid``/``is``: FID and Inception Score with the cached dataset classifier's features/logits
  (``pseudovideo.metrics.default_classifier``), not InceptionV3;
* ``psnr``: PSNR of ``z_T`` sampled given the true ``C`` previous frames of held-out pseudo videos
  (the prediction of Theorem 5.4.1); empty for the 1-frame model, which has no context;
* ``out_of_range``: the fraction of generated last-frame pixels outside ``[-1, 1]``, which the
  metrics see clipped (printed as a percentage).

The UNet predicts ``v`` by default (``--prediction-type``): on the digits, 4-frame Markov pseudo
videos and 1,500 steps, v-prediction gave FID 17-24 against epsilon's 48-63, and 16-20 % of
last-frame pixels outside ``[-1, 1]`` against 22-31 %.
"""

from __future__ import annotations

import argparse
import csv
import math
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F

from probseq._optional import require
from pseudovideo.augment import METHODS, make_pseudo_video
from pseudovideo.metrics import PenultimateFeatures, default_classifier, frechet_distance, inception_score, psnr
from pseudovideo.models.diffusion import PREDICTION_TYPES, AutoregressiveVideoDiffusion, default_clip_sample
from pseudovideo.plots import save_image_grid, save_video_rows
from pseudovideo.scaling import to_model_range
from pseudovideo.training import MIXED_PRECISION, ema_weights
from pseudovideo.training import train as accelerated_train

from . import add_ema_argument, add_seed_arguments, announce_processes, seed_range
from .data import DATASETS, SUBSTITUTES, classifier_data, load_images

COLUMNS = [
    "dataset",
    "model",
    "frames",
    "augmentation",
    "seed",
    "fid",
    "is",
    "psnr",
    "out_of_range",
    "train_s",
    "classifier_accuracy",
    "train_timesteps",
]
QUICK = {"train_images": 64, "steps": 2, "samples": 16, "sampling_steps": 2, "batch_size": 8, "channels": "8,16"}


def parse_arguments(argv=None) -> argparse.Namespace:
    """The command line of the runner (module docstring), with ``--quick`` applied and the lists parsed.

    :param argv: the command-line arguments; ``None`` (the default): ``sys.argv[1:]``.
    """
    parser = argparse.ArgumentParser(description="image DDPM vs video diffusion on pseudo videos (thesis §5.4)")
    parser.add_argument(
        "--dataset",
        choices=DATASETS,
        default="mnist",
        help="mnist and digits come with `make test`; fashion_mnist needs the Debian package",
    )
    parser.add_argument("--frames", default="1,4,8", help="comma-separated frame counts; 1 = image DDPM")
    parser.add_argument(
        "--augmentation", default="markov_first,markov_high,blur", help=f"comma-separated builders for the video models, from {METHODS}"
    )
    add_seed_arguments(parser)
    parser.add_argument("--out", required=True)
    parser.add_argument("--quick", action="store_true", help="a seconds-long smoke run (tiny everything)")
    parser.add_argument("--train-images", type=int, default=5000)
    parser.add_argument("--steps", type=int, default=1000, help="training steps per model")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--samples", type=int, default=300, help="generated (and held-out) images per model")
    parser.add_argument("--sampling-steps", type=int, default=20, help="DDIM steps per generated frame")
    parser.add_argument(
        "--train-timesteps",
        type=int,
        default=1000,
        help="diffusion timesteps of training (the thesis's Table 5.4 gives its 1-frame model 4,000)",
    )
    parser.add_argument("--downsample", type=int, default=2, help="average-pool factor (2: 28x28 -> 14x14)")
    parser.add_argument("--channels", default="16,32,32", help="UNet block widths (one per resolution)")
    parser.add_argument(
        "--clip-sample",
        choices=("auto", "on", "off"),
        default="auto",
        help="clip predicted frames to [-1, 1] while sampling; auto: only for the image model "
        "and blur, whose training frames lie in [-1, 1] (the results recorded before this "
        "option existed were sampled with clipping on for every model)",
    )
    parser.add_argument(
        "--prediction-type",
        choices=PREDICTION_TYPES,
        default="v_prediction",
        help="what the UNet predicts (default v_prediction: lower FID and fewer last-frame pixels outside [-1, 1] "
        "than epsilon, the thesis's eq. (5.2), at these training budgets)",
    )
    add_ema_argument(parser)
    parser.add_argument("--accumulation", type=int, default=1, help="micro-batches per optimiser step")
    parser.add_argument(
        "--mixed-precision",
        choices=MIXED_PRECISION,
        default="no",
        help="accelerate's mixed precision (bf16 on recent CPUs and GPUs, fp16 on GPUs)",
    )
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        help="save a checkpoint (weights, optimiser, EMA, data generator) every N steps to "
        "DIR/checkpoint_<frames>frame_<augmentation>_seed<seed>/",
    )
    parser.add_argument("--resume", action="store_true", help="continue each model from its checkpoint, if any")
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="train on the CPU even where a GPU is available (without a GPU: always; several processes then train data-parallel over gloo)",
    )
    parser.add_argument(
        "--save-models",
        action="store_true",
        help="save each trained model (its EMA weights with --ema-decay) with save_pretrained to "
        "DIR/model_<frames>frame_<augmentation>_seed<seed>/ (reload: "
        "AutoregressiveVideoDiffusion.from_pretrained)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument("--classifier-cache", default=None, help="folder of the cached metric classifier")
    args = parser.parse_args(argv)
    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, value)
    args.frames = [int(f) for f in args.frames.split(",")]
    args.channels = tuple(int(c) for c in args.channels.split(","))
    args.augmentation = args.augmentation.split(",")
    if any(f < 1 for f in args.frames):
        parser.error(f"--frames must be positive integers, got {args.frames}")
    unknown = set(args.augmentation) - set(METHODS)
    if unknown:
        parser.error(f"--augmentation must name builders from {METHODS}, got {sorted(unknown)}")
    if args.downsample < 1:
        parser.error("--downsample must be >= 1")
    args.seed_range = seed_range(args, parser)
    return args


def to_model_space(images: torch.Tensor, downsample: int) -> torch.Tensor:
    """``[0, 1]`` images -> average-pooled, ``[-1, 1]``, padded with ``-1`` to a multiple of 4 pixels.

    :param images: the images, ``(N, C, H, W)`` in ``[0, 1]``.
    :param downsample: the average-pooling factor, a positive int (1: none).
    """
    pooled = F.avg_pool2d(images, downsample) if downsample > 1 else images
    size = pooled.shape[-1]
    pad = (-size) % 4
    return F.pad(to_model_range(pooled), (pad // 2, pad - pad // 2, pad // 2, pad - pad // 2), value=-1.0)


def central_crop(frames: torch.Tensor, size: int) -> torch.Tensor:
    """The central ``size x size`` pixels of ``frames`` (``(..., H', W')``): the image without its padding.

    :param frames: frames, ``(..., H', W')``.
    :param size: the side of the central crop, in pixels (the images' side after downsampling).
    """
    start = (frames.shape[-1] - size) // 2
    return frames[..., start : start + size, start : start + size]


def to_image_space(frames: torch.Tensor, size: int) -> torch.Tensor:
    """Model-space frames -> the central ``size x size`` crop in ``[0, 1]`` (clipped, as DDPM samplers do).

    :param frames: model-space frames, ``(..., H', W')`` in about ``[-1, 1]``.
    :param size: the side of the central crop, in pixels (the images' side after downsampling).
    """
    return ((central_crop(frames, size) + 1) / 2).clamp(0, 1)


def build_videos(images, frames, augmentation, generator):
    """Training videos ``(N, frames, C, H, W)`` whose last frame is ``images`` (a single frame for ``frames == 1``).

    :param images: the images in model space, ``(N, C, H, W)``.
    :param frames: the frames per video, a positive int.
    :param augmentation: the pseudo-video builder, one of :data:`~pseudovideo.augment.METHODS` (unused for one frame).
    :param generator: the random generator of the noisy builders.
    """
    return images[:, None] if frames == 1 else make_pseudo_video(images, frames, augmentation, generator=generator)


def run_model(args, train, held_out, size, frames, augmentation, seed, classifier, out):
    """Train one model through accelerate (data-parallel under ``accelerate launch``/``torchrun``) and, on
    the main process, evaluate it; ``None`` on the other processes.

    :param args: the parsed command line (:func:`parse_arguments`).
    :param train: the training images in model space, ``(N, C, H, W)``.
    :param held_out: the held-out images in model space, ``(N', C, H, W)``.
    :param size: the image side after downsampling, in pixels.
    :param frames: the frames per video (1: the image DDPM).
    :param augmentation: the pseudo-video builder (``"none"`` for the image model).
    :param seed: the seed of the model's initialisation and data.
    :param classifier: the metric classifier (:func:`~pseudovideo.metrics.default_classifier`).
    :param out: the output folder (:class:`~pathlib.Path`).
    """
    torch.manual_seed(seed)
    clip = default_clip_sample(augmentation) if args.clip_sample == "auto" else args.clip_sample == "on"
    model = AutoregressiveVideoDiffusion(
        frames,
        frames // 2,
        channels=train.shape[1],
        image_size=train.shape[-1],
        block_out_channels=args.channels,
        clip_sample=clip,
        prediction_type=args.prediction_type,
        num_train_timesteps=args.train_timesteps,
    )
    name = f"{frames}frame_{augmentation}_seed{seed}"

    def next_batch(generator):
        batch = train[torch.randint(0, len(train), (args.batch_size,), generator=generator)]
        return build_videos(batch, frames, augmentation, generator)

    start = time.perf_counter()
    model, ema, accelerator, generator = accelerated_train(
        model,
        next_batch,
        args.steps,
        optimizer_factory=lambda parameters: torch.optim.Adam(parameters, lr=args.lr),
        accumulation=args.accumulation,
        mixed_precision=args.mixed_precision,
        ema_decay=args.ema_decay,
        checkpoint_dir=out / f"checkpoint_{name}",
        checkpoint_every=args.checkpoint_every,
        resume=args.resume,
        seed=seed,
        cpu=use_cpu(args),
        progress=not args.quiet,
        description=f"{frames}-frame {augmentation}",
    )
    train_s = time.perf_counter() - start
    if not accelerator.is_main_process:
        return None
    model.eval()
    with ema_weights(model, ema):
        return evaluate(args, model, held_out, size, frames, augmentation, seed, classifier, out, generator, train_s)


def evaluate(args, model, held_out, size, frames, augmentation, seed, classifier, out, generator, train_s):
    """The result row of a trained model (FID, IS, PSNR; module docstring); also writes its sample figures.

    :param args: the parsed command line (:func:`parse_arguments`).
    :param model: the trained model, in evaluation mode.
    :param held_out: the held-out images in model space, ``(N', C, H, W)``.
    :param size: the image side after downsampling, in pixels.
    :param frames: the frames per video (1: the image DDPM).
    :param augmentation: the pseudo-video builder (``"none"`` for the image model).
    :param seed: the model's seed (for the file names and the row).
    :param classifier: the metric classifier (:func:`~pseudovideo.metrics.default_classifier`).
    :param out: the output folder (:class:`~pathlib.Path`).
    :param generator: the random generator of the sampling and of the held-out pseudo videos.
    :param train_s: the training time in seconds.
    """
    videos = model.sample(args.samples, args.sampling_steps, generator)
    last = to_image_space(videos[:, -1], size)
    real = to_image_space(held_out[: args.samples], size)
    row = {
        "fid": frechet_distance(real, last, PenultimateFeatures(classifier)),
        "is": inception_score(last, classifier, splits=min(10, len(last) // 2)),
        "psnr": "",
        "out_of_range": float((central_crop(videos[:, -1], size).abs() > 1).double().mean()),
    }
    if frames > 1:
        truth = build_videos(held_out[: args.samples], frames, augmentation, generator)
        predicted = model.sample_next_frame(truth[:, -1 - model.context : -1], args.sampling_steps, generator)
        row["psnr"] = float(psnr(to_image_space(predicted, size), to_image_space(truth[:, -1], size)))
    name = f"{frames}frame_{augmentation}_seed{seed}"
    if args.save_models:
        model.save_pretrained(out / f"model_{name}")
    save_image_grid(last[:32], out / f"samples_{name}.png")
    if frames > 1:
        save_video_rows({f"sample {i}": to_image_space(videos[i], size) for i in range(4)}, out / f"samples_{name}_videos.png")
    model_name = "image_ddpm" if frames == 1 else "video_diffusion"
    return {
        "model": model_name,
        "frames": frames,
        "augmentation": augmentation,
        "seed": seed,
        "train_s": round(train_s, 1),
        "classifier_accuracy": classifier.test_accuracy,
        "train_timesteps": args.train_timesteps,
        **row,
    }


def experiment_images(args):
    """Training and held-out images in model space, the image side after downsampling, and the
    metric classifier: the set-up shared by the pseudo-video runners.

    :param args: the parsed command line (``dataset``, ``train_images``, ``samples``, ``downsample``,
        ``classifier_cache``).
    """
    images, _ = load_images(args.dataset, limit=args.train_images + args.samples)
    model_images = to_model_space(images, args.downsample)
    classifier = default_classifier(args.dataset, args.classifier_cache, args.downsample, classifier_data(args.dataset))
    return model_images[: args.train_images], model_images[args.train_images :], images.shape[-1] // args.downsample, classifier


def main(argv=None) -> list[dict]:
    """The command line (module docstring): train and evaluate every model, write the CSV and figures; returns the rows.

    :param argv: the command-line arguments; ``None`` (the default): ``sys.argv[1:]``.
    """
    args = parse_arguments(argv)
    print(f"data: {SUBSTITUTES[args.dataset]}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    processes = require("accelerate", "video", "experiments.pseudovideo.diffusion").PartialState(cpu=use_cpu(args))
    announce_processes(processes)
    with processes.main_process_first():  # the main process trains and caches the metric classifier
        train, held_out, size, classifier = experiment_images(args)
    main_process = processes.is_main_process
    generator = torch.Generator().manual_seed(0)
    for frames in (f for f in args.frames if f > 1 and main_process):
        save_video_rows(
            {method: to_image_space(build_videos(train[:1], frames, method, generator)[0], size) for method in args.augmentation},
            out / f"pseudo_videos_{frames}frames.png",
        )
    rows = []
    with open(out / "results.csv", "w", newline="") if main_process else nullcontext() as handle:
        writer = None if handle is None else csv.DictWriter(handle, fieldnames=COLUMNS)
        if writer is not None:
            writer.writeheader()
        for seed in args.seed_range:
            for frames in args.frames:
                for augmentation in ["none"] if frames == 1 else args.augmentation:
                    result = run_model(args, train, held_out, size, frames, augmentation, seed, classifier, out)
                    if result is None:  # another process of a data-parallel run: the main one writes
                        continue
                    row = {"dataset": args.dataset, **result}
                    if writer is None or handle is None:  # only the main process gets results, and it has the file
                        raise RuntimeError("a process without the results file got a result to write")
                    writer.writerow(row)
                    handle.flush()
                    rows.append(row)
                    print(format_row(row), flush=True)
    return rows


def use_cpu(args) -> bool:
    """accelerate's ``cpu`` flag: on a machine without CUDA it must be set for processes launched by
    ``torchrun``/``accelerate launch`` to form a (gloo) data-parallel group.

    :param args: the parsed command line (its ``cpu`` flag).
    """
    return args.cpu or not torch.cuda.is_available()


def format_row(row: dict) -> str:
    """One printed line of a result row.

    :param row: a result row (columns ``COLUMNS``).
    """
    psnr_text = f"{row['psnr']:.2f}" if row["psnr"] != "" and not math.isnan(row["psnr"]) else "-"
    return (
        f"{row['model']:<16}{row['frames']:>3} {row['augmentation']:<13} seed {row['seed']}  FID {row['fid']:8.3f}  "
        f"IS {row['is']:6.3f}  PSNR {psnr_text:>6}  outside [-1, 1] {100 * row['out_of_range']:5.1f} %  train {row['train_s']:7.1f}s"
    )


if __name__ == "__main__":
    main()
