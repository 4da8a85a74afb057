r"""Theorem 5.4.1 in closed form for Gaussian images and every linear-Gaussian pseudo-video builder.

The thesis's Theorem 5.4.1 states that the minimum mean squared error of predicting the image
:math:`z_T = x` from a set :math:`S` of its pseudo-video frames is attained by the conditional mean
:math:`\mathbb{E}[z_T \mid z_S]` (eq. (5.9)), so that conditioning on more frames never increases it.
For :math:`x \sim \mathcal{N}(\mu, \Sigma)` the frames of the Markov builders (§5.4) and of heat
dissipation (§5.2.1) are linear in :math:`x` and Gaussian noises,
:math:`z_s = A_s x + \sum_k b_{sk} \epsilon_k` with :math:`\epsilon_k \sim \mathcal{N}(0, I)`.
Hence the frames are jointly Gaussian with

.. math::

    \operatorname{Cov}(z_r, z_s) = A_r \Sigma A_s^\top + (b_r \cdot b_s) I,

and, since Gaussian conditional variances do not depend on the observed values, that minimum is

.. math::

    L^*(S) = \mathbb{E}\left[\operatorname{tr} \operatorname{Var}(z_T \mid z_S)\right]
           = \operatorname{tr}\left(C_{TT} - C_{TS} C_{SS}^{-1} C_{ST}\right).

Two solvers (``solver=``):

* ``"eigen"`` (Markov builders, the default for them): :math:`A_s = a_s I` is a scalar, so the
  eigenvectors of :math:`\Sigma` diagonalise every block; along an eigenvector with eigenvalue
  :math:`\lambda` the frames have the :math:`T \times T` covariance :math:`C(\lambda) = \lambda a a^\top + B B^\top` and
  :math:`L^*(S) = \sum_\lambda C_{TT} - C_{TS} C_{SS}^{-1} C_{ST}`: :math:`n` problems of size :math:`|S|`.
* ``"dense"`` (any builder, the only one for heat, whose :math:`A_s = F_h(\tau_s)` are diagonal in the
  DCT basis and not in :math:`\Sigma`'s): the :math:`|S| n \times |S| n` joint covariance, solved by Cholesky.

The Markov schedules are ``beta_start``/``beta_end`` (linear) or any ``betas``; heat takes its
builder's ``min_std``/``max_std``/``noise_std`` and needs ``image_shape`` (``(H, W)`` or
``(C, H, W)``, the layout of ``Sigma``'s :math:`n = C H W` pixels, channel-major as ``images.flatten(1)``).
Frames are numbered as in the thesis: ``1`` is the most corrupted, ``T`` the image.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

import torch

from probseq._validation import check_int, check_tensor

from ._heat import heat_time
from .augment import DEFAULT_PARAMS, heat_dissipation, markov_betas

#: The Markov builders, whose frames the ``"eigen"`` solver handles (scalar ``A_s``).
GAUSSIAN_METHODS = ("markov_first", "markov_high")
#: Every linear-Gaussian builder: the Markov ones and heat dissipation (``"dense"`` solver).
LINEAR_GAUSSIAN_METHODS = (*GAUSSIAN_METHODS, "heat")
#: The ``solver=`` values: ``"auto"`` (eigen for the Markov builders, dense for heat), ``"eigen"``, ``"dense"``.
SOLVERS = ("auto", "eigen", "dense")


class EigenPredictor(NamedTuple):
    r""":math:`\mathbb{E}[z_T \mid z_S] = \mathrm{intercept} + \sum_i V \operatorname{diag}(\mathrm{weights}_i) V^\top z_{S_i}`: the
    optimal predictor of a Markov builder kept per eigendirection (:math:`V` = ``eigenvectors`` of :math:`\Sigma`, ``(n, n)``;
    ``weights`` ``(|S|, n)``) instead of :math:`|S|` dense :math:`n \times n` matrices.

    :param eigenvectors: ``(n, n)``, the eigenvectors :math:`V` of the pixel covariance, one per column.
    :param weights: ``(|S|, n)``, each given frame's regression weight along each eigenvector.
    :param intercept: ``(n,)``, the prediction's constant term.
    """

    eigenvectors: torch.Tensor
    weights: torch.Tensor
    intercept: torch.Tensor

    def dense_weights(self) -> torch.Tensor:
        r"""The ``(|S|, n, n)`` matrices :math:`V \operatorname{diag}(\mathrm{weights}_i) V^\top` (what ``per_direction=False`` returns)."""
        return torch.stack([(self.eigenvectors * w) @ self.eigenvectors.T for w in self.weights])

    def predict(self, frames: torch.Tensor) -> torch.Tensor:
        r""":math:`\mathbb{E}[z_T \mid z_S]` for ``frames`` ``(..., |S|, n)`` (the given frames in increasing order), ``(..., n)``.

        :param frames: ``(..., |S|, n)``: the given frames, flattened, in increasing frame order.
        """
        coordinates = frames.to(self.eigenvectors.dtype) @ self.eigenvectors  # (..., |S|, n): V^T z per frame
        return self.intercept + (coordinates * self.weights).sum(-2) @ self.eigenvectors.T


def frame_coefficients(num_frames: int, method: str, beta_start: float = 1e-4, beta_end: float = 0.05, betas=None):
    r"""``(a, B)``: :math:`z_s = a_{s-1} x + \sum_k B_{s-1, k} \varepsilon_k` for frames :math:`s = 1, \dots, T` (float64).

    Built from §5.4's recursions written on the coefficients, :math:`z_T = x` having :math:`a = 1, B = 0`
    (Markov builders; the schedule is linear from ``beta_start`` to ``beta_end`` unless ``betas``).

    :param num_frames: the number of frames :math:`T \ge 2`.
    :param method: a Markov builder, one of :data:`GAUSSIAN_METHODS`.
    :param beta_start: the first noise variance of the linear schedule.
    :param beta_end: the last noise variance of the linear schedule.
    :param betas: an explicit schedule of :math:`T - 1` values in :math:`(0, 1)` (``None``: linear).
    """
    _check_method(method, GAUSSIAN_METHODS)
    check_int(num_frames, "num_frames", low=2)
    schedule = markov_betas(num_frames, beta_start, beta_end, betas)
    signal = [torch.tensor(1.0, dtype=torch.float64)]
    noise = [torch.zeros(num_frames - 1, dtype=torch.float64)]
    for t, beta in enumerate(schedule, start=1):
        if method == "markov_first":
            parent_signal, parent_noise = signal[-1], noise[-1]
        else:
            parent_signal, parent_noise = torch.stack(signal).mean(0), torch.stack(noise).mean(0)
        fresh = torch.zeros(num_frames - 1, dtype=torch.float64)
        fresh[t - 1] = beta.sqrt()
        signal.append((1 - beta).sqrt() * parent_signal)
        noise.append((1 - beta).sqrt() * parent_noise + fresh)
    return torch.stack(signal[::-1]), torch.stack(noise[::-1])


def frame_operators(num_frames: int, method: str, image_shape, **params):
    r"""``(A, B)``: :math:`z_s = A_{s-1} x + \sum_k B_{s-1, k} \varepsilon_k` with ``A`` ``(T, n, n)`` and ``B`` ``(T, T-1)``.

    Markov builders: :math:`A_s = a_s I` (:func:`frame_coefficients`). Heat:
    :math:`z_{T-t} = F_h(\tau_t) z_T + \mathrm{noise\_std}\, \varepsilon_t` with :math:`\tau_t = s_t^2 / 2` and :math:`s_t`
    log-spaced from ``min_std`` to ``max_std`` (``pseudovideo.augment``); :math:`F_h` acts on each channel of the ``image_shape`` pixels.

    :param num_frames: the number of frames :math:`T \ge 2`.
    :param method: one of :data:`LINEAR_GAUSSIAN_METHODS`.
    :param image_shape: ``(H, W)`` or ``(C, H, W)``, the layout of the :math:`n = C H W` pixels.
    """
    _check_method(method, LINEAR_GAUSSIAN_METHODS)
    check_int(num_frames, "num_frames", low=2)
    channels, height, width = _check_image_shape(image_shape)
    n = channels * height * width
    settings = _settings(method, params)
    if method != "heat":
        signal, noise = frame_coefficients(num_frames, method, **settings)
        return signal[:, None, None] * torch.eye(n, dtype=torch.float64), noise
    stds = torch.logspace(math.log10(settings["min_std"]), math.log10(settings["max_std"]), num_frames - 1, dtype=torch.float64)
    basis = torch.eye(height * width, dtype=torch.float64).view(-1, height, width)
    operators = [torch.eye(n, dtype=torch.float64)]
    noise = torch.zeros(num_frames, num_frames - 1, dtype=torch.float64)
    for t, std in enumerate(stds.tolist(), start=1):  # frame z_{T-t}: F_h(tau_t) is symmetric
        heat = heat_dissipation(basis, heat_time(std)).reshape(height * width, height * width)
        operators.append(torch.block_diag(*[heat] * channels))
        noise[num_frames - 1 - t, t - 1] = settings["noise_std"]
    return torch.stack(operators[::-1]), noise


def frame_covariances(eigenvalues: torch.Tensor, num_frames: int, method: str, **params) -> torch.Tensor:
    r""":math:`C(\lambda) = \lambda a a^\top + B B^\top` for each eigenvalue: shape ``(n, T, T)`` (Markov builders).

    :param eigenvalues: ``(n,)`` eigenvalues :math:`\lambda` of the pixel covariance.
    :param num_frames: the number of frames :math:`T \ge 2`.
    :param method: a Markov builder, one of :data:`GAUSSIAN_METHODS`.
    """
    _check_method(method, GAUSSIAN_METHODS)
    signal, noise = frame_coefficients(num_frames, method, **_settings(method, params))
    eigenvalues = eigenvalues.to(torch.float64)
    return eigenvalues[:, None, None] * torch.outer(signal, signal) + noise @ noise.T


def min_mse(
    covariance: torch.Tensor, num_frames: int, method: str, given: Iterable[int], *, solver: str = "auto", image_shape=None, **params
) -> torch.Tensor:
    r""":math:`L^*(S) = \mathbb{E}\|z_T - \mathbb{E}[z_T \mid z_S]\|^2` for :math:`x \sim \mathcal{N}(\mu, \Sigma)`, :math:`\Sigma` =
    ``covariance`` (Theorem 5.4.1), float64.

    ``given`` lists the conditioning frames :math:`S` (a subset of :math:`\{1, \dots, T-1\}`); empty means
    :math:`\operatorname{tr} \Sigma`.
    ``solver``: ``"eigen"``, ``"dense"`` or ``"auto"`` (eigen for the Markov builders, dense for heat);
    ``image_shape`` is needed for heat; ``params`` are the builder's (``betas`` for any schedule).

    :param covariance: ``(n, n)`` symmetric positive semi-definite pixel covariance :math:`\Sigma`.
    :param num_frames: the number of frames :math:`T \ge 2`.
    :param method: one of :data:`LINEAR_GAUSSIAN_METHODS`.
    :param given: the conditioning frames :math:`S`, numbers in :math:`1, \dots, T-1`.
    :param solver: one of :data:`SOLVERS` (module docstring).
    :param image_shape: ``(H, W)`` or ``(C, H, W)`` of the pixels; heat only (``None`` otherwise).
    """
    solver = _check_solver(solver, method)
    given = _check_given(given, num_frames)
    if solver == "dense":
        covariance = _check_covariance(covariance)
        if not given:
            return torch.diagonal(covariance).sum()
        operators, noise = frame_operators(num_frames, method, _image_shape(image_shape, method, covariance), **params)
        c_ss, c_ts = _dense_blocks(covariance, operators, noise, given)
        return torch.diagonal(covariance).sum() - (c_ts * _solve(c_ss, c_ts.T).T).sum()
    _no_image_shape_needed(image_shape, covariance)
    eigenvalues, _ = _eigh(covariance)
    frames = frame_covariances(eigenvalues, num_frames, method, **params)
    last = num_frames - 1
    if not given:
        return frames[:, last, last].sum()
    index = torch.tensor([s - 1 for s in given])
    c_ss = frames[:, index][:, :, index]
    c_ts = frames[:, last, index]
    explained = (c_ts * torch.linalg.solve(c_ss, c_ts.unsqueeze(-1)).squeeze(-1)).sum(-1)
    return (frames[:, last, last] - explained).sum()


def optimal_predictor(
    mean: torch.Tensor,
    covariance: torch.Tensor,
    num_frames: int,
    method: str,
    given: Iterable[int],
    *,
    solver: str = "auto",
    per_direction: bool = False,
    image_shape=None,
    **params,
):
    r""":math:`\mathbb{E}[z_T \mid z_S] = \mathrm{intercept} + \sum_i \mathrm{weights}_i z_{S_i}`: returns
    ``(weights (|S|, n, n), intercept (n,))``.

    The regression weights are :math:`C_{TS} C_{SS}^{-1}` (per eigenvector for the eigen solver); :math:`\mathbb{E}[z_s] =
    A_s \mu` fixes the intercept :math:`\mu - \sum_i \mathrm{weights}_i A_{S_i} \mu`. ``per_direction=True`` (eigen
    solver) returns an :class:`EigenPredictor` instead, :math:`|S| n` weights rather than :math:`|S| n^2`
    (at :math:`n = 32 \times 32 \times 3` and :math:`|S| = 7`: 0.17 MB against 528 MB).

    :param mean: ``(n,)`` pixel mean :math:`\mu`.
    :param covariance: ``(n, n)`` symmetric positive semi-definite pixel covariance :math:`\Sigma`.
    :param num_frames: the number of frames :math:`T \ge 2`.
    :param method: one of :data:`LINEAR_GAUSSIAN_METHODS`.
    :param given: the conditioning frames :math:`S`, at least one, numbers in :math:`1, \dots, T-1`.
    :param solver: one of :data:`SOLVERS` (module docstring).
    :param per_direction: whether to return an :class:`EigenPredictor` (eigen solver only).
    :param image_shape: ``(H, W)`` or ``(C, H, W)`` of the pixels; heat only (``None`` otherwise).
    """
    if not isinstance(per_direction, bool):
        raise TypeError(f"per_direction must be a bool, got {type(per_direction).__name__}")
    solver = _check_solver(solver, method)
    if per_direction and solver != "eigen":
        raise ValueError(
            "per_direction=True needs the eigen solver (a Markov builder): heat's weights are not "
            "diagonal in the eigenvectors of the covariance"
        )
    given = _check_given(given, num_frames)
    if not given:
        raise ValueError("given must name at least one frame for a predictor")
    covariance = _check_covariance(covariance)
    mean = _check_mean(mean, covariance.shape[0])
    index = [s - 1 for s in given]
    if solver == "dense":
        operators, noise = frame_operators(num_frames, method, _image_shape(image_shape, method, covariance), **params)
        c_ss, c_ts = _dense_blocks(covariance, operators, noise, given)
        weights = _solve(c_ss, c_ts.T).T.reshape(covariance.shape[0], len(given), covariance.shape[0]).transpose(0, 1)
        intercept = mean - sum(w @ (operators[s] @ mean) for w, s in zip(weights, index))
        return weights, intercept
    _no_image_shape_needed(image_shape, covariance)
    eigenvalues, eigenvectors = _eigh(covariance)
    frames = frame_covariances(eigenvalues, num_frames, method, **params)
    signal, _ = frame_coefficients(num_frames, method, **_settings(method, params))
    rows = torch.tensor(index)
    per_eigenvector = torch.linalg.solve(frames[:, rows][:, :, rows], frames[:, -1, rows].unsqueeze(-1)).squeeze(-1)
    predictor = EigenPredictor(eigenvectors, per_eigenvector.T.contiguous(), mean)
    intercept = mean - predictor._replace(intercept=torch.zeros_like(mean)).predict(torch.stack([signal[s] * mean for s in index]))
    predictor = predictor._replace(intercept=intercept)
    return predictor if per_direction else (predictor.dense_weights(), intercept)


def context_gain_table(covariance: torch.Tensor, frame_counts: Iterable[int], methods=GAUSSIAN_METHODS, **params):
    r"""Rows ``(method, T, L*({T-1}), L*({1..T-1}), relative gain)`` for each method and :math:`T`.

    The relative gain :math:`1 - L^*(\text{all earlier}) / L^*(\text{previous only})` is 0 for first-order Markov videos.
    ``params`` go to :func:`min_mse` (``solver``, ``image_shape`` for heat, the builders' parameters).

    :param covariance: ``(n, n)`` symmetric positive semi-definite pixel covariance :math:`\Sigma`.
    :param frame_counts: the numbers of frames :math:`T` tabulated, each at least 2.
    :param methods: the builders tabulated (a name or an iterable of names of :data:`LINEAR_GAUSSIAN_METHODS`).
    """
    methods = (methods,) if isinstance(methods, str) else methods
    if not isinstance(frame_counts, Iterable) or not isinstance(methods, Iterable):
        raise TypeError(
            "frame_counts and methods must be iterables (e.g. [4, 8] and ('markov_first',)), got "
            f"{type(frame_counts).__name__} and {type(methods).__name__}"
        )
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


def _dense_blocks(covariance, operators, noise, given):
    """``C_SS`` ``(|S| n, |S| n)`` and ``C_TS`` ``(n, |S| n)`` of ``Cov(z_r, z_s) = A_r Sigma A_s^T + (b_r . b_s) I``."""
    index = [s - 1 for s in given]
    n = covariance.shape[0]
    mixed = operators[index] @ covariance  # A_s Sigma, (|S|, n, n)
    c_ss = torch.cat([torch.cat([mixed[i] @ operators[j].T for j in index], 1) for i in range(len(index))], 0)
    c_ss = c_ss + torch.kron(noise[index] @ noise[index].T, torch.eye(n, dtype=torch.float64))
    c_ts = torch.cat([(covariance @ operators[j].T) for j in index], 1)  # A_T = I, b_T = 0
    return c_ss, c_ts


def _solve(matrix, right):
    """``matrix^{-1} right`` for a PSD ``matrix``: Cholesky, or least squares where it is singular."""
    factor, info = torch.linalg.cholesky_ex(matrix)
    if int(info) == 0:
        return torch.cholesky_solve(right, factor)
    return torch.linalg.lstsq(matrix, right, driver="gelsd").solution


def _settings(method: str, params: dict) -> dict:
    _check_method(method, LINEAR_GAUSSIAN_METHODS)
    unknown = set(params) - set(DEFAULT_PARAMS[method])
    if unknown:
        raise ValueError(f"unknown parameters {sorted(unknown)} for method {method!r}")
    return {**DEFAULT_PARAMS[method], **params}


def _check_method(method: str, methods=GAUSSIAN_METHODS) -> None:
    if not isinstance(method, str) or method not in methods:
        raise ValueError(f"method must be one of {methods} (linear-Gaussian builders), got {method!r}")


def _check_solver(solver, method) -> str:
    _check_method(method, LINEAR_GAUSSIAN_METHODS)
    if not isinstance(solver, str) or solver not in SOLVERS:
        raise ValueError(f"solver must be one of {SOLVERS}, got {solver!r}")
    if solver == "auto":
        return "dense" if method == "heat" else "eigen"
    if solver == "eigen" and method == "heat":
        raise ValueError(
            "solver='eigen' needs frames A_s = a_s I (the Markov builders); heat's F_h(tau) is "
            "diagonal in the DCT basis, not in the covariance's eigenvectors: use solver='dense'"
        )
    return solver


def _check_image_shape(image_shape) -> tuple[int, int, int]:
    if not isinstance(image_shape, (tuple, list, torch.Size)) or len(image_shape) not in (2, 3):
        raise ValueError(f"image_shape must be (H, W) or (C, H, W), got {image_shape!r}")
    sizes = [check_int(size, "image_shape entries") for size in image_shape]
    channels, height, width = sizes if len(sizes) == 3 else [1, *sizes]
    return channels, height, width


def _image_shape(image_shape, method, covariance):
    n = covariance.shape[0]
    if image_shape is None:
        if method == "heat":
            raise ValueError("heat needs image_shape=(H, W) or (C, H, W): F_h acts on the pixels' grid")
        return (1, 1, n)
    channels, height, width = _check_image_shape(image_shape)
    if channels * height * width != n:
        raise ValueError(f"image_shape {tuple(image_shape)} has {channels * height * width} pixels, the covariance {n}")
    return channels, height, width


def _no_image_shape_needed(image_shape, covariance):
    if image_shape is not None:
        _image_shape(image_shape, "markov_first", _check_covariance(covariance))


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


def _check_mean(mean, n: int) -> torch.Tensor:
    if not isinstance(mean, torch.Tensor):
        try:
            mean = torch.as_tensor(mean, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError) as error:
            raise TypeError(f"mean must be a tensor or array-like of numbers, got {type(mean).__name__}") from error
    mean = check_tensor(mean, "mean").to(torch.float64)
    if mean.shape != (n,):
        raise ValueError(f"mean must have shape ({n},), got {tuple(mean.shape)}")
    return mean


def _check_covariance(covariance: torch.Tensor) -> torch.Tensor:
    if not isinstance(covariance, torch.Tensor) or covariance.dim() != 2 or covariance.shape[0] != covariance.shape[1]:
        raise ValueError("covariance must be a square (n, n) torch.Tensor")
    check_tensor(covariance, "covariance", non_empty=True)
    if covariance.dtype == torch.bool or covariance.is_complex():
        raise TypeError(f"covariance must be a real tensor, got {covariance.dtype}")
    covariance = covariance.to(torch.float64)
    if not torch.allclose(covariance, covariance.T, rtol=1e-6, atol=1e-10):
        raise ValueError("covariance must be symmetric")
    return covariance


def _eigh(covariance: torch.Tensor):
    covariance = _check_covariance(covariance)
    eigenvalues, eigenvectors = torch.linalg.eigh(covariance)
    if eigenvalues.min() < -1e-8 * eigenvalues.abs().max().clamp_min(1e-300):
        raise ValueError(f"covariance must be positive semi-definite (smallest eigenvalue {eigenvalues.min():.3g})")
    return eigenvalues.clamp_min(0), eigenvectors
