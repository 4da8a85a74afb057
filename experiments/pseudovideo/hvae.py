"""HVAE with a fixed heat-equation encoder vs a learnable encoder (thesis §5.2.1, Table 5.1; Chen et al. (2025), pseudo videos).

``python -m experiments.pseudovideo.hvae --dataset mnist --latents 18 --seeds S --out DIR [--quick]``

Both models share the decoder, latent count and training budget; digits are binarised at 0.5.
Training goes through ``accelerate`` (data-parallel under ``accelerate launch``/``torchrun``, the
main process evaluating and writing); ``--ema-decay`` samples from diffusers' ``EMAModel`` average.
Writes ``DIR/hvae_results.csv`` (``dataset,encoder,latents,seed,is,train_s,classifier_accuracy``) and a sample grid per
model; IS uses the cached dataset classifier (``pseudovideo.metrics.default_classifier``), not
InceptionV3, on the Bernoulli means of the samples.
"""

from __future__ import annotations

import argparse
import csv
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F

from probseq._optional import require
from pseudovideo.metrics import default_classifier, inception_score
from pseudovideo.models.hvae import ENCODERS, HeatHVAE
from pseudovideo.plots import save_image_grid
from pseudovideo.training import ema_weights
from pseudovideo.training import train as accelerated_train

from . import add_ema_argument, add_seed_arguments, announce_processes, seed_range
from .data import DATASETS, SUBSTITUTES, classifier_data, load_images

COLUMNS = ["dataset", "encoder", "latents", "seed", "is", "train_s", "classifier_accuracy"]
QUICK = {"train_images": 64, "steps": 2, "samples": 16, "batch_size": 8, "latents": 3, "width": 8}


def parse_arguments(argv=None) -> argparse.Namespace:
    """The command line of the runner (module docstring), with ``--quick`` applied and the lists parsed.

    :param argv: the command-line arguments; ``None`` (the default): ``sys.argv[1:]``.
    """
    parser = argparse.ArgumentParser(description="heat-encoder HVAE vs learnable-encoder HVAE (thesis §5.2.1)")
    parser.add_argument("--dataset", choices=DATASETS, default="mnist")
    parser.add_argument("--encoders", default="heat,learned")
    parser.add_argument("--latents", type=int, default=18)
    add_seed_arguments(parser)
    add_ema_argument(parser)
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="train on the CPU (data-parallel over gloo when launched on several processes) even where a GPU is available",
    )
    parser.add_argument("--out", required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--train-images", type=int, default=4000)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--width", type=int, default=16, help="channels of the conv nets")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--downsample", type=int, default=2, help="average-pool factor before binarising")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument("--classifier-cache", default=None)
    args = parser.parse_args(argv)
    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, value)
    args.encoders = args.encoders.split(",")
    if set(args.encoders) - set(ENCODERS):
        parser.error(f"--encoders must be from {ENCODERS}, got {args.encoders}")
    if args.latents < 1 or args.downsample < 1:
        parser.error("--latents and --downsample must be >= 1")
    args.seed_range = seed_range(args, parser)
    args.cpu = args.cpu or not torch.cuda.is_available()  # accelerate forms a CPU process group only when told
    return args


def main(argv=None) -> list[dict]:
    """The command line (module docstring): train and evaluate every HVAE, write the CSV and sample grids; returns the rows.

    :param argv: the command-line arguments; ``None`` (the default): ``sys.argv[1:]``.
    """
    args = parse_arguments(argv)
    print(f"data: {SUBSTITUTES[args.dataset]}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    images, _ = load_images(args.dataset, limit=args.train_images)
    pooled = F.avg_pool2d(images, args.downsample) if args.downsample > 1 else images
    binary = (pooled > 0.5).float()
    processes = require("accelerate", "video", "experiments.pseudovideo.hvae").PartialState(cpu=args.cpu)
    announce_processes(processes)
    with processes.main_process_first():  # the main process trains and caches the metric classifier
        classifier = default_classifier(args.dataset, args.classifier_cache, args.downsample, classifier_data(args.dataset))
    rows = []
    with open(out / "hvae_results.csv", "w", newline="") if processes.is_main_process else nullcontext() as handle:
        writer = None if handle is None else csv.DictWriter(handle, fieldnames=COLUMNS)
        if writer is not None:
            writer.writeheader()
        for seed in args.seed_range:
            for encoder in args.encoders:
                torch.manual_seed(seed)
                model = HeatHVAE(
                    encoder,
                    args.latents,
                    channels=binary.shape[1],
                    image_size=binary.shape[-1],
                    width=args.width,
                    max_std=binary.shape[-1] / 1.4,
                )  # Rissanen et al.: 20 px at 28x28, scaled

                def next_batch(generator):
                    return binary[torch.randint(0, len(binary), (args.batch_size,), generator=generator)]

                start = time.perf_counter()
                model, ema, accelerator, generator = accelerated_train(
                    model,
                    next_batch,
                    args.steps,
                    optimizer_factory=lambda p: torch.optim.Adam(p, lr=args.lr),
                    ema_decay=args.ema_decay,
                    seed=seed,
                    cpu=args.cpu,
                    progress=not args.quiet,
                    description=f"HVAE {encoder}",
                )
                train_s = time.perf_counter() - start
                if not accelerator.is_main_process:  # a data-parallel run: the main process evaluates
                    continue
                with ema_weights(model, ema), torch.no_grad():
                    samples = model.sample(args.samples, generator)
                    elbo_batch = binary[:256].to(accelerator.device)
                    loss = model.negative_elbo(elbo_batch, torch.Generator().manual_seed(seed))
                save_image_grid(samples[:32], out / f"hvae_samples_{encoder}_seed{seed}.png")
                row = {
                    "dataset": args.dataset,
                    "encoder": encoder,
                    "latents": args.latents,
                    "seed": seed,
                    "is": inception_score(samples, classifier, splits=min(10, len(samples) // 2)),
                    "train_s": round(train_s, 1),
                    "classifier_accuracy": classifier.test_accuracy,
                }
                if writer is None or handle is None:  # only the main process gets results, and it has the file
                    raise RuntimeError("a process without the results file got a result to write")
                writer.writerow(row)
                handle.flush()
                rows.append(row)
                print(
                    f"HVAE {encoder:<8} T={args.latents} seed {seed}  IS {row['is']:.3f}  "
                    f"-ELBO {loss.item():.1f} (256 training digits)  train {train_s:.1f}s",
                    flush=True,
                )
    return rows


if __name__ == "__main__":
    main()
