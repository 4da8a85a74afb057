"""Corrupted test sets: each corruption against an independent reference."""

import math

import numpy as np
import pytest
import torch
from scipy import ndimage

from gpytorch_sgpa.data import CORRUPTIONS, SEVERITIES, corrupt
from gpytorch_sgpa.data.corruptions import SEVERITY_PARAMETERS, gaussian_blur, rotate


def _images(n=6, size=28, seed=0):
    return torch.rand(n, 1, size, size, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _blobs(n=6, size=28, seed=0):
    """Smooth off-centre Gaussian blobs: every corruption moves them further as severity grows."""
    generator = torch.Generator().manual_seed(seed)
    centres = 8 + 12 * torch.rand(n, 2, generator=generator, dtype=torch.float64)
    grid = torch.arange(size, dtype=torch.float64)
    rows = (grid.view(1, -1, 1) - centres[:, 0].view(-1, 1, 1)) ** 2
    cols = (grid.view(1, 1, -1) - centres[:, 1].view(-1, 1, 1)) ** 2
    return torch.exp(-(rows + cols) / (2 * 3.0**2)).unsqueeze(1)


def test_deterministic_per_seed_in_range_and_growing_with_severity():
    images = _blobs()
    for corruption in CORRUPTIONS:
        distances = []
        for severity in SEVERITIES:
            first = corrupt(images, corruption, severity, seed=3)
            assert torch.equal(first, corrupt(images, corruption, severity, seed=3))
            assert first.shape == images.shape and first.min() >= 0 and first.max() <= 1
            distances.append(float((first - images).square().mean()))
        assert all(a < b for a, b in zip(distances, distances[1:])), (corruption, distances)
    for corruption in ("gaussian_noise", "rotation"):  # the random ones: another seed, another set
        assert not torch.equal(corrupt(images, corruption, 3, seed=3), corrupt(images, corruption, 3, seed=4))


def test_gaussian_noise_has_the_severity_standard_deviation():
    images = torch.full((200, 1, 28, 28), 0.5, dtype=torch.float64)
    sigma = SEVERITY_PARAMETERS["gaussian_noise"][0]  # 0.08: clipping at 0.5 ± 6σ never happens
    residual = corrupt(images, "gaussian_noise", 1) - images
    # 156,800 draws: the sample std has relative standard error 1/sqrt(2n) = 0.18%; allow 1%
    assert abs(float(residual.std()) / sigma - 1) < 0.01 and abs(float(residual.mean())) < 4 * sigma / math.sqrt(residual.numel())


@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0])
def test_blur_equals_scipy_gaussian_filter(sigma):
    images = _images(2)
    expected = np.stack([ndimage.gaussian_filter(im[0].numpy(), sigma, mode="nearest", truncate=3.0) for im in images])
    torch.testing.assert_close(gaussian_blur(images, sigma)[:, 0], torch.from_numpy(expected), rtol=1e-12, atol=1e-12)


def test_contrast_keeps_each_mean_and_scales_deviations():
    images = _images() * 0.5 + 0.25  # no clipping at any contrast factor below 1
    for severity, factor in zip(SEVERITIES, SEVERITY_PARAMETERS["contrast"]):
        out = corrupt(images, "contrast", severity)
        mean = images.mean((1, 2, 3), keepdim=True)
        torch.testing.assert_close(out, mean + factor * (images - mean), rtol=0, atol=1e-14)


def test_rotation_by_90_degrees_is_rot90_and_pixelate_is_block_means():
    images = _images(3)
    turned = rotate(images, torch.full((3,), 90.0, dtype=torch.float64))
    torch.testing.assert_close(turned, torch.rot90(images, 1, dims=(-2, -1)), rtol=0, atol=1e-12)
    # severity 1 keeps half the side: 28 -> 14, so each 2 x 2 block becomes its mean
    blocks = images.reshape(3, 1, 14, 2, 14, 2).mean((3, 5))
    expected = blocks.repeat_interleave(2, -2).repeat_interleave(2, -1)
    torch.testing.assert_close(corrupt(images, "pixelate", 1), expected, rtol=0, atol=1e-14)
    same = images[:1].expand(16, -1, -1, -1)  # one image, 16 draws of the rotation's sign
    out = corrupt(same, "rotation", 2)
    plus, minus = (rotate(same[:1], torch.tensor([angle], dtype=torch.float64)) for angle in (30.0, -30.0))
    is_plus = [torch.allclose(o, plus[0].clamp(0, 1)) for o in out]
    is_minus = [torch.allclose(o, minus[0].clamp(0, 1)) for o in out]
    assert all(p != m for p, m in zip(is_plus, is_minus)) and any(is_plus) and any(is_minus)


def test_bad_arguments_are_named():
    images = _images(1)
    with pytest.raises(ValueError, match="corruption"):
        corrupt(images, "snow", 1)
    with pytest.raises(ValueError, match="severity"):
        corrupt(images, "blur", 0)
    with pytest.raises(ValueError, match="images"):
        corrupt(images[0], "blur", 1)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        corrupt(images * 255, "blur", 1)
