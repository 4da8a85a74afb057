"""Theorem 5.4.1 in closed form for Gaussian images and the Gaussian-noise pseudo videos of §5.4.

For ``x ~ N(mu, Sigma)`` both Markov builders give frames that are linear in ``x`` and the noises:
``z_s = a_s x + sum_k b_sk eps_k`` with scalar ``a_s``, ``b_sk`` (``frame_coefficients``). Hence
``Cov(z_r, z_s) = a_r a_s Sigma + (b_r . b_s) I``, which the eigenvectors of ``Sigma`` diagonalise:
along an eigenvector with eigenvalue ``lambda`` the frames have the ``T x T`` covariance
``C(lambda) = lambda a a^T + B B^T``. The minimum MSE of predicting ``z_T`` from frames ``S``
(thesis eq. (5.9) / Theorem 5.4.1, attained by ``E[z_T | z_S]``) is, since Gaussian
conditional variances do not depend on the observed values,

    L*(S) = E[tr Var(z_T | z_S)] = sum_lambda  C_TT - C_TS C_SS^{-1} C_ST.

Frames are numbered as in the thesis: ``1`` is the most corrupted, ``T`` the image.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch

from ._validation import check_int, check_tensor
from .augment import DEFAULT_PARAMS, markov_betas

GAUSSIAN_METHODS = ("markov_first", "markov_high")


def frame_coefficients(num_frames: int, method: str, beta_start: float = 1e-4, beta_end: float = 0.05):
    """``(a, B)``: ``z_s = a[s-1] x + sum_k B[s-1, k] eps_k`` for frames ``s = 1..T`` (float64).

    Built from §5.4's recursions written on the coefficients, ``z_T = x`` having ``a = 1, B = 0``.
    """
    _check_method(method)
    check_int(num_frames, "num_frames", low=2)
    betas = markov_betas(num_frames, beta_start, beta_end)
    signal = [torch.tensor(1.0, dtype=torch.float64)]
    noise = [torch.zeros(num_frames - 1, dtype=torch.float64)]
    for t, beta in enumerate(betas, start=1):
        if method == "markov_first":
            parent_signal, parent_noise = signal[-1], noise[-1]
        else:
            parent_signal, parent_noise = torch.stack(signal).mean(0), torch.stack(noise).mean(0)
        fresh = torch.zeros(num_frames - 1, dtype=torch.float64)
        fresh[t - 1] = beta.sqrt()
        signal.append((1 - beta).sqrt() * parent_signal)
        noise.append((1 - beta).sqrt() * parent_noise + fresh)
    return torch.stack(signal[::-1]), torch.stack(noise[::-1])


def frame_covariances(eigenvalues: torch.Tensor, num_frames: int, method: str, **params) -> torch.Tensor:
    """``C(lambda) = lambda a a^T + B B^T`` for each eigenvalue: shape ``(n, T, T)``."""
    signal, noise = frame_coefficients(num_frames, method, **_settings(method, params))
    eigenvalues = eigenvalues.to(torch.float64)
    return eigenvalues[:, None, None] * torch.outer(signal, signal) + noise @ noise.T


def min_mse(covariance: torch.Tensor, num_frames: int, method: str, given: Iterable[int], **params) -> torch.Tensor:
    """``L*(S) = E||z_T - E[z_T | z_S]||^2`` for ``x ~ N(mu, covariance)`` (Theorem 5.4.1), float64.

    ``given`` lists the conditioning frames ``S`` (a subset of ``1..T-1``); empty means ``tr Sigma``.
    """
    eigenvalues, _ = _eigh(covariance)
    given = _check_given(given, num_frames)
    frames = frame_covariances(eigenvalues, num_frames, method, **params)
    last = num_frames - 1
    if not given:
        return frames[:, last, last].sum()
    index = torch.tensor([s - 1 for s in given])
    c_ss = frames[:, index][:, :, index]
    c_ts = frames[:, last, index]
    explained = (c_ts * torch.linalg.solve(c_ss, c_ts.unsqueeze(-1)).squeeze(-1)).sum(-1)
    return (frames[:, last, last] - explained).sum()


def optimal_predictor(mean: torch.Tensor, covariance: torch.Tensor, num_frames: int, method: str,
                      given: Iterable[int], **params):
    """``E[z_T | z_S] = intercept + sum_i weights[i] z_{S_i}``: returns ``(weights (|S|, n, n), intercept (n,))``.

    Per eigenvector the regression weights are ``C_SS^{-1} C_ST``; ``E[z_s] = a_s mu`` fixes the intercept.
    """
    eigenvalues, eigenvectors = _eigh(covariance)
    given = _check_given(given, num_frames)
    if not given:
        raise ValueError("given must name at least one frame for a predictor")
    if not isinstance(mean, torch.Tensor):
        try:
            mean = torch.as_tensor(mean, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError) as error:
            raise TypeError(f"mean must be a tensor or array-like of numbers, got {type(mean).__name__}") from error
    mean = check_tensor(mean, "mean", finite=True).to(torch.float64)
    if mean.shape != eigenvalues.shape:
        raise ValueError(f"mean must have shape {tuple(eigenvalues.shape)}, got {tuple(mean.shape)}")
    frames = frame_covariances(eigenvalues, num_frames, method, **params)
    signal, _ = frame_coefficients(num_frames, method, **_settings(method, params))
    index = torch.tensor([s - 1 for s in given])
    per_direction = torch.linalg.solve(frames[:, index][:, :, index], frames[:, -1, index].unsqueeze(-1)).squeeze(-1)
    weights = torch.stack([eigenvectors @ torch.diag(w) @ eigenvectors.T for w in per_direction.T])
    intercept = mean - sum(w @ (signal[s] * mean) for w, s in zip(weights, index.tolist()))
    return weights, intercept


def context_gain_table(covariance: torch.Tensor, frame_counts: Iterable[int], methods=GAUSSIAN_METHODS, **params):
    """Rows ``(method, T, L*({T-1}), L*({1..T-1}), relative gain)`` for each method and ``T``.

    The relative gain ``1 - L*(all earlier) / L*(previous only)`` is 0 for first-order Markov videos.
    """
    methods = (methods,) if isinstance(methods, str) else methods
    if not isinstance(frame_counts, Iterable) or not isinstance(methods, Iterable):
        raise TypeError("frame_counts and methods must be iterables (e.g. [4, 8] and ('markov_first',)), got "
                        f"{type(frame_counts).__name__} and {type(methods).__name__}")
    frame_counts = list(frame_counts)
    rows = []
    for method in methods:
        for num_frames in frame_counts:
            check_int(num_frames, "frame_counts entries", low=2)
            previous_only = min_mse(covariance, num_frames, method, [num_frames - 1], **params).item()
            all_earlier = min_mse(covariance, num_frames, method, range(1, num_frames), **params).item()
            # nothing left to predict (a zero covariance): the earlier frames cannot help either
            gain = 1 - all_earlier / previous_only if previous_only > 0 else 0.0
            rows.append((method, num_frames, previous_only, all_earlier, gain))
    return rows


def _settings(method: str, params: dict) -> dict:
    _check_method(method)
    unknown = set(params) - set(DEFAULT_PARAMS[method])
    if unknown:
        raise ValueError(f"unknown parameters {sorted(unknown)} for method {method!r}")
    return {**DEFAULT_PARAMS[method], **params}


def _check_method(method: str) -> None:
    if not isinstance(method, str) or method not in GAUSSIAN_METHODS:
        raise ValueError(f"method must be one of {GAUSSIAN_METHODS} (linear-Gaussian builders), got {method!r}")


def _check_given(given, num_frames: int) -> list[int]:
    if isinstance(given, (str, bytes)) or not isinstance(given, Iterable):
        raise TypeError(f"given must be an iterable of frame numbers (e.g. [1, 2]), got {type(given).__name__}")
    given = list(given)
    for s in given:
        if isinstance(s, torch.Tensor) and s.dim() == 0 and not s.is_floating_point():
            s = s.item()
        check_int(s, "given frame numbers", low=None)
    given = sorted(set(int(s) for s in given))
    if any(not 1 <= s < num_frames for s in given):
        raise ValueError(f"given frames must lie in 1..{num_frames - 1} (frames before z_T), got {given}")
    return given


def _eigh(covariance: torch.Tensor):
    if not isinstance(covariance, torch.Tensor) or covariance.dim() != 2 or covariance.shape[0] != covariance.shape[1]:
        raise ValueError("covariance must be a square (n, n) torch.Tensor")
    check_tensor(covariance, "covariance", non_empty=True, finite=True)
    if covariance.dtype == torch.bool or covariance.is_complex():
        raise TypeError(f"covariance must be a real tensor, got {covariance.dtype}")
    covariance = covariance.to(torch.float64)
    if not torch.allclose(covariance, covariance.T, rtol=1e-6, atol=1e-10):
        raise ValueError("covariance must be symmetric")
    eigenvalues, eigenvectors = torch.linalg.eigh(covariance)
    if eigenvalues.min() < -1e-8 * eigenvalues.abs().max().clamp_min(1e-300):
        raise ValueError(f"covariance must be positive semi-definite (smallest eigenvalue {eigenvalues.min():.3g})")
    return eigenvalues.clamp_min(0), eigenvectors
