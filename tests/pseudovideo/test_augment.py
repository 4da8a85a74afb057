"""Pseudo-video builders against independent references: scipy filters and DCTs, the DDPM
closed-form marginal, and a hand-expanded high-order recursion (Monte Carlo)."""

import math

import numpy as np
import pytest
import scipy.fft
import scipy.ndimage
import torch

from pseudovideo.augment import METHODS, heat_dissipation, make_pseudo_video


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_last_frame_is_the_image_exactly_and_first_is_most_corrupted(method, dtype):
    images = torch.rand(3, 2, 16, 16, generator=torch.Generator().manual_seed(0), dtype=dtype)
    video = make_pseudo_video(images, 5, method, generator=torch.Generator().manual_seed(1))
    assert video.shape == (3, 5, 2, 16, 16) and video.dtype == dtype
    assert torch.equal(video[:, -1], images)
    distance = (video - images[:, None]).pow(2).mean(dim=(0, 2, 3, 4))
    assert torch.all(distance[:-1] > 0) and torch.all(distance[:-2] > distance[1:-1])


def test_blur_matches_scipy_recursive_gaussian_filter():
    # torch's "reflect" padding is scipy's "mirror"; an 11-tap kernel is scipy's radius 5
    images = torch.rand(2, 1, 20, 24, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    video = make_pseudo_video(images, 4, "blur", rate=0.3)
    expected = images[:, 0].numpy()
    for t in range(1, 4):
        std = math.exp(0.3 * (t - 1))
        expected = np.stack([scipy.ndimage.gaussian_filter(e, std, mode="mirror", truncate=5 / std) for e in expected])
        np.testing.assert_allclose(video[:, 3 - t, 0].numpy(), expected, rtol=0, atol=1e-12)


def test_heat_dissipation_matches_scipy_dct_and_keeps_the_mean():
    images = torch.rand(2, 3, 12, 10, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    time = 3.7
    coefficients = scipy.fft.dctn(images.numpy(), axes=(-2, -1), norm="ortho")
    k, l = np.arange(12)[:, None], np.arange(10)[None, :]
    decay = np.exp(-(np.pi**2) * (k**2 / 12**2 + l**2 / 10**2) * time)
    expected = scipy.fft.idctn(coefficients * decay, axes=(-2, -1), norm="ortho")
    result = heat_dissipation(images, time)
    np.testing.assert_allclose(result.numpy(), expected, atol=1e-12)
    torch.testing.assert_close(result.mean(dim=(-2, -1)), images.mean(dim=(-2, -1)))


def test_heat_frames_are_dissipated_image_plus_noise_of_the_given_std():
    images = torch.rand(400, 1, 8, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    video = make_pseudo_video(images, 3, "heat", generator=torch.Generator().manual_seed(1), min_std=1.0, max_std=4.0, noise_std=0.2)
    for frame, std in ((1, 1.0), (0, 4.0)):
        residual = video[:, frame] - heat_dissipation(images, std**2 / 2)
        assert abs(residual.mean()) < 0.01 and abs(residual.std() - 0.2) < 0.004  # 25,600 draws: s.e. ~0.001


def test_markov_first_marginal_is_the_ddpm_closed_form():
    # q(z_{T-t} | x) = N(sqrt(abar_t) x, (1 - abar_t) I), abar_t = prod_{s<=t} (1 - beta_s), beta linear
    x = torch.linspace(-1, 1, 16, dtype=torch.float64).view(1, 1, 4, 4)
    video = make_pseudo_video(x.expand(20_000, -1, -1, -1), 5, "markov_first", generator=torch.Generator().manual_seed(0), beta_end=0.2)
    abar = torch.cumprod(1 - torch.linspace(1e-4, 0.2, 4, dtype=torch.float64), 0)
    for t in range(1, 5):
        frame = video[:, 4 - t]
        torch.testing.assert_close(frame.mean(0), abar[t - 1].sqrt() * x[0], rtol=0, atol=0.015)  # s.e. <= 0.004
        assert abs(frame.var(0).mean() / (1 - abar[t - 1]) - 1) < 0.02  # 320,000 draws: s.e. ~0.0025


def test_markov_high_matches_the_hand_expanded_recursion_for_three_frames():
    # z_2 = sqrt(1-b1) x + sqrt(b1) e1;  z_1 = sqrt(1-b2) (z_2 + x)/2 + sqrt(b2) e2, with b1, b2 = 0.1, 0.4
    x = torch.full((30_000, 1, 1, 1), 0.8, dtype=torch.float64)
    video = make_pseudo_video(x, 3, "markov_high", generator=torch.Generator().manual_seed(0), beta_start=0.1, beta_end=0.4)
    b1, b2 = 0.1, 0.4
    mean_1 = math.sqrt(1 - b2) * (math.sqrt(1 - b1) + 1) / 2 * 0.8
    var_1 = (1 - b2) * b1 / 4 + b2
    cov_12 = math.sqrt(1 - b2) / 2 * b1
    z1, z2 = video[:, 0].flatten(), video[:, 1].flatten()
    assert abs(z1.mean() - mean_1) < 0.015 and abs(z1.var() / var_1 - 1) < 0.03
    assert abs(torch.cov(torch.stack([z1, z2]))[0, 1] - cov_12) < 0.003  # s.e. ~0.0007


@pytest.mark.parametrize("method", ["heat", "markov_first", "markov_high"])
def test_generator_makes_noisy_methods_deterministic(method):
    images = torch.rand(2, 1, 8, 8)
    first = make_pseudo_video(images, 4, method, generator=torch.Generator().manual_seed(3))
    again = make_pseudo_video(images, 4, method, generator=torch.Generator().manual_seed(3))
    other = make_pseudo_video(images, 4, method, generator=torch.Generator().manual_seed(4))
    assert torch.equal(first, again) and not torch.equal(first, other)


@pytest.mark.parametrize(
    "args, kwargs, error, match",
    [
        ((torch.rand(2, 8, 8), 4, "blur"), {}, ValueError, "images"),
        ((torch.ones(2, 1, 8, 8, dtype=torch.int64), 4, "blur"), {}, TypeError, "images"),
        ((np.zeros((2, 1, 8, 8)), 4, "blur"), {}, TypeError, "images"),
        ((torch.rand(2, 1, 8, 8), 1, "blur"), {}, ValueError, "num_frames"),
        ((torch.rand(2, 1, 8, 8), 2.0, "blur"), {}, TypeError, "num_frames"),
        ((torch.rand(2, 1, 8, 8), 4, "noise"), {}, ValueError, "method"),
        ((torch.rand(2, 1, 8, 8), 4, "blur"), {"beta_end": 0.1}, ValueError, "beta_end"),
        ((torch.rand(2, 1, 8, 8), 4, "blur"), {"kernel_size": 4}, ValueError, "kernel_size"),
        ((torch.rand(2, 1, 8, 8), 4, "blur"), {"kernel_size": 21}, ValueError, "kernel_size"),
        ((torch.rand(2, 1, 8, 8), 4, "markov_high"), {"beta_end": 1.5}, ValueError, "beta"),
        ((torch.rand(2, 1, 8, 8), 4, "heat"), {"min_std": 3.0, "max_std": 1.0}, ValueError, "min_std"),
    ],
)
def test_bad_input_is_named(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        make_pseudo_video(*args, **kwargs)
