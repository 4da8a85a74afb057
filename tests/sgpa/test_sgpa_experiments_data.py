"""Offline data loaders: IDX parsing, missing-package errors, the vaderSentiment archive, tokenization."""

import gzip

import numpy as np
import pytest
import torch

from experiments.fashion_mnist import load_fashion_mnist


def _write_idx(path, array):
    header = b"\x00\x00\x08" + bytes([array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as handle:
        handle.write(header + array.astype(np.uint8).tobytes())


def test_fashion_mnist_idx_reader_on_synthetic_files(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(3, 28, 28))
    labels = np.array([9, 0, 4])
    _write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", images)
    _write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", labels)
    x, y = load_fashion_mnist("test", root=tmp_path)
    assert x.shape == (3, 1, 28, 28) and x.dtype == torch.float32
    assert torch.allclose(x[:, 0], torch.from_numpy(images / 255.0).float())
    assert y.tolist() == [9, 0, 4]


def test_fashion_mnist_missing_names_debian_package(tmp_path):
    with pytest.raises(FileNotFoundError, match="dataset-fashion-mnist"):
        load_fashion_mnist("train", root=tmp_path)
    with pytest.raises(ValueError, match="split"):
        load_fashion_mnist("validation", root=tmp_path)
