"""PNG figures: rows of pseudo videos (as in thesis Figs. 5.3 and 5.6) and sample grids
(as in Figs. 5.4, 5.5 and 5.7; Chen et al. (2025), pseudo videos).
"""

from __future__ import annotations

from pathlib import Path

import torch

from probseq._optional import require

matplotlib = require("matplotlib", "plots", "pseudovideo.plots")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def save_video_rows(videos: dict[str, torch.Tensor], path: str | Path) -> None:
    """One row per entry: the frames of a single ``(T, C, H, W)`` video in ``[0, 1]``, z_1 left, z_T right.

    :param videos: each row's title and its ``(T, C, H, W)`` video (values in ``[0, 1]``; ``C`` is 1 or 3).
    :param path: the PNG file written.
    """
    num_frames = max(video.shape[0] for video in videos.values())
    figure, axes = plt.subplots(len(videos), num_frames, figsize=(1.2 * num_frames, 1.3 * len(videos)), squeeze=False)
    for row, (title, video) in zip(axes, videos.items()):
        for t, axis in enumerate(row):
            axis.axis("off")
            if t < video.shape[0]:
                axis.imshow(video[t].permute(1, 2, 0).squeeze(-1).clamp(0, 1).cpu().numpy(), cmap="gray", vmin=0, vmax=1)
        row[0].set_title(title, fontsize=8, loc="left")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def save_image_grid(images: torch.Tensor, path: str | Path, columns: int = 8) -> None:
    """A grid of ``(N, C, H, W)`` images in ``[0, 1]``.

    :param images: ``(N, C, H, W)`` images with values in ``[0, 1]`` (``C`` is 1 or 3).
    :param path: the PNG file written.
    :param columns: images per row.
    """
    rows = -(-len(images) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(columns, rows), squeeze=False)
    for index, axis in enumerate(axes.flat):
        axis.axis("off")
        if index < len(images):
            axis.imshow(images[index].permute(1, 2, 0).squeeze(-1).clamp(0, 1).cpu().numpy(), cmap="gray", vmin=0, vmax=1)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
