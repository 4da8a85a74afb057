"""Labelled sentences from the ``vaderSentiment==3.3.2`` source archive, a tokenizer and a vocabulary.

The sdist of vaderSentiment 3.3.2 (PyPI) holds ``additional_resources/hutto_ICWSM_2014.tar.gz``,
the human-rated snippets of Hutto & Gilbert (ICWSM 2014): tab-separated ``ID, MEAN-RATING, TEXT``
with ratings in ``[-4, 4]`` from at least 20 raters. The movie-review file (10,605 sentences from
Pang & Lee's 2,000 reviews) is our stand-in for IMDB sentiment analysis (thesis ch. 3). Get the
archive with a package client, once::

    python -m pip download --no-binary :all: --no-deps vaderSentiment==3.3.2 -d ~/.cache/probseq
"""

from __future__ import annotations

import io
import os
import re
import tarfile
from collections import Counter
from pathlib import Path

import torch

VADER_ARCHIVE_NAME = "vaderSentiment-3.3.2.tar.gz"
VADER_ARCHIVE_ENV = "PROBSEQ_VADER_ARCHIVE"
_INNER_ARCHIVE = "vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz"
_CORPUS_FILES = {
    "movie": "hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt",
    "nyt": "hutto_ICWSM_2014/nytEditorialSnippets_GroundTruth.txt",
    "amazon": "hutto_ICWSM_2014/amazonReviewSnippets_GroundTruth.txt",
    "tweets": "hutto_ICWSM_2014/tweets_GroundTruth.txt",
}
_TOKEN_PATTERN = re.compile(r"[a-z0-9]+(?:'[a-z]+)?|[!?]")


def default_vader_archive() -> Path:
    """``$PROBSEQ_VADER_ARCHIVE`` if set, else ``~/.cache/probseq/vaderSentiment-3.3.2.tar.gz``."""
    override = os.environ.get(VADER_ARCHIVE_ENV)
    if override:
        return Path(override)
    return Path.home() / ".cache" / "probseq" / VADER_ARCHIVE_NAME


def _member_bytes(archive: tarfile.TarFile, name: str, path: Path) -> bytes:
    """The contents of the regular file ``name`` of ``archive`` (read from ``path``); ``KeyError`` if it has none."""
    member = archive.extractfile(name)
    if member is None:  # a directory or a link
        raise ValueError(f"{path} is not the vaderSentiment 3.3.2 sdist ({name} is not a regular file)")
    return member.read()


def load_vader_snippets(corpus: str = "movie", archive: str | os.PathLike | None = None):
    """Sentences and mean sentiment ratings of one corpus in the vaderSentiment 3.3.2 sdist.

    ``corpus`` is ``"movie"`` (10,605 movie-review sentences), ``"nyt"`` (NYT editorials),
    ``"amazon"`` or ``"tweets"``. ``archive`` is the sdist ``.tar.gz`` (default:
    :func:`default_vader_archive`). Nothing is downloaded: a missing archive raises
    ``FileNotFoundError`` with the ``pip download`` command that fetches it.
    Returns ``(sentences: list[str], ratings: float64 tensor)``.

    :param corpus: ``"movie"`` (the default), ``"nyt"``, ``"amazon"`` or ``"tweets"``.
    :param archive: the path of the vaderSentiment 3.3.2 sdist ``.tar.gz``; ``None`` (the default):
        :func:`default_vader_archive`.
    """
    if corpus not in _CORPUS_FILES:
        raise ValueError(f"corpus must be one of {sorted(_CORPUS_FILES)}, got {corpus!r}")
    path = Path(archive) if archive is not None else default_vader_archive()
    if not path.is_file():
        raise FileNotFoundError(
            f"vaderSentiment source archive not found at {path}. Fetch it with the package client: "
            f"python -m pip download --no-binary :all: --no-deps vaderSentiment==3.3.2 -d {path.parent} "
            f"(or set {VADER_ARCHIVE_ENV} to the .tar.gz)."
        )
    with tarfile.open(path, "r:gz") as outer:
        try:
            inner_bytes = _member_bytes(outer, _INNER_ARCHIVE, path)
        except KeyError as err:
            raise ValueError(f"{path} is not the vaderSentiment 3.3.2 sdist (no {_INNER_ARCHIVE})") from err
    with tarfile.open(fileobj=io.BytesIO(inner_bytes), mode="r:gz") as inner:
        text = _member_bytes(inner, _CORPUS_FILES[corpus], path).decode("utf-8")
    sentences, ratings = [], []
    for line_number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("\t", 2)
        if len(fields) != 3:
            raise ValueError(f"{_CORPUS_FILES[corpus]} line {line_number}: expected 3 tab-separated fields")
        ratings.append(float(fields[1]))
        sentences.append(fields[2].strip())
    return sentences, torch.tensor(ratings, dtype=torch.float64)


def binary_sentiment(sentences, ratings):
    """Binary labels (1 if the mean rating is positive, 0 if negative) for a sentiment corpus.

    Sentences rated exactly 0 (neutral; 37 of the 10,605 movie sentences) have no binary label
    and are excluded; the returned ``kept`` indices say which sentences remain.
    Returns ``(sentences, labels: int64 tensor, kept: int64 tensor)``.

    :param sentences: the sentences, a list of ``N`` strings.
    :param ratings: their mean sentiment ratings, ``N`` finite numbers (in ``[-4, 4]`` for the vader corpora).
    """
    ratings = torch.as_tensor(ratings, dtype=torch.float64)
    if ratings.dim() != 1 or ratings.shape[0] != len(sentences):
        raise ValueError(f"ratings must have shape ({len(sentences)},), got {tuple(ratings.shape)}")
    if not torch.isfinite(ratings).all():
        raise ValueError("ratings contains NaN or infinite values")
    kept = torch.nonzero(ratings != 0).squeeze(-1)
    labels = (ratings[kept] > 0).long()
    return [sentences[i] for i in kept.tolist()], labels, kept


def tokenize(sentence: str) -> list[str]:
    """Lower-case word tokens (letters/digits with an optional ``'s``-style suffix) plus ``!`` and ``?``.

    :param sentence: the text to split.
    """
    if not isinstance(sentence, str):
        raise TypeError(f"sentence must be a str, got {type(sentence).__name__}")
    return _TOKEN_PATTERN.findall(sentence.lower())


class Vocabulary:
    """Token-to-index map with ``<pad>`` = 0 and ``<unk>`` = 1, built from training sentences only.

    :param tokens: the vocabulary's tokens in index order from 2 on (``"<pad>"`` and ``"<unk>"`` among them are
        skipped).
    """

    pad_index = 0
    unk_index = 1

    def __init__(self, tokens):
        self.itos = ["<pad>", "<unk>"] + [t for t in tokens if t not in ("<pad>", "<unk>")]
        self.stoi = {token: index for index, token in enumerate(self.itos)}

    @classmethod
    def build(cls, sentences, min_freq: int = 1, max_size: int | None = None) -> Vocabulary:
        """The ``max_size`` most frequent tokens seen at least ``min_freq`` times (ties: first seen).

        :param sentences: the training sentences (strings), tokenised by :func:`tokenize`.
        :param min_freq: the least number of occurrences a kept token has, a positive int (default 1).
        :param max_size: the most tokens kept (besides ``<pad>`` and ``<unk>``); ``None`` (the default): no limit.
        """
        if isinstance(min_freq, bool) or not isinstance(min_freq, int) or min_freq < 1:
            raise ValueError(f"min_freq must be a positive integer, got {min_freq!r}")
        if max_size is not None and (not isinstance(max_size, int) or max_size < 1):
            raise ValueError(f"max_size must be a positive integer or None, got {max_size!r}")
        counts = Counter(token for sentence in sentences for token in tokenize(sentence))
        frequent = [token for token, count in counts.most_common() if count >= min_freq]
        return cls(frequent[:max_size] if max_size is not None else frequent)

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, sentence: str) -> list[int]:
        """The token indices of ``sentence`` (:func:`tokenize`; unknown tokens map to ``unk_index``).

        :param sentence: the text to encode.
        """
        return [self.stoi.get(token, self.unk_index) for token in tokenize(sentence)]


def encode_sentences(sentences, vocabulary: Vocabulary, max_len: int | None = None, truncate: bool = False):
    """Token indices ``N x T`` (right-padded with 0) and a padding mask ``N x T`` (True = padding).

    ``T`` is ``max_len`` or the longest sentence. A sentence longer than ``max_len`` raises
    ``ValueError`` unless ``truncate=True`` keeps its first ``max_len`` tokens. A sentence without
    any token raises ``ValueError`` (attention over an empty sequence is undefined).

    :param sentences: the sentences (strings) to encode.
    :param vocabulary: the vocabulary mapping tokens to indices (unknown tokens to ``<unk>``).
    :param max_len: the padded length :math:`T`, a positive int; ``None`` (the default): the longest sentence's.
    :param truncate: whether a sentence longer than ``max_len`` keeps its first ``max_len`` tokens instead of raising
        (default ``False``).
    """
    encoded = [vocabulary.encode(sentence) for sentence in sentences]
    if not encoded:
        raise ValueError("sentences is empty")
    for index, ids in enumerate(encoded):
        if not ids:
            raise ValueError(f"sentences[{index}] has no tokens: {sentences[index]!r}")
    longest = max(len(ids) for ids in encoded)
    if max_len is None:
        max_len = longest
    elif isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"max_len must be a positive integer, got {max_len!r}")
    elif longest > max_len and not truncate:
        raise ValueError(f"a sentence has {longest} tokens > max_len={max_len}; pass truncate=True to cut it")
    token_ids = torch.full((len(encoded), max_len), vocabulary.pad_index, dtype=torch.long)
    for row, ids in enumerate(encoded):
        ids = ids[:max_len]
        token_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    return token_ids, token_ids == vocabulary.pad_index
