r"""FID on 2 x 50,000 small images within bounded memory: :func:`pseudovideo.metrics.frechet_distance`
fed batch by batch, against feeding all images at once.

Each case runs in a fresh Python process (so that its peak resident set size is its own) and prints
the peak RSS (``getrusage``'s ``ru_maxrss``) above the process's RSS after its imports and the
feature network were set up:

* ``streamed``: ``--images`` real and as many generated ``size x size`` images, produced
  ``--batch-size`` at a time by two seeded generators (as a sampler would produce them) and streamed
  through the metric; nothing but one batch and the metric's feature sums (``d + d^2`` float64
  numbers per set) is held;
* ``one-shot``: ``--one-shot-images`` of each set created as one tensor and passed whole to
  torchmetrics' ``FrechetInceptionDistance.update``, as the metric was used before it took batches
  (the feature network's activations for all images at once).

The feature network is the package's small ``ImageClassifier`` (64 penultimate features, random
weights: the FID values are not meaningful, the memory is). The "real" images are
smooth random fields, the "generated" ones the same fields squared.

    python benchmarks/fid_memory.py                        # 2 x 50,000 16x16 images (~1 min on one core)
    python benchmarks/fid_memory.py --images 5000 --size 28
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch
import torch.nn.functional as F


def rss_mb() -> float:
    """The process's peak resident set size so far, in MB (``ru_maxrss`` is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * resource.getpagesize() / 2**20


def image_batches(count: int, size: int, batch_size: int, seed: int, squared: bool):
    """``count`` images in ``[0, 1]`` in batches: smoothed uniform noise (squared for the "generated" set)."""
    generator = torch.Generator().manual_seed(seed)
    for start in range(0, count, batch_size):
        noise = torch.rand(min(batch_size, count - start), 1, size, size, generator=generator)
        smooth = F.avg_pool2d(noise, 3, stride=1, padding=1, count_include_pad=False)
        yield smooth**2 if squared else smooth


def run_case(case: str, images: int, size: int, batch_size: int) -> dict:
    from torchmetrics.image.fid import FrechetInceptionDistance

    from pseudovideo.metrics import ImageClassifier, PenultimateFeatures, frechet_distance

    torch.set_num_threads(1)
    torch.manual_seed(0)
    feature = PenultimateFeatures(ImageClassifier(1, 10, 64).eval())
    feature(torch.rand(2, 1, size, size))  # allocator warm-up, part of the floor
    floor = current_rss_mb()
    start = time.perf_counter()
    if case == "streamed":
        value = frechet_distance(
            image_batches(images, size, batch_size, 1, False),
            image_batches(images, size, batch_size, 2, True),
            feature,
            batch_size=batch_size,
        )
    else:
        real = torch.cat(list(image_batches(images, size, images, 1, False)))
        fake = torch.cat(list(image_batches(images, size, images, 2, True)))
        metric = FrechetInceptionDistance(feature=feature, normalize=True)
        with torch.no_grad():
            metric.update(real, real=True)
            metric.update(fake, real=False)
            value = float(metric.compute())
    return {
        "case": case,
        "images": images,
        "fid": value,
        "seconds": time.perf_counter() - start,
        "floor_mb": floor,
        "peak_mb": rss_mb(),
        "extra_mb": rss_mb() - floor,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=50_000, help="images per set, streamed")
    parser.add_argument("--one-shot-images", type=int, default=4_000, help="images per set, passed at once")
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--case", choices=("streamed", "one-shot"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.case:
        count = args.images if args.case == "streamed" else args.one_shot_images
        print(json.dumps(run_case(args.case, count, args.size, args.batch_size)))
        return
    results = {}
    for case in ("streamed", "one-shot"):
        command = [
            sys.executable,
            __file__,
            "--case",
            case,
            "--images",
            str(args.images),
            "--one-shot-images",
            str(args.one_shot_images),
            "--size",
            str(args.size),
            "--batch-size",
            str(args.batch_size),
        ]
        output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        results[case] = json.loads(output.strip().splitlines()[-1])
    print(
        f"FID of 64 classifier features, {args.size}x{args.size} images, one torch thread; RSS in MB "
        "(peak of the process, and above its RSS after imports):"
    )
    print(f"{'case':<10}{'images per set':>16}{'FID':>10}{'seconds':>9}{'peak RSS':>10}{'extra':>8}{'extra / image':>15}")
    for case, row in results.items():
        per_image = row["extra_mb"] / (2 * row["images"]) * 1024
        print(
            f"{case:<10}{row['images']:>16,}{row['fid']:>10.4f}{row['seconds']:>9.1f}{row['peak_mb']:>10.0f}"
            f"{row['extra_mb']:>8.0f}{per_image:>12.2f} KB"
        )
    streamed, one_shot = results["streamed"], results["one-shot"]
    ratio = (one_shot["extra_mb"] / one_shot["images"]) / max(streamed["extra_mb"] / streamed["images"], 1e-9)
    print(
        f"memory per image, one-shot / streamed: {ratio:.0f}x; streamed holds "
        f"{streamed['images'] / one_shot['images']:.1f}x the images in {streamed['extra_mb']:.0f} MB above its floor "
        f"against {one_shot['extra_mb']:.0f} MB"
    )


if __name__ == "__main__":
    main()
