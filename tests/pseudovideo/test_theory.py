"""Theorem 5.4.1 in closed form against the DDPM marginal, Monte-Carlo least squares on videos sampled
by ``make_pseudo_video``, and real-image covariances (scikit-learn digits)."""

import itertools

import pytest
import torch

from pseudovideo.augment import make_pseudo_video
from pseudovideo.data import load_images
from pseudovideo.theory import context_gain_table, frame_coefficients, min_mse, optimal_predictor


def random_covariance(n, seed):
    factor = torch.randn(n, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return factor @ factor.T / n + 0.1 * torch.eye(n, dtype=torch.float64)


def digits_covariance():
    images, _ = load_images("digits")
    pixels = (2 * images - 1).flatten(1).double()  # [-1, 1], the scale the thesis's noise is meant for
    return torch.cov(pixels.T)


def test_first_order_coefficients_are_the_ddpm_marginal():
    signal, noise = frame_coefficients(6, "markov_first", beta_end=0.3)
    abar = torch.cumprod(1 - torch.linspace(1e-4, 0.3, 5, dtype=torch.float64), 0).flip(0)
    torch.testing.assert_close(signal[:-1], abar.sqrt())
    torch.testing.assert_close(noise[:-1].pow(2).sum(1), 1 - abar)
    assert signal[-1] == 1 and torch.all(noise[-1] == 0)


@pytest.mark.parametrize("method", ["markov_first", "markov_high"])
def test_closed_form_matches_monte_carlo_least_squares(method):
    # sample x ~ N(mu, Sigma) (n = 3), build videos with the builder itself, regress z_T on [z_S, 1]
    n, frames, beta_end, num = 3, 4, 0.3, 100_000
    mean = torch.tensor([0.5, -1.0, 0.2], dtype=torch.float64)
    covariance = random_covariance(n, 0)
    x = torch.distributions.MultivariateNormal(mean, covariance).sample((num,))
    video = make_pseudo_video(x.view(num, 1, 1, n), frames, method, generator=torch.Generator().manual_seed(1), beta_end=beta_end).view(
        num, frames, n
    )
    given = [1, 2, 3]
    design = torch.cat([video[:, [s - 1 for s in given]].flatten(1), torch.ones(num, 1, dtype=torch.float64)], 1)
    solution = torch.linalg.lstsq(design, video[:, -1]).solution
    residual = (video[:, -1] - design @ solution).pow(2).sum(1).mean()
    expected = min_mse(covariance, frames, method, given, beta_end=beta_end)
    assert abs(residual / expected - 1) < 0.02  # 3e5 squared residuals: relative s.e. ~0.5%
    weights, intercept = optimal_predictor(mean, covariance, frames, method, given, beta_end=beta_end)
    fitted = solution[:-1].T.reshape(n, len(given), n).permute(1, 0, 2)  # (frame, output, input)
    torch.testing.assert_close(fitted, weights, rtol=0, atol=0.03)
    torch.testing.assert_close(solution[-1], intercept, rtol=0, atol=0.03)


def test_first_order_frames_before_the_previous_add_nothing_on_real_images():
    covariance = digits_covariance()
    for frames in (4, 8):
        previous = min_mse(covariance, frames, "markov_first", [frames - 1])
        every = min_mse(covariance, frames, "markov_first", range(1, frames))
        torch.testing.assert_close(every, previous, rtol=1e-9, atol=0)
        weights, _ = optimal_predictor(torch.zeros(64), covariance, frames, "markov_first", range(1, frames))
        assert weights[:-1].abs().max() < 1e-8  # E[z_T | z_{1:T-1}] uses z_{T-1} only


def test_high_order_frames_give_a_strict_gain_that_grows_with_the_number_of_frames():
    rows = context_gain_table(digits_covariance(), range(2, 9), methods=["markov_high"])
    gains = torch.tensor([row[4] for row in rows])
    assert gains[0] == 0  # T = 2: z_{T-1} is the only earlier frame
    # with the thesis's schedule the gain is small (0.05% at T = 3, 0.4% at T = 8) but eight orders
    # of magnitude above the float64 rounding that the first-order test tolerates
    assert torch.all(gains[1:] > 1e-4) and torch.all(gains[2:] > gains[1:-1])


def test_more_conditioning_frames_never_hurt():
    covariance = random_covariance(5, 2)
    for subset in itertools.combinations(range(1, 6), 3):
        smaller = min_mse(covariance, 6, "markov_high", subset[:2])
        assert min_mse(covariance, 6, "markov_high", subset) <= smaller * (1 + 1e-12)
    torch.testing.assert_close(min_mse(covariance, 6, "markov_high", []), covariance.trace())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"covariance": torch.ones(2, 3), "num_frames": 4, "method": "markov_high", "given": [1]}, "covariance"),
        (
            {"covariance": torch.tensor([[1.0, 2.0], [2.0, 1.0]]), "num_frames": 4, "method": "markov_high", "given": [1]},
            "positive semi-definite",
        ),
        ({"covariance": torch.eye(2), "num_frames": 4, "method": "blur", "given": [1]}, "method"),
        ({"covariance": torch.eye(2), "num_frames": 4, "method": "markov_high", "given": [4]}, "given"),
        ({"covariance": torch.eye(2), "num_frames": 1, "method": "markov_high", "given": []}, "num_frames"),
        ({"covariance": torch.eye(2), "num_frames": 4, "method": "markov_high", "given": [1], "rate": 0.1}, "rate"),
    ],
)
def test_bad_input_is_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        min_mse(**kwargs)


def test_closed_form_is_the_best_linear_mse_on_real_digit_videos():
    # real (non-Gaussian) digits: least squares over pseudo videos of the actual images reaches the closed
    # form evaluated at their empirical mean and covariance (a linear predictor's MSE needs only two moments)
    images, _ = load_images("digits")
    x = (2 * images - 1).double().repeat(20, 1, 1, 1)  # 20 noise draws per digit: 35,940 videos
    video = make_pseudo_video(x, 4, "markov_high", generator=torch.Generator().manual_seed(0), beta_end=0.3)
    flat = video.flatten(2)
    design = torch.cat([flat[:, :3].flatten(1), torch.ones(len(flat), 1, dtype=torch.float64)], 1)
    solution = torch.linalg.lstsq(design, flat[:, -1]).solution
    residual = (flat[:, -1] - design @ solution).pow(2).sum(1).mean()
    expected = min_mse(torch.cov(x.flatten(1).T), 4, "markov_high", [1, 2, 3], beta_end=0.3)
    # 193 regressors per output fitted on 35,940 rows: in-sample residual is low by ~193/35,940 = 0.5%
    assert abs(residual / expected - 1) < 0.03
