"""Theorem 5.4.1 beyond the default schedule: user beta schedules, heat dissipation (dense solver), the
eigen solver against the dense joint-Gaussian computation, and per-eigendirection predictors."""

import itertools

import pytest
import torch

from pseudovideo.augment import make_pseudo_video
from pseudovideo.theory import EigenPredictor, context_gain_table, frame_operators, min_mse, optimal_predictor


def random_covariance(n, seed):
    factor = torch.randn(n, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return factor @ factor.T / n + 0.1 * torch.eye(n, dtype=torch.float64)


def least_squares(video, given):
    """Monte-Carlo reference: the residual of regressing z_T on [z_S, 1] over sampled videos ``(N, T, n)``."""
    design = torch.cat([video[:, [s - 1 for s in given]].flatten(1), torch.ones(len(video), 1, dtype=torch.float64)], 1)
    solution = torch.linalg.lstsq(design, video[:, -1]).solution
    return (video[:, -1] - design @ solution).pow(2).sum(1).mean(), solution


def gaussian_images(mean, covariance, num, shape, seed):
    torch.manual_seed(seed)
    return torch.distributions.MultivariateNormal(mean, covariance).sample((num,)).view(num, *shape)


def test_user_beta_schedules_drive_builder_and_theory():
    betas = [0.3, 0.05, 0.2]  # not monotone: any schedule
    x = torch.randn(5, 1, 2, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    video = make_pseudo_video(x, 4, "markov_first", generator=torch.Generator().manual_seed(1), betas=betas)
    noise = torch.Generator().manual_seed(1)
    expected = [x]
    for beta in betas:
        expected.append((1 - beta) ** 0.5 * expected[-1] + beta**0.5 * torch.randn(x.shape, generator=noise, dtype=torch.float64))
    torch.testing.assert_close(video, torch.stack(expected[::-1], 1))
    covariance = random_covariance(4, 1)
    linear = torch.linspace(1e-4, 0.05, 7, dtype=torch.float64)
    torch.testing.assert_close(
        min_mse(covariance, 8, "markov_high", [5, 7], betas=linear), min_mse(covariance, 8, "markov_high", [5, 7]), rtol=1e-12, atol=0
    )


@pytest.mark.parametrize("method", ["markov_first", "markov_high"])
def test_custom_schedule_matches_monte_carlo(method):
    n, frames, num, betas = 3, 4, 100_000, [0.4, 0.1, 0.25]
    mean = torch.tensor([0.5, -1.0, 0.2], dtype=torch.float64)
    covariance = random_covariance(n, 0)
    x = gaussian_images(mean, covariance, num, (1, 1, n), 0)
    video = make_pseudo_video(x, frames, method, generator=torch.Generator().manual_seed(1), betas=betas).view(num, frames, n)
    residual, _ = least_squares(video, [1, 2, 3])
    assert abs(residual / min_mse(covariance, frames, method, [1, 2, 3], betas=betas) - 1) < 0.02


@pytest.mark.parametrize("method", ["markov_first", "markov_high"])
def test_eigen_solver_equals_the_dense_joint_gaussian(method):
    covariance, mean = random_covariance(6, 2), torch.linspace(-0.5, 0.5, 6, dtype=torch.float64)
    for given in ([3], [1, 3], [1, 2, 3], [2]):
        eigen = min_mse(covariance, 4, method, given, beta_end=0.3)
        dense = min_mse(covariance, 4, method, given, beta_end=0.3, solver="dense")
        torch.testing.assert_close(eigen, dense, rtol=1e-10, atol=0)
        w_eigen, b_eigen = optimal_predictor(mean, covariance, 4, method, given, beta_end=0.3)
        w_dense, b_dense = optimal_predictor(mean, covariance, 4, method, given, beta_end=0.3, solver="dense")
        torch.testing.assert_close(w_eigen, w_dense, rtol=0, atol=1e-10)
        torch.testing.assert_close(b_eigen, b_dense, rtol=0, atol=1e-10)


def test_per_direction_predictor_is_the_dense_one_in_less_memory():
    covariance, mean = random_covariance(5, 3), torch.randn(5, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    weights, intercept = optimal_predictor(mean, covariance, 6, "markov_high", [2, 4, 5])
    compact = optimal_predictor(mean, covariance, 6, "markov_high", [2, 4, 5], per_direction=True)
    assert isinstance(compact, EigenPredictor) and compact.weights.shape == (3, 5)
    torch.testing.assert_close(compact.dense_weights(), weights, rtol=0, atol=1e-12)
    torch.testing.assert_close(compact.intercept, intercept, rtol=0, atol=1e-12)
    frames = torch.randn(7, 3, 5, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    torch.testing.assert_close(compact.predict(frames), intercept + torch.einsum("snm,bsm->bn", weights, frames))


def test_heat_operators_are_the_builder_without_noise():
    images = torch.randn(3, 2, 4, 5, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    video = make_pseudo_video(images, 4, "heat", noise_std=0.0)
    operators, noise = frame_operators(4, "heat", (2, 4, 5))
    torch.testing.assert_close(torch.einsum("snm,bm->bsn", operators, images.flatten(1)), video.flatten(2))
    # frame z_{T-t} (row T-t) has its own noise eps_t (column t): an anti-diagonal; z_T none
    assert torch.equal(noise[:-1].flip(0), 0.01 * torch.eye(3, dtype=torch.float64)) and noise[-1].eq(0).all()


def test_heat_min_mse_and_predictor_match_monte_carlo():
    shape, frames, num = (1, 2, 2), 4, 200_000
    n = 4
    mean, covariance = torch.tensor([0.3, -0.2, 0.1, 0.0], dtype=torch.float64), random_covariance(n, 6)
    params = dict(min_std=0.5, max_std=3.0, noise_std=0.3)
    x = gaussian_images(mean, covariance, num, shape, 7)
    video = make_pseudo_video(x, frames, "heat", generator=torch.Generator().manual_seed(8), **params).view(num, frames, n)
    for given in ([3], [1, 2, 3]):
        residual, solution = least_squares(video, given)
        expected = min_mse(covariance, frames, "heat", given, image_shape=shape, **params)
        assert abs(residual / expected - 1) < 0.02  # 8e5 squared residuals: relative s.e. ~0.3 %
        weights, intercept = optimal_predictor(mean, covariance, frames, "heat", given, image_shape=shape, **params)
        fitted = solution[:-1].T.reshape(n, len(given), n).permute(1, 0, 2)
        torch.testing.assert_close(fitted, weights, rtol=0, atol=0.03)
        torch.testing.assert_close(solution[-1], intercept, rtol=0, atol=0.03)
    # heat frames are not first-order Markov: every earlier frame helps
    assert min_mse(covariance, frames, "heat", [1, 2, 3], image_shape=shape, **params) < 0.99 * min_mse(
        covariance, frames, "heat", [3], image_shape=shape, **params
    )


def test_context_gain_table_covers_heat():
    covariance = random_covariance(9, 9)
    rows = context_gain_table(covariance, [3, 4], ("markov_first", "heat"), image_shape=(3, 3))
    assert [(r[0], r[1]) for r in rows] == list(itertools.product(("markov_first", "heat"), (3, 4)))
    assert all(abs(r[4]) < 1e-9 for r in rows[:2]) and all(r[4] > 0 for r in rows[2:])


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda c: min_mse(c, 4, "heat", [3]), ValueError, "image_shape"),
        (lambda c: min_mse(c, 4, "heat", [3], image_shape=(3, 2)), ValueError, "6 pixels"),
        (lambda c: min_mse(c, 4, "heat", [3], image_shape=(2, 2), solver="eigen"), ValueError, "dense"),
        (lambda c: min_mse(c, 4, "markov_first", [3], solver="fast"), ValueError, "solver"),
        (lambda c: min_mse(c, 4, "markov_first", [3], betas=[0.1, 0.2]), ValueError, "3 values"),
        (lambda c: min_mse(c, 4, "markov_first", [3], betas=[0.1, 0.2, 1.0]), ValueError, r"\(0, 1\)"),
        (
            lambda c: optimal_predictor(torch.zeros(4), c, 4, "heat", [3], image_shape=(2, 2), per_direction=True),
            ValueError,
            "per_direction",
        ),
        (lambda c: make_pseudo_video(torch.zeros(1, 1, 2, 2), 4, "markov_high", betas=[0.1]), ValueError, "betas"),
    ],
)
def test_bad_theory_arguments_are_named(call, error, match):
    with pytest.raises(error, match=match):
        call(random_covariance(4, 0))
