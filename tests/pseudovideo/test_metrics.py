"""Metrics against closed forms: the Frechet distance of two moment-matched distributions (scipy
sqrtm), its invariances, the Inception Score formula on known class probabilities, and PSNR."""

import numpy as np
import pytest
import scipy.linalg
import torch
from torch import nn

from pseudovideo.metrics import (
    ImageClassifier,
    PenultimateFeatures,
    default_classifier,
    frechet_distance,
    inception_score,
    psnr,
    train_classifier,
)


class LinearFeatures(nn.Module):
    """Features ``A vec(image) + b``: FID of such features depends only on the pixels' two moments."""

    def __init__(self, matrix, shift):
        super().__init__()
        self.matrix, self.shift = matrix, shift
        self.num_features = matrix.shape[0]

    def forward(self, images):
        return images.flatten(1).double() @ self.matrix.T + self.shift


def closed_form_frechet(mean_1, cov_1, mean_2, cov_2):
    root = scipy.linalg.sqrtm(cov_1 @ cov_2).real
    return float(((mean_1 - mean_2) ** 2).sum() + np.trace(cov_1 + cov_2 - 2 * root))


def test_fid_matches_the_closed_form_of_the_feature_moments():
    # real pixels ~ U[0,1]^4, fake pixels ~ U[0.2, 0.7]^4: feature means A m + b, covariances A (w^2/12) A^T
    generator = torch.Generator().manual_seed(0)
    matrix = torch.randn(3, 4, generator=generator, dtype=torch.float64)
    feature = LinearFeatures(matrix, torch.zeros(3, dtype=torch.float64))
    real = torch.rand(200_000, 1, 2, 2, generator=generator, dtype=torch.float64)
    fake = 0.2 + 0.5 * torch.rand(200_000, 1, 2, 2, generator=generator, dtype=torch.float64)
    a = matrix.numpy()
    expected = closed_form_frechet(a @ np.full(4, 0.5), a @ a.T / 12, a @ np.full(4, 0.45), a @ a.T * 0.25 / 12)
    assert abs(frechet_distance(real, fake, feature) / expected - 1) < 0.02  # sampling error ~0.5%
    # and exactly the closed form on the samples' own moments
    f_real, f_fake = feature(real).numpy(), feature(fake).numpy()
    empirical = closed_form_frechet(f_real.mean(0), np.cov(f_real.T), f_fake.mean(0), np.cov(f_fake.T))
    assert abs(frechet_distance(real, fake, feature) - empirical) < 1e-8 * max(1.0, empirical)


def test_fid_invariances():
    generator = torch.Generator().manual_seed(1)
    matrix = torch.randn(5, 16, generator=generator, dtype=torch.float64)
    real = torch.rand(500, 1, 4, 4, generator=generator, dtype=torch.float64)
    fake = torch.rand(500, 1, 4, 4, generator=generator, dtype=torch.float64) ** 2
    base = LinearFeatures(matrix, torch.zeros(5, dtype=torch.float64))
    rotation, _ = torch.linalg.qr(torch.randn(5, 5, generator=generator, dtype=torch.float64))
    rotated = LinearFeatures(rotation @ matrix, torch.full((5,), 3.0, dtype=torch.float64))
    value = frechet_distance(real, fake, base)
    assert value > 0.1
    assert abs(frechet_distance(real, real, base)) < 1e-8
    assert abs(frechet_distance(fake, real, base) - value) < 1e-8 * value  # symmetric
    assert abs(frechet_distance(real, fake, rotated) - value) < 1e-8 * value  # rotation and shift of features


class FixedProbabilities(nn.Module):
    """Returns the log of a stored probability table, row ``i`` for image ``i`` (pixel value = i / N)."""

    def __init__(self, probabilities):
        super().__init__()
        self.log_probabilities = probabilities.log()

    def forward(self, images):
        index = torch.round(images.flatten(1)[:, 0] * (len(self.log_probabilities) - 1)).long()
        return self.log_probabilities[index]


def test_inception_score_matches_its_formula_and_extremes():
    torch.manual_seed(0)
    probabilities = torch.distributions.Dirichlet(torch.full((10,), 0.3, dtype=torch.float64)).sample((200,))
    images = (torch.arange(200, dtype=torch.float64) / 199).view(200, 1, 1, 1)
    marginal = probabilities.mean(0)
    expected = torch.exp((probabilities * (probabilities.log() - marginal.log())).sum(1).mean())
    assert abs(inception_score(images, FixedProbabilities(probabilities), splits=1) - expected) < 1e-7  # softmax renormalises
    confident = torch.eye(10, dtype=torch.float64).repeat(20, 1) * (1 - 1e-9) + 1e-10
    assert abs(inception_score(images, FixedProbabilities(confident), splits=1) - 10) < 1e-6
    uniform = torch.full((200, 10), 0.1, dtype=torch.float64)
    assert abs(inception_score(images, FixedProbabilities(uniform), splits=1) - 1) < 1e-12


def test_psnr_is_the_mean_of_per_image_psnr():
    generator = torch.Generator().manual_seed(2)
    target = torch.rand(4, 1, 8, 8, generator=generator, dtype=torch.float64)
    noise_std = torch.tensor([0.01, 0.05, 0.1, 0.2], dtype=torch.float64).view(4, 1, 1, 1)
    preds = target + noise_std * torch.randn(4, 1, 8, 8, generator=generator, dtype=torch.float64)
    per_image = 10 * torch.log10(1 / (preds - target).pow(2).mean(dim=(1, 2, 3)))
    assert isinstance(psnr(preds, target), float)
    assert abs(psnr(preds, target) - float(per_image.mean())) < 1e-10
    assert abs(psnr(2 * preds, 2 * target, data_range=2.0) - float(per_image.mean())) < 1e-10
    assert abs(psnr(preds, target, batch_size=3) - float(per_image.mean())) < 1e-10  # batches of 3 and 1


def test_default_classifier_is_trained_once_then_loaded_from_cache(tmp_path):
    classifier = default_classifier("digits", cache_dir=tmp_path)
    from pseudovideo.data import load_images

    images, labels = load_images("digits", limit=20_000)  # the classifier's fixed permutation
    held_out = len(images) * 4 // 5  # the classifier never saw the last 20 % of the fixed permutation
    accuracy = (classifier(images[held_out:]).argmax(1) == labels[held_out:]).double().mean()
    assert accuracy > 0.6  # three epochs of a small CNN on 8x8 digits (chance: 0.1)
    assert abs(classifier.test_accuracy - float(accuracy)) < 1e-12
    cached = default_classifier("digits", cache_dir=tmp_path)
    torch.testing.assert_close(cached(images[:50]), classifier(images[:50]))
    assert cached.test_accuracy == classifier.test_accuracy
    (weights,) = tmp_path.glob("digits_x1_*.pt")  # named by a hash of the training data
    assert len(weights.stem.split("_")[-1]) == 16 and weights.with_suffix(".json").is_file()
    default_classifier("digits", cache_dir=tmp_path, downsample=2)  # other data: another file, not the stale one
    assert len(list(tmp_path.glob("digits_x*.pt"))) == 2
    # the metric's features separate digits from their pixel-shuffled copies far more than two halves of digits
    feature = PenultimateFeatures(classifier)
    shuffled = images[:, :, torch.randperm(8)][:, :, :, torch.randperm(8)]
    assert frechet_distance(images[:800], shuffled[800:1600], feature) > 3 * frechet_distance(images[:800], images[800:1600], feature)


def test_default_classifier_trains_on_a_data_set_of_your_own(tmp_path):
    from pseudovideo.data import load_images

    images, labels = load_images("digits")
    train, test = (images[:1000], labels[:1000]), (images[1000:1400], labels[1000:1400])
    classifier = default_classifier("my_digits", cache_dir=tmp_path, data=(train, test))
    reference = train_classifier(*train)  # the same seed and epochs, trained by hand
    torch.testing.assert_close(classifier(test[0]), reference(test[0]))
    accuracy = float((reference(test[0]).argmax(1) == test[1]).double().mean())
    assert classifier.test_accuracy == accuracy and accuracy > 0.6
    (weights,) = tmp_path.glob("my_digits_x1_*.pt")
    cached = default_classifier("my_digits", cache_dir=tmp_path, data=(train, test))
    assert cached is not classifier and cached.test_accuracy == accuracy  # loaded from the file named by the data
    with pytest.raises(TypeError, match="data must be"):
        default_classifier("my_digits", cache_dir=tmp_path, data=train)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: psnr(torch.rand(2, 1, 4, 4), torch.rand(2, 1, 4, 5)), ValueError, "shape"),
        (lambda: frechet_distance(torch.rand(4, 16), torch.rand(4, 1, 4, 4), ImageClassifier()), TypeError, "real"),
        (
            lambda: frechet_distance(torch.rand(4, 1, 4, 4), 2 * torch.rand(4, 1, 4, 4), ImageClassifier()),
            ValueError,
            r"fake must lie in \[0, 1\]",
        ),
        (lambda: frechet_distance(torch.rand(4, 1, 4, 4), torch.rand(4, 1, 4, 4), "features"), TypeError, "feature"),
        (lambda: inception_score(torch.rand(1, 1, 4, 4), ImageClassifier()), ValueError, "at least 2"),
        (
            lambda: frechet_distance(torch.rand(4, 1, 8, 8).double(), torch.rand(4, 1, 8, 8).double(), ImageClassifier()),
            TypeError,
            "float32",
        ),
        (lambda: frechet_distance(torch.rand(4, 3, 8, 8), torch.rand(4, 3, 8, 8), ImageClassifier()), ValueError, "3 channels"),
        (
            lambda: frechet_distance(
                torch.rand(4, 1, 8, 8), torch.rand(4, 3, 8, 8), LinearFeatures(torch.ones(2, 64).double(), torch.zeros(2).double())
            ),
            ValueError,
            "channels",
        ),
        (lambda: inception_score(torch.rand(4, 1, 8, 8).double(), ImageClassifier(), splits=2), TypeError, "float32"),
    ],
)
def test_bad_input_is_named(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_default_classifier_reads_and_hashes_the_data_once_per_process(tmp_path, monkeypatch):
    import pseudovideo.data

    calls = []
    real_loader = pseudovideo.data.load_images
    monkeypatch.setattr(pseudovideo.data, "load_images", lambda *args, **kwargs: calls.append(args) or real_loader(*args, **kwargs))
    first = default_classifier("digits", cache_dir=tmp_path)
    assert len(calls) == 1  # digits: one split, read once
    assert default_classifier("digits", cache_dir=tmp_path) is first and len(calls) == 1
    assert default_classifier("digits", cache_dir=tmp_path, downsample=2) is not first and len(calls) == 2
