"""VQ tokenizers and token priors on pseudo videos (thesis §5.3, Table 5.2), CPU-sized.

``python -m experiments.pseudovideo.tokens --dataset fashion_mnist --model tokenizer,ar,masked
--frames 1,8,18 [--augmentation blur] --seeds S --out DIR [--quick]``

For each frame count ``T`` a tokenizer is trained (``T = 1``: the image VQ-VAE with 4x4 patches;
``T > 1``: C-ViViT with 2x4x4 tubelets on pseudo videos from ``--augmentation``: blur, the default, with
rate 0.05 for ``T <= 8`` and 0.01 above, as in §5.3; any other builder of
:data:`pseudovideo.augment.METHODS` with its default parameters, e.g. the Gaussian-noise ``markov_high``
that §5.3.2 reports failing with VQ tokenizers; each seed draws one fixed set of noisy videos), then
the two priors are fit to its tokens of the training images. All
tokenizers share width, total depth (image: ``--layers`` spatial layers; video: half spatial, half
causal temporal), codebook, optimiser and number of steps; all priors share one architecture and
budget. Images are average-pooled by ``--downsample`` (28 -> 14 pixels) and padded to a multiple of 4.
Training goes through ``accelerate`` (data-parallel under ``accelerate launch``/``torchrun``, the main
process evaluating and writing); ``--ema-decay`` ends each model at diffusers' ``EMAModel`` average.

Writes ``DIR/results.csv`` (``dataset,model,frames,augmentation,seed,psnr,fid,is,train_s`` then
``params,perplexity,classifier_accuracy``), PNG grids, and prints the table. Metrics use the last frame, cropped back to
the unpadded size, in ``[0, 1]``, against held-out images:

* ``tokenizer``: reconstruction of held-out images (or their pseudo videos): PSNR, FID and IS;
* ``ar``/``masked``: decoded samples of the priors: FID and IS (``psnr`` empty);
* FID/IS use the cached dataset classifier's features/logits
  (``pseudovideo.metrics.default_classifier``), not InceptionV3;
* ``train_s``: training seconds of that model alone; ``params``: its parameter count;
  ``perplexity``: codebook usage of the held-out tokens (tokenizer) or of the sampled tokens (priors).
"""

from __future__ import annotations

import argparse
import csv
import math
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from probseq._optional import require
from pseudovideo.augment import METHODS, make_pseudo_video
from pseudovideo.metrics import PenultimateFeatures, frechet_distance, inception_score, psnr
from pseudovideo.models.prior import AutoregressiveTokenPrior, MaskedTokenPrior
from pseudovideo.models.quantizer import codebook_perplexity
from pseudovideo.models.tokenizer import ImageTokenizer, VideoTokenizer
from pseudovideo.plots import save_image_grid, save_video_rows
from pseudovideo.training import train as accelerated_train

from . import add_ema_argument, add_seed_arguments, announce_processes, seed_range
from .data import DATASETS, SUBSTITUTES
from .diffusion import experiment_images, to_image_space

COLUMNS = [
    "dataset",
    "model",
    "frames",
    "augmentation",
    "seed",
    "psnr",
    "fid",
    "is",
    "train_s",
    "params",
    "perplexity",
    "classifier_accuracy",
]
MODELS = ("tokenizer", "ar", "masked")
QUICK = {
    "train_images": 64,
    "tokenizer_steps": 2,
    "prior_steps": 2,
    "samples": 16,
    "batch_size": 4,
    "dim": 16,
    "prior_dim": 16,
    "codebook_size": 32,
    "masked_steps": 2,
}


def parse_arguments(argv=None) -> argparse.Namespace:
    """The command line of the runner (module docstring), with ``--quick`` applied and the lists parsed.

    :param argv: the command-line arguments; ``None`` (the default): ``sys.argv[1:]``.
    """
    parser = argparse.ArgumentParser(description="VQ tokenizers and token priors on pseudo videos (thesis §5.3)")
    parser.add_argument(
        "--dataset",
        choices=DATASETS,
        default="mnist",
        help="mnist and digits come with `make test`; fashion_mnist needs the Debian package",
    )
    parser.add_argument("--model", default="tokenizer,ar,masked", help=f"comma-separated, from {MODELS}")
    parser.add_argument("--frames", default="1,8,18", help="comma-separated frame counts; 1 = image models")
    parser.add_argument("--augmentation", choices=METHODS, default="blur", help="the pseudo-video builder of the video models")
    add_seed_arguments(parser)
    add_ema_argument(parser)
    parser.add_argument("--out", required=True)
    parser.add_argument("--quick", action="store_true", help="a seconds-long smoke run (tiny everything)")
    parser.add_argument("--train-images", type=int, default=5000)
    parser.add_argument("--samples", type=int, default=300, help="held-out images and generated samples per model")
    parser.add_argument("--downsample", type=int, default=2, help="average-pool factor (2: 28x28 -> 14x14)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate, cosine decay to 0")
    parser.add_argument("--tokenizer-steps", type=int, default=400)
    parser.add_argument("--dim", type=int, default=48, help="tokenizer Transformer width")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=4, help="tokenizer encoder (and decoder) depth")
    parser.add_argument("--code-dim", type=int, default=16)
    parser.add_argument("--codebook-size", type=int, default=1024)
    parser.add_argument(
        "--beta",
        type=float,
        default=0.25,
        help="commitment weight beta of thesis eq. (5.6), the term beta ||f(x) - sg(e_k)||² of the VQ-VAE loss (van den Oord et al. 2017)",
    )
    parser.add_argument("--prior-steps", type=int, default=400)
    parser.add_argument("--prior-dim", type=int, default=48)
    parser.add_argument("--prior-layers", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of both priors")
    parser.add_argument("--masked-steps", type=int, default=8, help="decoding rounds of the masked prior")
    parser.add_argument(
        "--choice-temperature", type=float, default=4.5, help="Gumbel noise on the masked prior's confidences (MaskGIT; 0 = greedy)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="train on the CPU (data-parallel over gloo when launched on several processes) even where a GPU is available",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument("--classifier-cache", default=None, help="folder of the cached metric classifier")
    args = parser.parse_args(argv)
    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, value)
    args.model = args.model.split(",")
    unknown = set(args.model) - set(MODELS)
    if unknown:
        parser.error(f"--model must name models from {MODELS}, got {sorted(unknown)}")
    try:
        args.frames = [int(f) for f in args.frames.split(",")]
    except ValueError:
        parser.error(f"--frames must be comma-separated integers, got {args.frames!r}")
    if any(f < 1 or (f > 1 and f % 2) for f in args.frames):
        parser.error(f"--frames must be 1 or even (2-frame tubelets), got {args.frames}")
    if args.layers < 2 or args.layers % 2:
        parser.error(f"--layers must be even and >= 2 (video: half spatial, half temporal), got {args.layers}")
    if args.downsample < 1 or args.samples < 2:
        parser.error("--downsample must be >= 1 and --samples >= 2")
    args.seed_range = seed_range(args, parser)
    args.cpu = args.cpu or not torch.cuda.is_available()  # accelerate forms a CPU process group only when told
    return args


def pseudo_videos(images: torch.Tensor, frames: int, augmentation: str = "blur", generator=None) -> torch.Tensor:
    """``(N, C, H, W)`` -> pseudo videos ``(N, T, C, H, W)`` (blur: rate 0.05 up to 8 frames, else 0.01).

    :param images: the images in model space, ``(N, C, H, W)``.
    :param frames: the frames per video :math:`T` (1: the images themselves).
    :param augmentation: the builder, one of :data:`~pseudovideo.augment.METHODS` (default ``"blur"``).
    :param generator: the random generator of the noisy builders' noise.
    """
    if frames == 1:
        return images
    params = {"rate": 0.05 if frames <= 8 else 0.01} if augmentation == "blur" else {}
    return make_pseudo_video(images, frames, augmentation, generator=generator, **params)


def build_tokenizer(args, frames: int, image_size: int):
    """The image VQ-VAE (``frames == 1``) or the C-ViViT video tokenizer, sized by the command line.

    :param args: the parsed command line (``dim``, ``heads``, ``layers``, ``code_dim``, ``codebook_size``, ``beta``).
    :param frames: the frames per video :math:`T`.
    :param image_size: the side of the (padded) model-space images, in pixels.
    """
    shared = dict(dim=args.dim, heads=args.heads, code_dim=args.code_dim, codebook_size=args.codebook_size, beta=args.beta)
    if frames == 1:
        return ImageTokenizer(image_size, spatial_layers=args.layers, **shared)
    return VideoTokenizer(frames, image_size, spatial_layers=args.layers // 2, temporal_layers=args.layers // 2, **shared)


def last_frame(videos: torch.Tensor, frames: int) -> torch.Tensor:
    """The last frame of each video ``(N, T, C, H, W)``, or the images themselves for ``frames == 1``.

    :param videos: videos ``(N, T, C, H, W)``, or images ``(N, C, H, W)`` for one frame.
    :param frames: the frames per video :math:`T`.
    """
    return videos if frames == 1 else videos[:, -1]


def optimise(model, next_batch, batch_loss, steps, args, description, generator, seed, loss="forward"):
    """Adam with cosine learning-rate decay (thesis App. D.2; Chen et al. (2025), pseudo videos) for ``steps`` steps through accelerate
    (:func:`pseudovideo.training.train`, data-parallel when launched on several
    processes); returns the seconds taken and whether this is the main process.

    With ``--ema-decay`` the model ends with diffusers' ``EMAModel`` average of its weights.

    :param model: the tokenizer or prior to train.
    :param next_batch: ``next_batch(generator)`` returns one batch.
    :param batch_loss: ``batch_loss(wrapped, batch, generator)`` returns a batch's loss.
    :param steps: the optimiser steps (also the length of the cosine schedule).
    :param args: the parsed command line (``lr``, ``ema_decay``, ``cpu``, ``quiet``).
    :param description: the progress bar's label.
    :param generator: the data generator of the main process, whose stream the training continues.
    :param seed: the seed of the other processes' generators.
    :param loss: the name of the model's method that returns the loss (default ``"forward"``; ``"loss"`` for the priors).
    """
    start = time.perf_counter()
    result = accelerated_train(
        model,
        next_batch,
        steps,
        optimizer_factory=lambda parameters: torch.optim.Adam(parameters, lr=args.lr),
        scheduler_factory=lambda optimizer: torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps),
        loss=loss,
        batch_loss=batch_loss,
        generator=generator,
        ema_decay=args.ema_decay,
        seed=seed,
        cpu=args.cpu,
        progress=not args.quiet,
        description=description,
    )
    if result.ema is not None:
        result.ema.copy_to(model.parameters())
    return time.perf_counter() - start, result.accelerator.is_main_process


def count_parameters(model) -> int:
    """The number of entries of ``model``'s parameters.

    :param model: the model.
    """
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def in_batches(function, inputs, size=256):
    """``function`` applied to chunks of ``inputs`` along the first dimension, the results concatenated (no gradients).

    :param function: the function of one chunk, returning a tensor.
    :param inputs: the inputs, split along dimension 0.
    :param size: the chunk size (default 256).
    """
    return torch.cat([function(chunk) for chunk in inputs.split(size)])


def run_frames(args, train, held_out, size, frames, seed, classifier, out):
    """Train the tokenizer and the requested priors for one frame count; the CSV rows and PNGs.

    :param args: the parsed command line (:func:`parse_arguments`).
    :param train: the training images in model space, ``(N, C, H, W)``.
    :param held_out: the held-out images in model space, ``(N', C, H, W)``.
    :param size: the image side after downsampling, in pixels.
    :param frames: the frames per video :math:`T` (1: the image models).
    :param seed: the seed of the models' initialisation and data.
    :param classifier: the metric classifier (:func:`~pseudovideo.metrics.default_classifier`).
    :param out: the output folder (:class:`~pathlib.Path`).
    """
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    augmentation = "none" if frames == 1 else args.augmentation
    noise = torch.Generator().manual_seed(seed)  # the noisy builders' own stream: blur leaves `generator` as it was
    train_videos, held_out_videos = (pseudo_videos(images, frames, augmentation, noise) for images in (train, held_out))
    tokenizer = build_tokenizer(args, frames, train.shape[-1])

    def tokenizer_batch(rng):
        return train_videos[torch.randint(0, len(train), (args.batch_size,), generator=rng)]

    train_s, main_process = optimise(
        tokenizer,
        tokenizer_batch,
        lambda module, batch, rng: module(batch).loss,
        args.tokenizer_steps,
        args,
        f"{frames}-frame tokenizer",
        generator,
        seed,
    )
    base = {
        "dataset": args.dataset,
        "frames": frames,
        "augmentation": augmentation,
        "seed": seed,
        "classifier_accuracy": classifier.test_accuracy,
    }
    rows = []
    name = f"{frames}frames_seed{seed}"
    real = to_image_space(held_out, size)
    feature = PenultimateFeatures(classifier)
    if "tokenizer" in args.model and main_process:
        tokens = in_batches(tokenizer.encode, held_out_videos)
        reconstruction = to_image_space(last_frame(in_batches(tokenizer.decode, tokens), frames), size)
        rows.append(
            {
                **base,
                "model": "tokenizer",
                "psnr": psnr(reconstruction, real),
                "fid": frechet_distance(real, reconstruction, feature),
                "is": inception_score(reconstruction, classifier, splits=min(10, len(reconstruction) // 2)),
                "train_s": round(train_s, 1),
                "params": count_parameters(tokenizer),
                "perplexity": float(codebook_perplexity(tokens, args.codebook_size)),
            }
        )
        save_image_grid(torch.cat([real[:16], reconstruction[:16]]), out / f"reconstructions_{name}.png")
    priors = [m for m in args.model if m != "tokenizer"]
    if priors:
        train_tokens = in_batches(tokenizer.encode, train_videos)
    for model_name in priors:
        prior_class = AutoregressiveTokenPrior if model_name == "ar" else MaskedTokenPrior
        prior = prior_class(args.codebook_size, tokenizer.token_shape, dim=args.prior_dim, heads=args.heads, layers=args.prior_layers)

        def prior_batch(rng):
            return train_tokens[torch.randint(0, len(train_tokens), (args.batch_size,), generator=rng)]

        def prior_loss(module, batch, rng, autoregressive=model_name == "ar"):  # module(...) = prior.loss(...)
            return module(batch) if autoregressive else module(batch, rng)

        prior_s, _ = optimise(
            prior, prior_batch, prior_loss, args.prior_steps, args, f"{frames}-frame {model_name} prior", generator, seed, loss="loss"
        )
        if not main_process:  # a data-parallel run: the main process evaluates
            continue
        if model_name == "ar":
            tokens = prior.sample(args.samples, args.temperature, generator, progress=not args.quiet)
        else:
            tokens = prior.sample(args.samples, args.masked_steps, args.temperature, generator, args.choice_temperature)
        videos = in_batches(tokenizer.decode, tokens)
        samples = to_image_space(last_frame(videos, frames), size)
        rows.append(
            {
                **base,
                "model": model_name,
                "psnr": "",
                "fid": frechet_distance(real, samples, feature),
                "is": inception_score(samples, classifier, splits=min(10, len(samples) // 2)),
                "train_s": round(prior_s, 1),
                "params": count_parameters(prior),
                "perplexity": float(codebook_perplexity(tokens, args.codebook_size)),
            }
        )
        save_image_grid(samples[:32], out / f"samples_{model_name}_{name}.png")
        if frames > 1:
            save_video_rows(
                {f"sample {i}": to_image_space(videos[i], size) for i in range(4)}, out / f"samples_{model_name}_{name}_videos.png"
            )
    return rows, (reconstruction[:8] if "tokenizer" in args.model and main_process else None)


def main(argv=None) -> list[dict]:
    """The command line (module docstring): train and evaluate every model, write the CSV and figures; returns the rows.

    :param argv: the command-line arguments; ``None`` (the default): ``sys.argv[1:]``.
    """
    args = parse_arguments(argv)
    print(f"data: {SUBSTITUTES[args.dataset]}", flush=True)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    processes = require("accelerate", "video", "experiments.pseudovideo.tokens").PartialState(cpu=args.cpu)
    announce_processes(processes)
    with processes.main_process_first():  # the main process trains and caches the metric classifier
        train, held_out, size, classifier = experiment_images(args)
    main_process = processes.is_main_process
    for frames in (f for f in args.frames if f > 1 and main_process):
        save_video_rows(
            {f"{frames}-frame {args.augmentation}": to_image_space(pseudo_videos(train[:1], frames, args.augmentation)[0], size)},
            out / f"pseudo_videos_{frames}frames.png",
        )
    rows = []
    with open(out / "results.csv", "w", newline="") if main_process else nullcontext() as handle:
        writer = None if handle is None else csv.DictWriter(handle, fieldnames=COLUMNS)
        if writer is not None:
            writer.writeheader()
        for seed in args.seed_range:
            reconstructions = {"ground truth": to_image_space(held_out[:8], size)}
            for frames in args.frames:
                frame_rows, reconstruction = run_frames(args, train, held_out, size, frames, seed, classifier, out)
                for row in frame_rows:
                    if writer is None or handle is None:  # only the main process gets results, and it has the file
                        raise RuntimeError("a process without the results file got a result to write")
                    writer.writerow(row)
                    handle.flush()
                    rows.append(row)
                    print(format_row(row), flush=True)
                if reconstruction is not None:
                    reconstructions[f"{frames}-frame"] = reconstruction
            if len(reconstructions) > 1 and main_process:
                save_video_rows(reconstructions, out / f"reconstructions_seed{seed}.png")
    return rows


def format_row(row: dict) -> str:
    """One printed line of a result row.

    :param row: a result row (columns ``COLUMNS``).
    """
    psnr_text = f"{row['psnr']:.2f}" if row["psnr"] != "" and not math.isnan(row["psnr"]) else "-"
    return (
        f"{row['model']:<10}{row['frames']:>3} {row['augmentation']:<5} seed {row['seed']}  PSNR {psnr_text:>6}  "
        f"FID {row['fid']:8.3f}  IS {row['is']:6.3f}  train {row['train_s']:7.1f}s  params {row['params']:>8}  "
        f"perplexity {row['perplexity']:7.1f}"
    )


if __name__ == "__main__":
    main()
