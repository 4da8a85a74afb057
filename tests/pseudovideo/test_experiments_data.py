"""The chapter-5 runners' data: ``pseudovideo.data``'s sets and Fashion-MNIST from the Debian package's files."""

import gzip

import numpy as np
import pytest
import torch

import experiments.fashion_mnist
from experiments.pseudovideo.data import DATASETS, SUBSTITUTES, classifier_data, load_images
from pseudovideo import data


def _write_idx(path, array):
    header = b"\x00\x00\x08" + bytes([array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as handle:
        handle.write(header + array.astype(np.uint8).tobytes())


@pytest.fixture
def fashion_files(tmp_path, monkeypatch):
    """Synthetic Fashion-MNIST files (30 training, 6 test images) where the Debian package puts the real ones."""
    rng = np.random.default_rng(0)
    arrays = {}
    for prefix, count in (("train", 30), ("t10k", 6)):
        arrays[prefix] = rng.integers(0, 256, size=(count, 28, 28)), rng.integers(0, 10, size=count)
        _write_idx(tmp_path / f"{prefix}-images-idx3-ubyte.gz", arrays[prefix][0])
        _write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte.gz", arrays[prefix][1])
    monkeypatch.setattr(experiments.fashion_mnist, "FASHION_MNIST_ROOT", str(tmp_path))
    return arrays


def test_fashion_mnist_splits_and_the_fixed_subset(fashion_files):
    pixels, labels = fashion_files["train"]
    subset = torch.randperm(30, generator=torch.Generator().manual_seed(0))[:10]  # load_images' seed-0 subset, by hand
    images, targets = load_images("fashion_mnist", "train", limit=10)
    assert images.shape == (10, 1, 28, 28) and images.dtype == torch.float32 and targets.dtype == torch.int64
    torch.testing.assert_close(images[:, 0], torch.from_numpy(pixels / 255.0).float()[subset])
    assert targets.tolist() == labels[subset.numpy()].tolist()
    test_images, test_targets = load_images("fashion_mnist", "test")
    assert test_images.shape == (6, 1, 28, 28) and test_targets.tolist() == fashion_files["t10k"][1].tolist()
    (train, _), (held_out, _) = classifier_data("fashion_mnist")  # the metric classifier: train split, test split
    assert train.shape[0] == 30 and held_out.shape[0] == 6


def test_the_other_sets_are_the_packages(fashion_files):
    assert DATASETS == ("fashion_mnist", *data.DATASETS) and set(SUBSTITUTES) == set(DATASETS)
    for loaded, reference in zip(load_images("digits", limit=7), data.load_images("digits", limit=7)):
        assert torch.equal(loaded, reference)
    assert classifier_data("digits") is None  # default_classifier's own 80/20 split
    with pytest.raises(ValueError, match="limit"):
        load_images("fashion_mnist", limit=0)
    with pytest.raises(ValueError, match="split"):
        load_images("fashion_mnist", "validation")
