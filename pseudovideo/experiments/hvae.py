"""HVAE with a fixed heat-equation encoder vs a learnable encoder (thesis §5.2.1, Table 5.1).

``python -m pseudovideo.experiments.hvae --dataset mnist --latents 18 --seeds S --out DIR [--quick]``

Both models share the decoder, latent count and training budget; digits are binarised at 0.5.
Writes ``DIR/hvae_results.csv`` (``dataset,encoder,latents,seed,is,train_s``) and a sample grid per
model; IS uses the cached dataset classifier (``pseudovideo.metrics.default_classifier``), not
InceptionV3, on the Bernoulli means of the samples.
"""
from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from ..data import DATASETS, SUBSTITUTES, load_images
from ..metrics import default_classifier, inception_score
from ..models.hvae import ENCODERS, HeatHVAE
from ..plots import save_image_grid
from . import add_ema_argument, add_seed_arguments, ema_weights, make_ema, seed_range

COLUMNS = ["dataset", "encoder", "latents", "seed", "is", "train_s", "classifier_accuracy"]
QUICK = {"train_images": 64, "steps": 2, "samples": 16, "batch_size": 8, "latents": 3, "width": 8}


def parse_arguments(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="heat-encoder HVAE vs learnable-encoder HVAE (thesis §5.2.1)")
    parser.add_argument("--dataset", choices=DATASETS, default="mnist")
    parser.add_argument("--encoders", default="heat,learned")
    parser.add_argument("--latents", type=int, default=18)
    add_seed_arguments(parser)
    add_ema_argument(parser)
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
    return args


def main(argv=None) -> list[dict]:
    args = parse_arguments(argv)
    print(f"data: {SUBSTITUTES[args.dataset]}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    images, _ = load_images(args.dataset, limit=args.train_images)
    pooled = F.avg_pool2d(images, args.downsample) if args.downsample > 1 else images
    binary = (pooled > 0.5).float()
    classifier = default_classifier(args.dataset, args.classifier_cache, args.downsample)
    rows = []
    with open(out / "hvae_results.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        for seed in args.seed_range:
            for encoder in args.encoders:
                torch.manual_seed(seed)
                generator = torch.Generator().manual_seed(seed)
                model = HeatHVAE(encoder, args.latents, channels=binary.shape[1], image_size=binary.shape[-1],
                                 width=args.width, max_std=binary.shape[-1] / 1.4)  # Rissanen et al.: 20 px at 28x28, scaled
                optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
                ema = make_ema(model, args.ema_decay)
                start = time.perf_counter()
                for _ in tqdm(range(args.steps), desc=f"HVAE {encoder}", disable=args.quiet, leave=False):
                    batch = binary[torch.randint(0, len(binary), (args.batch_size,), generator=generator)]
                    loss = model.negative_elbo(batch, generator)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    if ema is not None:
                        ema.step(model.parameters())
                train_s = time.perf_counter() - start
                with ema_weights(model, ema):
                    samples = model.sample(args.samples, generator)
                save_image_grid(samples[:32], out / f"hvae_samples_{encoder}_seed{seed}.png")
                row = {"dataset": args.dataset, "encoder": encoder, "latents": args.latents, "seed": seed,
                       "is": inception_score(samples, classifier, splits=min(10, len(samples) // 2)),
                       "train_s": round(train_s, 1), "classifier_accuracy": classifier.test_accuracy}
                writer.writerow(row)
                handle.flush()
                rows.append(row)
                print(f"HVAE {encoder:<8} T={args.latents} seed {seed}  IS {row['is']:.3f}  "
                      f"-ELBO {loss.item():.1f}  train {train_s:.1f}s", flush=True)
    return rows


if __name__ == "__main__":
    main()
