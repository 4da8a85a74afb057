"""Metrics at full size: FID and IS from streamed batches equal the one-shot values, and too few
samples, a wrong data range or images outside [0, 1] are named instead of returning a number."""

import numpy as np
import pytest
import scipy.linalg
import torch
from torch import nn

from pseudovideo.metrics import ImageClassifier, MetricReliabilityWarning, frechet_distance, inception_score, psnr


class LinearFeatures(nn.Module):
    def __init__(self, dimension=3, pixels=16, seed=0):
        super().__init__()
        self.matrix = nn.Parameter(torch.randn(dimension, pixels, generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
        self.num_features = dimension

    def forward(self, images):
        return images.flatten(1).double() @ self.matrix.T


def closed_form(real, fake, feature):
    f_real, f_fake = feature(real).detach().numpy(), feature(fake).detach().numpy()
    root = scipy.linalg.sqrtm(np.cov(f_real.T) @ np.cov(f_fake.T)).real
    return float(((f_real.mean(0) - f_fake.mean(0)) ** 2).sum() + np.trace(np.cov(f_real.T) + np.cov(f_fake.T) - 2 * root))


def test_fid_from_batches_and_from_a_generator_equals_the_closed_form():
    generator = torch.Generator().manual_seed(0)
    real = torch.rand(1000, 1, 4, 4, generator=generator, dtype=torch.float64)
    fake = torch.rand(1000, 1, 4, 4, generator=generator, dtype=torch.float64) ** 2
    feature = LinearFeatures()
    expected = closed_form(real, fake, feature)
    assert abs(frechet_distance(real, fake, feature, batch_size=64) - expected) < 1e-8 * expected
    streamed = frechet_distance(iter(real.split(37)), (batch for batch in fake.split(100)), feature)
    assert abs(streamed - expected) < 1e-8 * expected


def test_inception_score_from_batches_equals_one_shot():
    torch.manual_seed(0)
    classifier = ImageClassifier(1, 5, 8).double().eval()
    images = torch.rand(200, 1, 8, 8, dtype=torch.float64)
    whole = inception_score(images, classifier, splits=4, batch_size=1000)
    assert abs(inception_score(images, classifier, splits=4, batch_size=7) - whole) < 1e-10
    assert abs(inception_score(iter(images.split(50)), classifier, splits=4) - whole) < 1e-10


def test_inception_score_classifier_keyword_is_deprecated():
    torch.manual_seed(0)
    classifier = ImageClassifier(1, 5, 8).eval()
    images = torch.rand(20, 1, 8, 8)
    with pytest.warns(DeprecationWarning, match="feature"):
        old = inception_score(images, classifier=classifier, splits=2)
    assert old == inception_score(images, classifier, splits=2)
    with pytest.raises(TypeError, match="once"):
        inception_score(images, classifier, classifier=classifier)


def test_too_few_samples_are_named():
    feature = LinearFeatures(dimension=8)
    two = torch.rand(2, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    with pytest.warns(MetricReliabilityWarning) as record:
        frechet_distance(two, two.flip(0), feature)
    messages = sorted(str(w.message) for w in record if issubclass(w.category, MetricReliabilityWarning))
    assert len(messages) == 2 and "2 fake images of 8-dimensional" in messages[0] and "2 real images of 8-dimensional" in messages[1]
    with pytest.raises(ValueError, match="fake needs at least 2 images"), pytest.warns(MetricReliabilityWarning, match="2 real"):
        frechet_distance(two, iter([two[:1]]), feature)
    classifier = ImageClassifier(1, 3, 8).eval()
    ten = torch.rand(10, 1, 8, 8, generator=torch.Generator().manual_seed(2))
    with pytest.raises(ValueError, match="splits=20 exceeds the number of images"):
        inception_score(ten, classifier, splits=20)
    with pytest.warns(MetricReliabilityWarning, match="splits <= 5"):
        inception_score(ten, classifier, splits=8)


def test_psnr_data_range_is_checked():
    generator = torch.Generator().manual_seed(3)
    target = torch.rand(4, 1, 8, 8, generator=generator)
    preds = (target + 0.05 * torch.randn(4, 1, 8, 8, generator=generator)).clamp(0, 1)
    with pytest.warns(MetricReliabilityWarning, match="data_range=255"):
        psnr(preds, target, data_range=255)  # [0, 1] images scored as 8-bit: +48 dB
    with pytest.raises(ValueError, match="wider than data_range=1"):
        psnr(255 * preds, 255 * target)
    with pytest.raises(ValueError, match=r"must lie in \[0, 1\]"):
        frechet_distance(iter([target, 2 * target]), target, LinearFeatures(pixels=64))


def test_streamed_fid_memory_does_not_grow_with_the_number_of_images():
    """The metric keeps d + d^2 float64 sums per set, whatever the number of images streamed through it."""
    from torchmetrics.image.fid import FrechetInceptionDistance

    feature = LinearFeatures(dimension=5)
    metric = FrechetInceptionDistance(feature=feature, normalize=True)
    sizes = {name: value.numel() for name, value in metric.metric_state.items()}
    for batch in torch.rand(4000, 1, 4, 4).split(500):
        metric.update(batch, real=True)
    assert {name: value.numel() for name, value in metric.metric_state.items()} == sizes
    assert sum(sizes.values()) == 2 * (5 + 25 + 1)


# the small classifier's dead ReLU features make both covariances singular: the reference's scipy.linalg.sqrtm says so
# (FID's formula holds for singular covariances, and torchmetrics computes it without the matrix square root)
@pytest.mark.filterwarnings("ignore:Matrix is singular:scipy.linalg.LinAlgWarning")
def test_fid_takes_the_classifier_that_inception_score_takes():
    torch.manual_seed(0)
    classifier = ImageClassifier(1, 3, 8).double().eval()
    generator = torch.Generator().manual_seed(4)
    real = torch.rand(100, 1, 8, 8, generator=generator, dtype=torch.float64)
    fake = torch.rand(100, 1, 8, 8, generator=generator, dtype=torch.float64) ** 3
    penultimate = closed_form(real, fake, classifier.features)
    assert abs(frechet_distance(real, fake, classifier) - penultimate) < 1e-6 * penultimate


def test_inception_route_feeds_torchmetrics_convention_or_names_what_is_missing():
    from pseudovideo.metrics import InceptionFeatures

    seen = []

    class Recorder(nn.Module):  # stands in for the InceptionV3 network: records what it is given
        def forward(self, images):
            seen.append(images)
            return images.flatten(1)[:, :4].double()

    features = InceptionFeatures(feature=64, network=Recorder())
    grey = torch.rand(3, 1, 5, 5, generator=torch.Generator().manual_seed(0))
    features(grey)
    assert seen[0].dtype == torch.uint8 and seen[0].shape == (3, 3, 5, 5)  # 1 -> 3 channels, [0, 1] -> bytes
    assert torch.equal(seen[0][:, 2], (grey[:, 0] * 255).byte())
    assert features.num_features == 64
    with pytest.raises(ValueError, match="feature"):
        InceptionFeatures(feature=100, network=Recorder())
    try:
        import torch_fidelity  # noqa: F401
    except ImportError:
        with pytest.raises(ModuleNotFoundError, match="torch-fidelity"):
            InceptionFeatures()
