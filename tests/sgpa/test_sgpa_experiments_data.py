"""Offline data loaders: IDX parsing, missing-package errors, the vaderSentiment archive, tokenization."""

import gzip

import numpy as np
import pytest
import torch
from vader_fixtures import fake_vader_sdist

from gpytorch_sgpa.data import (
    Vocabulary,
    encode_sentences,
    load_digits_images,
    load_fashion_mnist,
    load_vader_snippets,
    split_indices,
    tokenize,
)
from gpytorch_sgpa.data.text import binary_sentiment


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


def test_digits_images_are_scaled():
    x, y = load_digits_images()
    assert x.shape == (1797, 1, 8, 8) and float(x.max()) == 1.0 and float(x.min()) == 0.0
    assert set(y.tolist()) == set(range(10))


def test_vader_loader_reads_nested_archive(tmp_path):
    archive = tmp_path / "vaderSentiment-3.3.2.tar.gz"
    fake_vader_sdist(archive, {"movie": [(2.5, "A great film!"), (-1.2, "Dull, dull, dull."), (0.0, "It exists.")]})
    sentences, ratings = load_vader_snippets("movie", archive=archive)
    assert sentences == ["A great film!", "Dull, dull, dull.", "It exists."]
    assert ratings.tolist() == [2.5, -1.2, 0.0]
    kept_sentences, labels, kept = binary_sentiment(sentences, ratings)
    assert kept_sentences == sentences[:2] and labels.tolist() == [1, 0] and kept.tolist() == [0, 1]


def test_vader_loader_missing_archive_gives_pip_command(tmp_path, monkeypatch):
    monkeypatch.setenv("PROBSEQ_VADER_ARCHIVE", str(tmp_path / "absent.tar.gz"))
    with pytest.raises(FileNotFoundError, match="pip download .*vaderSentiment==3.3.2"):
        load_vader_snippets("movie")
    with pytest.raises(ValueError, match="corpus"):
        load_vader_snippets("imdb")


def test_tokenizer_vocabulary_and_padding():
    assert tokenize("It's GREAT, isn't it?!") == ["it's", "great", "isn't", "it", "?", "!"]
    vocab = Vocabulary.build(["good good bad", "good ok"], min_freq=2)
    assert vocab.itos == ["<pad>", "<unk>", "good"]
    ids, mask = encode_sentences(["good bad", "ok good good"], vocab)
    assert ids.tolist() == [[2, 1, 0], [1, 2, 2]]
    assert mask.tolist() == [[False, False, True], [False, False, False]]
    with pytest.raises(ValueError, match="max_len"):
        encode_sentences(["good good good"], vocab, max_len=2)
    ids, _ = encode_sentences(["good good bad"], vocab, max_len=2, truncate=True)
    assert ids.tolist() == [[2, 2]]
    with pytest.raises(ValueError, match=r"sentences\[0\]"):
        encode_sentences(["..."], vocab)


def test_split_indices_disjoint_and_reproducible():
    first = split_indices(100, [10, 20, 30], seed=3)
    again = split_indices(100, [10, 20, 30], seed=3)
    assert [len(s) for s in first] == [10, 20, 30]
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert len(torch.cat(first).unique()) == 60
    with pytest.raises(ValueError, match="sizes"):
        split_indices(10, [6, 6])
