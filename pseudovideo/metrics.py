r"""Image metrics: PSNR, and FID and Inception Score through ``torchmetrics`` with a pluggable network.

No InceptionV3 weights ship with this package and nothing is downloaded, so by default the feature
network is a small CNN classifier trained once per dataset and cached
(``~/.cache/probseq/pseudovideo``, keyed by a hash of its training data; its held-out accuracy is
``classifier.test_accuracy``): report the numbers as e.g. "FID (Fashion-MNIST classifier
features)", never as Inception FID. Any ``nn.Module`` mapping images to features (FID) or logits
(IS) can be passed instead, as the second argument of both.

One API for the three metrics: images are ``(N, C, H, W)`` floats in ``[0, 1]``; each function
returns a Python ``float``; images are fed to the network ``batch_size`` at a time. FID and IS also
accept an iterable of ``(n, C, H, W)`` batches (a ``DataLoader``, or a generator that samples a
batch at a time), so that 50,000 generated images never need to exist at once: FID keeps only the
feature sums :math:`\sum f` and :math:`\sum f f^\top` (torchmetrics' states, :math:`d + d^2` numbers in float64),
IS the ``N x classes`` logits. Too few samples for the statistic (FID with :math:`n \le d` features,
whose sample covariance is then singular; IS with fewer than two images per split) give a
:class:`MetricReliabilityWarning`; fewer than two images, ``splits > n`` or pixels outside
``[0, 1]`` a ``ValueError``. Each call scores the images it is given on its own process (no
``torch.distributed`` synchronisation, also inside a data-parallel run).
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from torch import nn

from probseq._optional import missing
from probseq._validation import check_int, check_real, check_tensor

try:
    from torchmetrics.image.fid import FrechetInceptionDistance
    from torchmetrics.image.inception import InceptionScore
except ImportError as _error:
    raise missing("torchmetrics", "video", "pseudovideo.metrics") from _error


class MetricReliabilityWarning(UserWarning):
    """A metric computed from too few samples (or an implausible ``data_range``) to be trusted."""


def psnr(preds: torch.Tensor, target: torch.Tensor, data_range: float = 1.0, batch_size: int = 1024) -> float:
    r"""Mean over images of :math:`10 \log_{10}(\mathrm{data\_range}^2 / \mathrm{MSE}_\mathrm{image})` (thesis §5.3 reconstruction metric).

    ``data_range`` is the width of the range the pixels live in (1 for ``[0, 1]``, 2 for ``[-1, 1]``,
    255 for 8-bit). A ``ValueError`` if ``target`` spans more than ``data_range``; a
    :class:`MetricReliabilityWarning` if it spans less than a quarter of it (e.g. ``[0, 1]`` images
    with ``data_range=255``, which adds 48 dB).

    :param preds: ``(N, C, H, W)`` reconstructed images.
    :param target: ``(N, C, H, W)`` reference images.
    :param data_range: the width of the pixel range (above).
    :param batch_size: the images fed to the network at a time.
    """
    check_tensor(preds, "preds", finite=False)
    check_tensor(target, "target", finite=False)
    if preds.shape != target.shape or preds.dim() != 4:
        raise ValueError(f"preds and target must share a (N, C, H, W) shape, got {tuple(preds.shape)} and {tuple(target.shape)}")
    check_tensor(preds, "preds", non_empty=True)
    check_tensor(target, "target")
    data_range = check_real(data_range, "data_range", low=0.0, low_open=True)
    check_int(batch_size, "batch_size")
    span = float(target.max() - target.min())
    if span > data_range * (1 + 1e-6):
        raise ValueError(
            f"target spans [{float(target.min()):.4g}, {float(target.max()):.4g}], wider than "
            f"data_range={data_range:g}: pass the width of the pixels' range"
        )
    if span < data_range / 4:
        warnings.warn(
            f"target spans only {span:.4g} of data_range={data_range:g}: is data_range the width of the "
            "range the pixels live in (1 for [0, 1], 2 for [-1, 1], 255 for 8-bit)?",
            MetricReliabilityWarning,
            stacklevel=2,
        )
    total = 0.0
    for pred_batch, target_batch in zip(preds.split(batch_size), target.split(batch_size)):
        mse = (pred_batch.double() - target_batch.double()).pow(2).mean(dim=(1, 2, 3))
        total += float((10 * torch.log10(data_range**2 / mse)).sum())
    return total / len(preds)


class ImageClassifier(nn.Module):
    """Small CNN: two conv blocks, then ``num_features`` penultimate features and class logits.

    :param in_channels: the images' channels.
    :param num_classes: the number of classes (logits).
    :param num_features: the width of the penultimate layer (the FID features).
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10, num_features: int = 64):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),
            nn.Flatten(),
            nn.Linear(64 * 16, num_features),
            nn.ReLU(),
        )
        self.head = nn.Linear(num_features, num_classes)
        self.in_channels, self.num_features = in_channels, num_features
        #: accuracy on held-out images where :func:`default_classifier` measured it, else ``None``
        self.test_accuracy: float | None = None

    def check_images(self, images: torch.Tensor, name: str = "images") -> None:
        """A ``TypeError`` / ``ValueError`` naming ``name`` unless ``images`` have this network's dtype and channels.

        :param images: ``(N, C, H, W)`` floating-point images.
        :param name: what the error message calls ``images``.
        """
        dtype = self.head.weight.dtype
        if images.dtype != dtype:
            raise TypeError(f"{name} are {images.dtype} but the feature network's weights are {dtype}: pass images.to({dtype})")
        if images.shape[1] != self.in_channels:
            raise ValueError(
                f"{name} have {images.shape[1]} channels but the feature network takes {self.in_channels}: score images "
                "of the data set the classifier was trained on (default_classifier(dataset))"
            )

    def features(self, images: torch.Tensor) -> torch.Tensor:
        """The ``(N, num_features)`` penultimate features.

        :param images: ``(N, C, H, W)`` images in ``[0, 1]``.
        """
        return self.body(images)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """The ``(N, num_classes)`` class logits.

        :param images: ``(N, C, H, W)`` images in ``[0, 1]``.
        """
        return self.head(self.body(images))


class PenultimateFeatures(nn.Module):
    """The classifier's penultimate layer as a feature map for ``FrechetInceptionDistance``.

    :param classifier: the network whose :meth:`ImageClassifier.features` are used.
    """

    def __init__(self, classifier: ImageClassifier):
        super().__init__()
        self.classifier = classifier
        self.num_features = classifier.num_features

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """The classifier's ``(N, num_features)`` penultimate features.

        :param images: ``(N, C, H, W)`` images in ``[0, 1]``.
        """
        return self.classifier.features(images)


class InceptionFeatures(nn.Module):
    """InceptionV3 features as torchmetrics' FID computes them (``FrechetInceptionDistance(feature=2048)``),
    for this module's ``[0, 1]`` images: grey images are repeated to 3 channels, pixels quantised to
    ``uint8`` as torchmetrics does (``normalize=True``), and the network resizes to 299 x 299 itself.

    The route for numbers comparable with published FIDs, where the InceptionV3 weights are at hand:
    it needs the ``torch-fidelity`` package and its weights, read from ``weights_path`` (the FID
    Inception checkpoint, ``pt_inception-2015-12-05-6726825d.pth``) or downloaded by torch-fidelity
    (which fails offline). Report its numbers as "FID" and the default classifier's as "FID
    (classifier features)": they are not comparable.

    :param weights_path: the FID Inception checkpoint (``None``: torch-fidelity downloads it).
    :param feature: the feature layer's width, 64, 192, 768 or 2048 (torchmetrics' layers).
    :param network: a ready network mapping ``uint8`` images to features, used instead of building
        InceptionV3 (``None``: build it).
    """

    def __init__(self, weights_path: str | os.PathLike | None = None, feature: int = 2048, network: nn.Module | None = None):
        super().__init__()
        if feature not in (64, 192, 768, 2048):
            raise ValueError(f"feature must be one of (64, 192, 768, 2048), torchmetrics' InceptionV3 layers, got {feature!r}")
        self.num_features = feature
        if network is None:
            network = _inception_network(weights_path, feature)
        self.network = network

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """The ``(N, feature)`` InceptionV3 features.

        :param images: ``(N, C, H, W)`` images in ``[0, 1]`` with 1 or 3 channels.
        """
        if images.shape[1] == 1:
            images = images.expand(-1, 3, -1, -1)
        if images.shape[1] != 3:
            raise ValueError(f"InceptionV3 takes 1- or 3-channel images, got {images.shape[1]} channels")
        return self.network((images * 255).byte())


def _inception_network(weights_path, feature: int) -> nn.Module:
    try:
        import torch_fidelity  # noqa: F401
    except ImportError as error:
        raise ModuleNotFoundError(
            "InceptionFeatures needs the 'torch-fidelity' package (pip install torch-fidelity) and the FID Inception "
            "weights (weights_path=...); without them use the offline classifier features (default_classifier)",
            name="torch_fidelity",
        ) from error
    from torchmetrics.image.fid import NoTrainInceptionV3

    try:
        return NoTrainInceptionV3(
            name="inception-v3-compat",
            features_list=[str(feature)],
            feature_extractor_weights_path=None if weights_path is None else str(weights_path),
        )
    except (OSError, RuntimeError, ValueError) as error:  # no weights file and no network to download them
        raise FileNotFoundError(
            f"the InceptionV3 weights could not be loaded ({error}); pass weights_path= the FID "
            "Inception checkpoint (pt_inception-2015-12-05-6726825d.pth)"
        ) from error


def frechet_distance(real, fake, feature: nn.Module, batch_size: int = 256, distributed: bool = False) -> float:
    r"""FID :math:`\|\mu_r - \mu_f\|^2 + \operatorname{tr}(S_r + S_f - 2 (S_r S_f)^{1/2})` of ``feature`` outputs (torchmetrics).

    ``real``, ``fake``: ``(N, C, H, W)`` tensors in ``[0, 1]`` or iterables of such batches; the
    means and covariances come from streamed sums (:math:`\mu = \sum f / n`,
    :math:`S = (\sum f f^\top - n \mu \mu^\top) / (n - 1)`), so memory does not grow with ``N``. A
    :class:`MetricReliabilityWarning` if either set
    has no more images than ``feature`` has dimensions. ``feature`` maps images to ``(N, d)``
    features; an :class:`ImageClassifier` (the network :func:`inception_score` takes) stands for its
    penultimate features.

    ``distributed=True``: each process of an initialised ``torch.distributed`` group (``torchrun``,
    ``accelerate launch``) passes its own share of the images, and every process gets the FID of their
    union (torchmetrics sums the streamed states across processes); every process must then call it.
    ``False`` (default): this process's images only, as a runner that evaluates on its main process needs.

    :param real: the reference images (above).
    :param fake: the generated images (above).
    :param feature: the feature network (above).
    :param batch_size: the images fed to the network at a time.
    :param distributed: whether to pool the images of all processes (above).
    """
    if distributed and not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        raise RuntimeError("distributed=True needs an initialised torch.distributed process group (torchrun, accelerate launch)")
    _check_network(feature, "feature")
    check_int(batch_size, "batch_size")
    for images, name in ((real, "real"), (fake, "fake")):
        if isinstance(images, torch.Tensor):  # check both sets before the first features are computed
            _check_images(images, name)
    if isinstance(feature, ImageClassifier):
        feature = PenultimateFeatures(feature)
    metric, channels = None, 0
    for is_real, images, name in ((True, real, "real"), (False, fake, "fake")):
        for batch in _batches(images, name, batch_size):
            _check_fits(batch, feature, name)
            if metric is None:  # the states live beside the features, on the first batch's device
                metric = FrechetInceptionDistance(feature=feature, normalize=True, sync_on_compute=distributed).to(batch.device)
            elif batch.shape[1] != channels:
                raise ValueError(f"{name} images have {batch.shape[1]} channels, the first real ones {channels}: real and fake must match")
            channels = batch.shape[1]
            with torch.no_grad():
                metric.update(batch, real=is_real)
    if metric is None:
        raise ValueError("real and fake hold no images")
    totals = torch.stack([metric.real_features_num_samples, metric.fake_features_num_samples]).to(torch.int64)
    if distributed:  # the union's counts, for the checks below
        torch.distributed.all_reduce(totals)
    counts = {"real": int(totals[0]), "fake": int(totals[1])}
    dimension = metric.real_features_sum.numel()
    for name, count in counts.items():
        if count < 2:
            raise ValueError(f"{name} needs at least 2 images, got {count}")
        if count <= dimension:
            warnings.warn(
                f"FID from {count} {name} images of {dimension}-dimensional features: the feature "
                "covariance is singular and FID strongly biased; use well over "
                f"{dimension} images (the thesis's protocol: 50,000)",
                MetricReliabilityWarning,
                stacklevel=2,
            )
    with torch.no_grad():
        return float(metric.compute())


def inception_score(
    images, feature: nn.Module | None = None, splits: int = 10, seed: int = 0, batch_size: int = 256, *, classifier: nn.Module | None = None
) -> float:
    """IS ``exp E_x KL(p(y|x) || p(y))`` averaged over ``splits`` (torchmetrics; ``seed`` fixes the split).

    ``feature`` maps images to class logits (``classifier=`` is its former, deprecated name);
    ``images`` is an ``(N, C, H, W)`` tensor in ``[0, 1]`` or an iterable of such batches. A
    ``ValueError`` if ``splits > N`` (a split of one image scores exactly 1); a
    :class:`MetricReliabilityWarning` if some split has fewer than two images.

    :param images: the images scored (above).
    :param feature: the network mapping images to class logits (``None``: the deprecated ``classifier``).
    :param splits: the number of splits the score is averaged over, at most :math:`N`.
    :param seed: the seed of the random split.
    :param batch_size: the images fed to the network at a time.
    :param classifier: the deprecated name of ``feature``.
    """
    if classifier is not None:
        if feature is not None:
            raise TypeError("pass the logit network once: as feature (classifier= is its deprecated name)")
        warnings.warn("inception_score(classifier=...) is deprecated: pass the network as feature", DeprecationWarning, stacklevel=2)
        feature = classifier
    feature = _check_network(feature, "feature")
    check_int(splits, "splits")
    check_int(seed, "seed", low=None)
    check_int(batch_size, "batch_size")
    metric = None
    with warnings.catch_warnings():  # torchmetrics warns that IS buffers features, and of std() for one split
        warnings.simplefilter("ignore", UserWarning)
        for batch in _batches(images, "images", batch_size):
            _check_fits(batch, feature, "images")
            if metric is None:
                metric = InceptionScore(feature=feature, splits=splits, sync_on_compute=False).to(batch.device)
            with torch.no_grad():
                metric.update(batch)
        if metric is None:
            raise ValueError("images holds no images")
        count = sum(len(f) for f in metric.features)
        if count < 2:
            raise ValueError(f"images needs at least 2 images, got {count}")
        if splits > count:
            raise ValueError(f"splits={splits} exceeds the number of images ({count}): each split needs images")
        with torch.no_grad(), torch.random.fork_rng():
            torch.manual_seed(seed)
            score = float(metric.compute()[0])
    if count < 2 * splits:
        warnings.warn(
            f"IS with {splits} splits of {count} images: splits of one image score exactly 1; use splits <= {count // 2}",
            MetricReliabilityWarning,
            stacklevel=2,
        )
    return score


def train_classifier(images: torch.Tensor, labels: torch.Tensor, epochs: int = 3, seed: int = 0, batch_size: int = 128) -> ImageClassifier:
    """Fit ``ImageClassifier`` with Adam and cross-entropy (the default feature network).

    :param images: ``(N, C, H, W)`` training images in ``[0, 1]``.
    :param labels: ``(N,)`` integer class indices, ``>= 0``.
    :param epochs: the passes over the images.
    :param seed: the seed of the initial weights and of the batches' order.
    :param batch_size: the images per Adam step.
    """
    _check_images(images, "images")
    check_tensor(labels, "labels", floating=False, dim=1)
    if len(labels) != len(images):
        raise ValueError(f"labels must have shape ({len(images)},), one per image, got {tuple(labels.shape)}")
    if labels.min() < 0:
        raise ValueError(f"labels must be class indices >= 0, got {int(labels.min())}")
    check_int(epochs, "epochs", low=0)
    check_int(seed, "seed", low=None)
    check_int(batch_size, "batch_size")
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    classifier = ImageClassifier(in_channels=images.shape[1], num_classes=int(labels.max()) + 1).to(images.device)
    optimizer = torch.optim.Adam(classifier.parameters(), lr=2e-3)
    for _ in range(epochs):
        for batch in torch.randperm(len(images), generator=generator).split(batch_size):
            loss = nn.functional.cross_entropy(classifier(images[batch]), labels[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return classifier.eval()


def default_classifier(dataset: str, cache_dir: str | os.PathLike | None = None, downsample: int = 1, data=None) -> ImageClassifier:
    """The cached classifier for ``dataset`` (see ``pseudovideo.data``), trained on first use (~1 min).

    Trained on up to 20,000 training images (the first 80 % of a fixed permutation, or ``data``'s
    training images) and scored on held-out ones (the other 20 %, or ``data``'s held-out images):
    ``classifier.test_accuracy``. The cache file is named by ``dataset`` and a SHA-256 hash of the
    training images, labels and settings, so a changed data set or loader retrains instead of loading
    a stale network. ``downsample`` > 1 trains it on images average-pooled by that factor (the
    CPU-sized experiments). Within a process, later calls with the same arguments and no ``data``
    return the same classifier without reading or hashing the data again.

    :param dataset: one of :data:`pseudovideo.data.DATASETS`, or the name of ``data``.
    :param cache_dir: where the classifier is cached (``None``: ``~/.cache/probseq/pseudovideo``).
    :param downsample: the average-pooling factor of the training images (1: none).
    :param data: ``((train_images, train_labels), (test_images, test_labels))``, images ``(N, C, H, W)`` in
        ``[0, 1]``: a data set of your own to train and score on; ``None`` (the default) loads ``dataset``.
    """
    check_int(downsample, "downsample")
    cache = Path(cache_dir or Path.home() / ".cache" / "probseq" / "pseudovideo")
    if data is not None:
        return _load_or_train_classifier(dataset, cache, downsample, _checked_classifier_data(data))
    key = (dataset, str(cache.resolve()), downsample)
    if key not in _CLASSIFIERS:
        _CLASSIFIERS[key] = _load_or_train_classifier(dataset, cache, downsample, _classifier_data(dataset))
    return _CLASSIFIERS[key]


def _load_or_train_classifier(dataset, cache: Path, downsample: int, data) -> ImageClassifier:
    """:func:`default_classifier` from its cache file (named by the data's hash), else trained and saved there."""
    (train, train_labels), (test, test_labels) = data
    if downsample > 1:
        train, test = nn.functional.avg_pool2d(train, downsample), nn.functional.avg_pool2d(test, downsample)
    digest = hashlib.sha256()
    for part in (f"{dataset}|{downsample}|epochs=3|seed=0".encode(), train.numpy().tobytes(), train_labels.numpy().tobytes()):
        digest.update(part)
    weights = cache / f"{dataset}_x{downsample}_{digest.hexdigest()[:16]}.pt"
    record = weights.with_suffix(".json")
    num_classes = int(train_labels.max()) + 1
    if weights.is_file() and record.is_file():
        classifier = ImageClassifier(in_channels=train.shape[1], num_classes=num_classes)
        classifier.load_state_dict(torch.load(weights, weights_only=True))
        classifier.test_accuracy = json.loads(record.read_text())["test_accuracy"]
        return classifier.eval()
    classifier = train_classifier(train, train_labels)
    with torch.no_grad():
        classifier.test_accuracy = float((classifier(test).argmax(1) == test_labels).double().mean())
    cache.mkdir(parents=True, exist_ok=True)
    torch.save(classifier.state_dict(), weights)
    record.write_text(
        json.dumps(
            {
                "dataset": dataset,
                "downsample": downsample,
                "train_images": len(train),
                "test_images": len(test),
                "test_accuracy": classifier.test_accuracy,
            }
        )
    )
    return classifier


#: :func:`default_classifier`'s classifiers of this process, by ``(dataset, cache folder, downsample)``.
_CLASSIFIERS: dict[tuple[str, str, int], ImageClassifier] = {}


def _classifier_data(dataset):
    from .data import load_images

    images, labels = load_images(dataset, limit=20_000)
    cut = len(images) * 4 // 5
    return (images[:cut], labels[:cut]), (images[cut:], labels[cut:])


def _checked_classifier_data(data):
    try:
        (train, train_labels), (test, test_labels) = data
    except (TypeError, ValueError):
        raise TypeError("data must be ((train_images, train_labels), (test_images, test_labels)), got " + type(data).__name__) from None
    _check_images(train, "data's train_images")
    _check_images(test, "data's test_images", at_least=1)
    return (train, train_labels), (test, test_labels)


def _check_images(images, name: str, at_least: int = 2) -> None:
    if not isinstance(images, torch.Tensor) or images.dim() != 4 or not images.is_floating_point():
        raise TypeError(f"{name} must be a floating (N, C, H, W) tensor")
    if len(images) < at_least:
        raise ValueError(f"{name} needs at least {at_least} images, got {len(images)}")
    check_tensor(images, name, non_empty=True)
    if images.min() < 0 or images.max() > 1:
        raise ValueError(f"{name} must lie in [0, 1], got range [{images.min():.3g}, {images.max():.3g}]")


def _batches(images, name: str, batch_size: int) -> Iterator[torch.Tensor]:
    """Checked ``(n, C, H, W)`` batches: a tensor split into ``batch_size`` rows, or the batches of an iterable."""
    if isinstance(images, torch.Tensor):
        _check_images(images, name)
        yield from images.split(batch_size)
        return
    if not isinstance(images, Iterable):
        raise TypeError(f"{name} must be a floating (N, C, H, W) tensor or an iterable of such batches, got {type(images).__name__}")
    empty = True
    for batch in images:
        _check_images(batch, f"{name} (a batch)", at_least=1)
        empty = False
        yield from batch.split(batch_size)
    if empty:
        raise ValueError(f"{name} needs at least 2 images, got an empty iterable")


def _check_fits(batch, network, name: str) -> None:
    """The named error of :meth:`ImageClassifier.check_images` where ``network`` is (or wraps) one."""
    classifier = network.classifier if isinstance(network, PenultimateFeatures) else network
    if isinstance(classifier, ImageClassifier):
        classifier.check_images(batch, name)


def _check_network(network, name: str) -> nn.Module:
    """``network`` if it is an ``nn.Module``; a ``TypeError`` naming ``name`` otherwise."""
    if not isinstance(network, nn.Module):
        raise TypeError(f"{name} must be an nn.Module mapping (N, C, H, W) images to (N, d) outputs, got {type(network).__name__}")
    return network
