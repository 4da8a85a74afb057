"""The text data: the vaderSentiment archive's snippets (a synthetic archive of the same layout), binary
sentiment labels, tokenization, the vocabulary and padding."""

import pytest
from vader_fixtures import fake_vader_sdist

from gpytorch_sgpa.data import Vocabulary, encode_sentences, load_vader_snippets, tokenize
from gpytorch_sgpa.data.text import binary_sentiment


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
