r"""Pseudo-video builders (thesis ch. 5): an image becomes the last frame of a corrupted sequence.

``make_pseudo_video(images, T, method)`` maps ``(B, C, H, W)`` to ``(B, T, C, H, W)``. Frame
``T`` (index ``-1``) is the original image exactly; frame 1 (index ``0``) is the most corrupted.
Writing :math:`z_T = x` and building backwards, :math:`t = 1, \dots, T-1`:

* ``"blur"`` (§5.3; Bansal et al., *Cold Diffusion*, 2022, "Exponential" routine):
  :math:`z_{T-t} = G_{s_t} * z_{T-t+1}`, a ``kernel_size x kernel_size`` Gaussian kernel of standard
  deviation :math:`s_t = e^{\mathrm{rate}\,(t-1)}` pixels, reflect padding (``rate`` 0.05 for 8 frames, 0.01 for 18).
* ``"heat"`` (§5.2.1; Rissanen et al., *Generative Modelling With Inverse Heat Dissipation*, 2023):
  :math:`z_{T-t} = F_h(\tau_t) z_T + \sigma_h \epsilon`, where
  :math:`F_h(\tau) = D^\top e^{-\Lambda \tau} D` is heat dissipation with Neumann boundaries (:math:`D` the
  orthonormal 2-D DCT-II, :math:`\Lambda_{kl} = \pi^2 (k^2/H^2 + l^2/W^2)`) and :math:`\tau_t = s_t^2 / 2` with
  blur widths :math:`s_t` log-spaced from ``min_std`` to ``max_std`` pixels and :math:`\sigma_h` = ``noise_std``.
* ``"markov_first"`` (§5.4): :math:`z_{T-t} = \sqrt{1-\beta_t}\, z_{T-t+1} + \sqrt{\beta_t}\, \epsilon`.
* ``"markov_high"`` (§5.4): :math:`z_{T-t} = \sqrt{1-\beta_t}\, \mathrm{mean}(z_{T-t+1}, \dots, z_T) + \sqrt{\beta_t}\, \epsilon`.

For both Markov methods :math:`\beta_t` is linear from ``beta_start`` (1e-4) to ``beta_end`` (0.05) over
:math:`t = 1, \dots, T-1`, or any schedule given as ``betas`` (:math:`T - 1` values in :math:`(0, 1)`, ``betas[0]``
building :math:`z_{T-1}`); the images must be on the scale the noise is meant for, ``[-1, 1]`` as in the thesis: the noisy methods
raise a ``ValueError`` for images far outside it (root-mean-square pixel above 3, e.g. 8-bit pixels); map images from the
loaders' ``[0, 1]`` with :func:`pseudovideo.to_model_range`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from probseq._validation import check_int, check_real, check_tensor

from ._heat import heat_time
from ._random import randn
from ._validation import check_generator
from .scaling import check_model_range

#: Each method's default parameters.
DEFAULT_PARAMS: dict[str, dict[str, Any]] = {
    "blur": {"rate": 0.05, "kernel_size": 11},
    "heat": {"min_std": 0.5, "max_std": 20.0, "noise_std": 0.01},
    "markov_first": {"beta_start": 1e-4, "beta_end": 0.05, "betas": None},
    "markov_high": {"beta_start": 1e-4, "beta_end": 0.05, "betas": None},
}
#: The pseudo-video methods of :func:`make_pseudo_video` (``method=``).
METHODS = tuple(DEFAULT_PARAMS)


def make_pseudo_video(
    images: torch.Tensor, num_frames: int, method: str, generator: torch.Generator | None = None, **params
) -> torch.Tensor:
    r"""Pseudo videos ``(B, T, C, H, W)`` whose last frame is ``images`` (``(B, C, H, W)``) exactly.

    ``generator`` makes the noisy methods deterministic; ``params`` override ``DEFAULT_PARAMS[method]``.

    :param images: ``(B, C, H, W)`` finite floating-point images, in ``[-1, 1]`` for the noisy methods.
    :param num_frames: the number of frames :math:`T \ge 2`, the image included.
    :param method: one of :data:`METHODS` (module docstring).
    :param generator: the random generator of the noise of ``"heat"`` and the Markov methods (``None``:
        PyTorch's global one).
    """
    settings = _check_arguments(images, num_frames, method, params, generator)
    frames = [images]
    if method == "blur":
        for t in range(1, num_frames):
            frames.append(gaussian_blur(frames[-1], math.exp(settings["rate"] * (t - 1)), settings["kernel_size"]))
    elif method == "heat":
        stds = torch.logspace(math.log10(settings["min_std"]), math.log10(settings["max_std"]), num_frames - 1, dtype=torch.float64)
        for std in stds.tolist():
            noise = randn(images.shape, generator, images.dtype, images.device)
            frames.append(heat_dissipation(images, heat_time(std)) + settings["noise_std"] * noise)
    else:
        betas = markov_betas(num_frames, settings["beta_start"], settings["beta_end"], settings["betas"])
        total = images  # running sum of the frames built so far: markov_high's mean in O(1) per frame
        for beta in betas.tolist():
            previous = frames[-1] if method == "markov_first" else total / len(frames)
            noise = randn(images.shape, generator, images.dtype, images.device)
            frames.append(math.sqrt(1 - beta) * previous + math.sqrt(beta) * noise)
            total = total + frames[-1]
    return torch.stack(frames[::-1], dim=1)


def markov_betas(num_frames: int, beta_start: float, beta_end: float, betas=None) -> torch.Tensor:
    r""":math:`\beta_t` for :math:`t = 1, \dots, T-1` (float64): ``betas`` if given (a sequence or 1-D tensor of
    :math:`T - 1` values in :math:`(0, 1)`), else linear from ``beta_start`` to ``beta_end`` (§5.4).

    :param num_frames: the number of frames :math:`T \ge 2`.
    :param beta_start: :math:`\beta_1`, in :math:`(0, 1)`, of the linear schedule.
    :param beta_end: :math:`\beta_{T-1}`, in ``[beta_start, 1)``, of the linear schedule.
    :param betas: an explicit schedule replacing the linear one (``None``: linear).
    """
    check_int(num_frames, "num_frames", low=2)
    if betas is None:
        beta_start, beta_end = check_betas(beta_start, beta_end)
        return torch.linspace(beta_start, beta_end, num_frames - 1, dtype=torch.float64)
    if isinstance(betas, (str, bytes)):
        raise TypeError(f"betas must be a sequence of numbers, got {type(betas).__name__}")
    try:
        schedule = torch.as_tensor(betas, dtype=torch.float64).detach().cpu()
    except (TypeError, ValueError, RuntimeError) as error:
        raise TypeError(f"betas must be a sequence of numbers, got {type(betas).__name__}") from error
    if schedule.shape != (num_frames - 1,):
        raise ValueError(
            f"betas must hold num_frames - 1 = {num_frames - 1} values (one per corrupted frame), got shape {tuple(schedule.shape)}"
        )
    if not bool(((schedule > 0) & (schedule < 1)).all()):
        raise ValueError(f"betas must lie in (0, 1), got {schedule.tolist()}")
    return schedule


def check_betas(beta_start, beta_end) -> tuple[float, float]:
    """``(beta_start, beta_end)`` as floats with ``0 < beta_start <= beta_end < 1``, else a named error.

    :param beta_start: the first noise variance of a linear schedule.
    :param beta_end: the last noise variance of a linear schedule.
    """
    beta_start = check_real(beta_start, "beta_start", low=0.0, high=1.0, low_open=True, high_open=True)
    beta_end = check_real(beta_end, "beta_end", high=1.0, high_open=True)
    if beta_end < beta_start:
        raise ValueError(f"beta_end must be >= beta_start, got beta_start={beta_start}, beta_end={beta_end}")
    return beta_start, beta_end


def gaussian_kernel1d(std: float, kernel_size: int, dtype=torch.float32, device=None) -> torch.Tensor:
    """Normalised samples of a centred Gaussian density at ``kernel_size`` integer offsets.

    :param std: the standard deviation, in pixels.
    :param kernel_size: the number of taps (odd for a centred kernel); the offsets run from
        ``-(kernel_size - 1) / 2`` to ``(kernel_size - 1) / 2``.
    :param dtype: the result's dtype.
    :param device: the result's device (``None``: the default device).
    """
    offsets = torch.arange(kernel_size, dtype=dtype, device=device) - (kernel_size - 1) / 2
    weights = torch.exp(-0.5 * (offsets / std) ** 2)
    return weights / weights.sum()


def gaussian_blur(images: torch.Tensor, std: float, kernel_size: int) -> torch.Tensor:
    """Separable Gaussian blur of ``(B, C, H, W)`` with reflect padding (same size out).

    :param images: ``(B, C, H, W)`` floating-point images.
    :param std: the kernel's standard deviation, in pixels.
    :param kernel_size: the kernel's width and height, odd, with ``kernel_size // 2 < H, W``.
    """
    kernel = gaussian_kernel1d(std, kernel_size, images.dtype, images.device)
    channels, pad = images.shape[1], kernel_size // 2
    padded = F.pad(images, (pad, pad, pad, pad), mode="reflect")
    rows = F.conv2d(padded, kernel.view(1, 1, 1, -1).expand(channels, 1, 1, -1), groups=channels)
    return F.conv2d(rows, kernel.view(1, 1, -1, 1).expand(channels, 1, -1, 1), groups=channels)


def dct_matrix(size: int, dtype=torch.float64, device=None) -> torch.Tensor:
    r"""Orthonormal DCT-II matrix ``D`` (``D @ x`` transforms, ``D.T @ y`` inverts).

    :param size: the signal length :math:`n`; the matrix is :math:`n \times n`.
    :param dtype: the matrix's dtype.
    :param device: the matrix's device (``None``: the default device).
    """
    n = torch.arange(size, dtype=dtype, device=device)
    matrix = torch.cos(math.pi * (2 * n[None, :] + 1) * n[:, None] / (2 * size)) * math.sqrt(2 / size)
    matrix[0] /= math.sqrt(2)
    return matrix


def heat_dissipation(images: torch.Tensor, time: float) -> torch.Tensor:
    r"""``F_h(time) x``: the heat equation run for ``time`` on ``(..., H, W)`` (Neumann boundaries).

    :param images: ``(..., H, W)`` floating-point images :math:`x`.
    :param time: the diffusion time :math:`\tau \ge 0` (squared pixels; ``inf`` gives each image's mean).
    """
    check_tensor(images, "images", floating=True, finite=False)
    if images.dim() < 2 or 0 in images.shape[-2:]:
        raise ValueError(f"images must have shape (..., H, W) with H, W >= 1, got {tuple(images.shape)}")
    if not (isinstance(time, (int, float)) and not isinstance(time, bool) and time >= 0):
        raise ValueError(f"time must be a number >= 0 (inf allowed), got {time!r}")
    height, width = images.shape[-2:]
    d_h, d_w = dct_matrix(height, images.dtype, images.device), dct_matrix(width, images.dtype, images.device)
    freq_h = math.pi * torch.arange(height, dtype=images.dtype, device=images.device) / height
    freq_w = math.pi * torch.arange(width, dtype=images.dtype, device=images.device) / width
    squared = freq_h[:, None] ** 2 + freq_w[None, :] ** 2
    decay = torch.where(squared == 0, 1.0, torch.exp(-squared * time))  # the mean is kept, also at time = inf
    return d_h.T @ (decay * (d_h @ images @ d_w.T)) @ d_w


def _check_arguments(images, num_frames, method, params, generator) -> dict:
    if not isinstance(images, torch.Tensor):
        raise TypeError(f"images must be a torch.Tensor, got {type(images).__name__}")
    if images.dim() != 4:
        raise ValueError(f"images must have shape (B, C, H, W), got shape {tuple(images.shape)}")
    if not images.is_floating_point():
        raise TypeError(f"images must be floating point (float32/float64), got {images.dtype}")
    if 0 in images.shape[1:]:
        raise ValueError(f"images must have C, H, W >= 1, got shape {tuple(images.shape)}")
    check_tensor(images, "images")
    check_int(num_frames, "num_frames", low=2)
    if not isinstance(method, str) or method not in DEFAULT_PARAMS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    check_generator(generator)
    unknown = set(params) - set(DEFAULT_PARAMS[method])
    if unknown:
        raise ValueError(f"unknown parameters {sorted(unknown)} for method {method!r}; accepted: {sorted(DEFAULT_PARAMS[method])}")
    settings = {**DEFAULT_PARAMS[method], **params}
    if method != "blur":  # blurring is scale-free; the noise levels are meant for [-1, 1] images
        check_model_range(images)
    if method == "blur":
        kernel_size = check_int(settings["kernel_size"], "kernel_size")
        if kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be an odd positive integer, got {settings['kernel_size']!r}")
        if settings["kernel_size"] // 2 >= min(images.shape[-2:]):
            raise ValueError(
                f"kernel_size {settings['kernel_size']} is too large for images of size "
                f"{tuple(images.shape[-2:])} (reflect padding needs kernel_size // 2 < H, W)"
            )
        settings["rate"] = check_real(settings["rate"], "rate")
        if settings["rate"] * (num_frames - 2) > 700:  # exp would overflow: every blur width is infinite
            raise ValueError(
                f"rate * (num_frames - 2) must be <= 700 (blur widths exp(rate t) overflow), got "
                f"rate={settings['rate']}, num_frames={num_frames}"
            )
    elif method == "heat":
        settings["min_std"] = check_real(settings["min_std"], "min_std", low=0.0, low_open=True)
        max_std = check_real(settings["max_std"], "max_std", low=0.0, low_open=True)
        if max_std < settings["min_std"]:
            raise ValueError(f"heat needs 0 < min_std <= max_std, got min_std={settings['min_std']}, max_std={max_std}")
        settings["max_std"] = max_std
        settings["noise_std"] = check_real(settings["noise_std"], "noise_std", low=0.0)
    else:
        settings["beta_start"], settings["beta_end"] = check_betas(settings["beta_start"], settings["beta_end"])
        markov_betas(num_frames, settings["beta_start"], settings["beta_end"], settings["betas"])  # checks betas
    return settings
