"""The PNG figures read back: each image or frame lands in its cell of the grid (rows left to right, z_1 left), with
its grey level (the ``gray`` colour map from 0 to 1) or its colour."""

import numpy as np
import pytest
import torch

pytest.importorskip("matplotlib")
from matplotlib.image import imread  # noqa: E402

from pseudovideo.plots import save_image_grid, save_video_rows  # noqa: E402


def _cells(png, rows, columns):
    """The darkest grey level of each cell of a ``rows`` x ``columns`` partition of the figure (white is 1)."""
    grey = png[..., :3].mean(-1)
    top = [r * grey.shape[0] // rows for r in range(rows + 1)]
    left = [c * grey.shape[1] // columns for c in range(columns + 1)]
    return np.array([[grey[top[r] : top[r + 1], left[c] : left[c + 1]].min() for c in range(columns)] for r in range(rows)])


def test_an_image_grid_fills_its_rows_left_to_right(tmp_path):
    levels = [0.1, 0.4, 0.7]
    images = torch.stack([torch.full((1, 8, 8), level) for level in levels])
    save_image_grid(images, tmp_path / "grid.png", columns=2)
    cells = _cells(imread(tmp_path / "grid.png"), rows=2, columns=2)
    np.testing.assert_allclose(cells, [[0.1, 0.4], [0.7, 1.0]], atol=0.01)  # the fourth cell is empty


def test_video_rows_show_each_video_from_its_first_frame_on_the_left(tmp_path):
    levels = [0.2, 0.5, 0.8]  # the frames of the first video, z_1 to z_3
    first = torch.stack([torch.full((1, 8, 8), level) for level in levels])
    second = torch.full((2, 1, 8, 8), 0.6)  # a shorter video leaves its last cell empty
    save_video_rows({"": first, " ": second}, tmp_path / "rows.png")
    cells = _cells(imread(tmp_path / "rows.png"), rows=2, columns=3)
    np.testing.assert_allclose(cells, [levels, [0.6, 0.6, 1.0]], atol=0.01)


def test_colour_images_keep_their_colour_and_out_of_range_values_are_clipped(tmp_path):
    red = torch.zeros(1, 3, 8, 8)
    red[:, 0] = 2.0  # clipped to 1
    save_image_grid(red, tmp_path / "red.png", columns=1)
    png = imread(tmp_path / "red.png")[..., :3].reshape(-1, 3)
    assert np.isclose(png, [1.0, 0.0, 0.0], atol=0.01).all(-1).sum() > 0.3 * len(png)
