"""Image metrics: PSNR, FID and Inception Score through ``torchmetrics`` with a pluggable network.

No InceptionV3 weights ship with this package and nothing is downloaded, so by default the feature
network is a small CNN classifier trained once per dataset and cached
(``~/.cache/probseq/pseudovideo``): report the numbers as e.g. "FID (Fashion-MNIST classifier
features)", never as Inception FID. Any ``nn.Module`` mapping images to features (FID) or logits
(IS) can be passed instead. Images are ``(N, C, H, W)`` floats in ``[0, 1]``.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch
from torch import nn

from ._optional import missing
from ._validation import check_int, check_real, check_tensor

try:
    from torchmetrics.functional.image import peak_signal_noise_ratio
    from torchmetrics.image.fid import FrechetInceptionDistance
    from torchmetrics.image.inception import InceptionScore
except ImportError as _error:
    raise missing("torchmetrics", "video", "pseudovideo.metrics") from _error


def psnr(preds: torch.Tensor, target: torch.Tensor, data_range: float = 1.0) -> torch.Tensor:
    """Mean over images of ``10 log10(data_range^2 / MSE_image)`` (thesis §5.3 reconstruction metric)."""
    check_tensor(preds, "preds")
    check_tensor(target, "target")
    if preds.shape != target.shape or preds.dim() != 4:
        raise ValueError(f"preds and target must share a (N, C, H, W) shape, got {tuple(preds.shape)} and "
                         f"{tuple(target.shape)}")
    check_tensor(preds, "preds", non_empty=True, finite=True)
    check_tensor(target, "target", finite=True)
    data_range = check_real(data_range, "data_range", low=0.0, low_open=True)
    return peak_signal_noise_ratio(preds, target, data_range=data_range, dim=(1, 2, 3))


class ImageClassifier(nn.Module):
    """Small CNN: two conv blocks, then ``num_features`` penultimate features and class logits."""

    def __init__(self, in_channels: int = 1, num_classes: int = 10, num_features: int = 64):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
            nn.Linear(64 * 16, num_features), nn.ReLU(),
        )
        self.head = nn.Linear(num_features, num_classes)
        self.num_features = num_features

    def features(self, images: torch.Tensor) -> torch.Tensor:
        return self.body(images)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(images))


class PenultimateFeatures(nn.Module):
    """The classifier's penultimate layer as a feature map for ``FrechetInceptionDistance``."""

    def __init__(self, classifier: ImageClassifier):
        super().__init__()
        self.classifier = classifier
        self.num_features = classifier.num_features

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier.features(images)


def frechet_distance(real: torch.Tensor, fake: torch.Tensor, feature: nn.Module) -> float:
    """FID ``||mu_r - mu_f||^2 + tr(S_r + S_f - 2 (S_r S_f)^{1/2})`` of ``feature`` outputs (torchmetrics)."""
    _check_images(real, "real")
    _check_images(fake, "fake")
    metric = FrechetInceptionDistance(feature=feature, normalize=True).to(real.device)  # states beside the features
    with torch.no_grad():
        metric.update(real, real=True)
        metric.update(fake, real=False)
        return float(metric.compute())


def inception_score(images: torch.Tensor, classifier: nn.Module, splits: int = 10, seed: int = 0) -> float:
    """IS ``exp E_x KL(p(y|x) || p(y))`` averaged over ``splits`` (torchmetrics; ``seed`` fixes the split)."""
    _check_images(images, "images")
    check_int(splits, "splits")
    check_int(seed, "seed", low=None)
    with warnings.catch_warnings():  # torchmetrics warns that IS buffers features, and of std() for one split
        warnings.simplefilter("ignore", UserWarning)
        return _inception_score(images, classifier, splits, seed)


def _inception_score(images, classifier, splits, seed) -> float:
    metric = InceptionScore(feature=classifier, splits=splits).to(images.device)
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(seed)
        metric.update(images)
        return float(metric.compute()[0])


def train_classifier(images: torch.Tensor, labels: torch.Tensor, epochs: int = 3, seed: int = 0,
                     batch_size: int = 128) -> ImageClassifier:
    """Fit ``ImageClassifier`` with Adam and cross-entropy (the default feature network)."""
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


def default_classifier(dataset: str, cache_dir: str | os.PathLike | None = None, downsample: int = 1) -> ImageClassifier:
    """The cached classifier for ``dataset`` (see ``pseudovideo.data``), trained on first use (~1 min).

    ``downsample`` > 1 trains it on images average-pooled by that factor (the CPU-sized experiments).
    """
    from .data import load_images

    check_int(downsample, "downsample")
    name = f"{dataset}_classifier.pt" if downsample == 1 else f"{dataset}_x{downsample}_classifier.pt"
    cache = Path(cache_dir or Path.home() / ".cache" / "probseq" / "pseudovideo") / name
    images, labels = load_images(dataset, limit=20_000)
    images = nn.functional.avg_pool2d(images, downsample) if downsample > 1 else images
    if cache.is_file():
        classifier = ImageClassifier(in_channels=images.shape[1], num_classes=int(labels.max()) + 1)
        classifier.load_state_dict(torch.load(cache, weights_only=True))
        return classifier.eval()
    classifier = train_classifier(images, labels)
    cache.parent.mkdir(parents=True, exist_ok=True)
    torch.save(classifier.state_dict(), cache)
    return classifier


def _check_images(images, name: str) -> None:
    if not isinstance(images, torch.Tensor) or images.dim() != 4 or not images.is_floating_point():
        raise TypeError(f"{name} must be a floating (N, C, H, W) tensor")
    if len(images) < 2:
        raise ValueError(f"{name} needs at least 2 images, got {len(images)}")
    check_tensor(images, name, non_empty=True, finite=True)
    if images.min() < 0 or images.max() > 1:
        raise ValueError(f"{name} must lie in [0, 1], got range [{images.min():.3g}, {images.max():.3g}]")
