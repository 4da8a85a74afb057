"""Fashion-MNIST from the Debian package ``dataset-fashion-mnist`` (``sudo apt-get install dataset-fashion-mnist``).

The chapter-3 and chapter-5 experiments read it as their image task; ``make data`` installs it.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import torch

FASHION_MNIST_ROOT = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
_FASHION_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}


def _read_idx(path: Path) -> np.ndarray:
    """Parse an IDX file (the MNIST format: big-endian magic, dims, then unsigned bytes)."""
    with gzip.open(path, "rb") as handle:
        data = handle.read()
    zero, dtype_code, num_dims = data[0:2], data[2], data[3]
    if zero != b"\x00\x00" or dtype_code != 0x08:
        raise ValueError(f"{path} is not an unsigned-byte IDX file")
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(num_dims))
    array = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * num_dims)
    if array.size != int(np.prod(shape)):
        raise ValueError(f"{path} is truncated: expected {int(np.prod(shape))} values, found {array.size}")
    return array.reshape(shape)


def load_fashion_mnist(split: str = "train", root: str | os.PathLike | None = None):
    """Fashion-MNIST images (``N x 1 x 28 x 28``, ``[0, 1]``) and labels from the Debian package.

    ``split`` is ``"train"`` (60,000) or ``"test"`` (10,000). ``root`` defaults to
    ``/usr/share/datasets/fashion-mnist`` where ``apt-get install dataset-fashion-mnist`` puts the
    files. Raises ``FileNotFoundError`` naming the package when they are missing.

    :param split: ``"train"`` (the default, 60,000 images) or ``"test"`` (10,000).
    :param root: the folder holding the ``*-ubyte.gz`` files; ``None`` (the default): ``FASHION_MNIST_ROOT``.
    """
    if split not in _FASHION_FILES:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    root = Path(root if root is not None else FASHION_MNIST_ROOT)
    image_file, label_file = (root / name for name in _FASHION_FILES[split])
    missing = [str(p) for p in (image_file, label_file) if not p.is_file()]
    if missing:
        raise FileNotFoundError(
            f"Fashion-MNIST files not found: {', '.join(missing)}. Install the Debian package "
            "'dataset-fashion-mnist' (sudo apt-get install dataset-fashion-mnist) or pass root=<folder "
            "holding the *-ubyte.gz files>."
        )
    images = torch.from_numpy(_read_idx(image_file).astype(np.float32) / 255.0).unsqueeze(1)
    labels = torch.from_numpy(_read_idx(label_file).astype(np.int64))
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"{image_file} and {label_file} hold different numbers of examples")
    return images, labels
