r"""Data ranges: the loaders give images in ``[0, 1]``, the pseudo-video builders and models expect ``[-1, 1]``.

The noise schedules of the Gaussian builders (``beta`` up to 0.05, heat's ``sigma_h = 0.01``) and
the diffusion models' noise levels are meant for images in ``[-1, 1]``, as in the thesis. On
another scale they silently mean something else (on ``[0, 255]`` the noise is negligible), so

* :func:`to_model_range` maps images from their ``data_range`` (``(0, 1)`` for
  ``pseudovideo.data``; ``(0, 255)`` for 8-bit pixels) affinely onto ``[-1, 1]``:
  :math:`x' = 2 (x - \mathrm{low}) / (\mathrm{high} - \mathrm{low}) - 1`, raising if any pixel lies outside ``data_range``;
* :func:`to_data_range` maps model-space frames back, :math:`x = \mathrm{low} + (x' + 1) (\mathrm{high} - \mathrm{low}) / 2`
  (clipping to ``data_range`` only if asked: Gaussian-noise pseudo frames lie partly outside it);
* :func:`check_model_range` is the check the builders and models apply to the clean images they
  receive: a ``ValueError`` if their root-mean-square pixel exceeds ``FAR_OUTSIDE = 3``; with
  ``refuse_unit_range=True`` (the diffusion model's frames and context) also if every pixel lies in
  ``[0, 1]``, the loaders' range, spanning at least half of it (a batch of ``[-1, 1]`` images has its
  dark pixels below 0). Images in
  ``[-1, 1]`` have a root-mean-square of at most 1, standardised or Gaussian images about 1 (single
  pixels may lie well beyond 3: the thesis's Theorem 5.4.1, the minimum MSE of predicting an image from
  its pseudo-video frames, is about Gaussian images; see :mod:`pseudovideo.theory`), while 8-bit pixels
  (``[0, 255]``) or scikit-learn's raw digits (``[0, 16]``) lie far above.
"""

from __future__ import annotations

import torch

from probseq._validation import check_real, check_tensor

__all__ = ["MODEL_RANGE", "FAR_OUTSIDE", "to_model_range", "to_data_range", "check_model_range"]

#: The range the builders' noise schedules and the models assume for clean images.
MODEL_RANGE = (-1.0, 1.0)
#: Largest root-mean-square pixel accepted as "on the ``[-1, 1]`` scale" (see the module docstring).
FAR_OUTSIDE = 3.0


def _check_data_range(data_range) -> tuple[float, float]:
    if not isinstance(data_range, (tuple, list)) or len(data_range) != 2:
        raise TypeError(f"data_range must be a pair (low, high), got {data_range!r}")
    low = check_real(data_range[0], "data_range[0]")
    high = check_real(data_range[1], "data_range[1]")
    if not high > low:
        raise ValueError(f"data_range must have low < high, got {data_range!r}")
    return low, high


def to_model_range(images: torch.Tensor, data_range=(0.0, 1.0)) -> torch.Tensor:
    """``2 (images - low) / (high - low) - 1``: images in ``data_range = (low, high)`` onto ``[-1, 1]``.

    Integer tensors (e.g. ``uint8``) become float32. A ``ValueError`` if a pixel lies outside
    ``data_range`` (a wrong ``data_range`` would otherwise give a silently wrong scale).

    :param images: a non-empty tensor of finite pixel values, of any shape and dtype.
    :param data_range: ``(low, high)``, the range the pixels are stored in, ``low < high``.
    """
    check_tensor(images, "images", non_empty=True, finite=False)
    low, high = _check_data_range(data_range)
    images = images if images.is_floating_point() else images.float()
    check_tensor(images, "images")
    smallest, largest = float(images.min()), float(images.max())
    if smallest < low or largest > high:
        raise ValueError(
            f"images lie in [{smallest:.4g}, {largest:.4g}], outside data_range=({low:g}, {high:g}): "
            "pass the range the pixels are stored in, e.g. (0, 255) for 8-bit images"
        )
    return 2 * (images - low) / (high - low) - 1


def to_data_range(frames: torch.Tensor, data_range=(0.0, 1.0), clip: bool = False) -> torch.Tensor:
    """``low + (frames + 1) (high - low) / 2``, the inverse of :func:`to_model_range`.

    ``clip=True`` clamps to ``data_range`` (for display and image metrics); the default keeps the
    values, which for Gaussian-noise pseudo frames lie partly outside the range.

    :param frames: floating-point frames in model space (about ``[-1, 1]``), of any shape.
    :param data_range: ``(low, high)``, the range to map ``[-1, 1]`` onto, ``low < high``.
    :param clip: whether to clamp the result to ``data_range``.
    """
    check_tensor(frames, "frames", floating=True, finite=False)
    low, high = _check_data_range(data_range)
    if not isinstance(clip, bool):
        raise TypeError(f"clip must be a bool, got {type(clip).__name__}")
    images = low + (frames + 1) * ((high - low) / 2)
    return images.clamp(low, high) if clip else images


def check_model_range(images: torch.Tensor, name: str = "images", refuse_unit_range: bool = False) -> torch.Tensor:
    """``images`` if ``sqrt(mean(images^2)) <= FAR_OUTSIDE``, else a ``ValueError`` naming
    :func:`to_model_range` (``images`` must already be checked to be a finite float tensor).

    :param images: finite floating-point images, of any shape.
    :param name: what the error message calls ``images``.
    :param refuse_unit_range: also a ``ValueError`` if every pixel lies in ``[0, 1]`` and they span at least
        half of it (images not yet mapped; a constant frame such as zeros passes).
    """
    low, high = (float(images.min()), float(images.max())) if images.numel() else (0.0, 0.0)
    if refuse_unit_range and 0 <= low and high <= 1 and high - low >= 0.5:
        raise ValueError(
            f"every pixel of {name} lies in [0, 1], the loaders' range, not the [-1, 1] the noise schedules "
            "assume (whose dark pixels lie below 0); map them with pseudovideo.to_model_range(images)"
        )
    rms = float(images.double().pow(2).mean().sqrt()) if images.numel() else 0.0
    if rms > FAR_OUTSIDE:
        raise ValueError(
            f"{name} have a root-mean-square pixel of {rms:.4g}, far outside the [-1, 1] the noise "
            f"schedules assume (accepted: <= {FAR_OUTSIDE:g}); map them with "
            "pseudovideo.to_model_range(images, data_range=(low, high))"
        )
    return images
