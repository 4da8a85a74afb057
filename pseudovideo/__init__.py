r"""Pseudo videos (thesis ch. 5; Chen et al. (2025), pseudo videos): an image as the last frame of a video of its own corruptions.

``augment`` builds pseudo videos, ``theory`` gives Theorem 5.4.1's minimum MSE
:math:`\min_h \mathbb{E} \lVert z_T - h(z_{s_1}, \ldots, z_{s_l}) \rVert^2` (never larger with more frames) in closed form for
Gaussian images, ``scaling`` maps images to and from the ``[-1, 1]`` the builders assume,
``metrics`` wraps torchmetrics' FID/IS (and PSNR) with a pluggable feature network, ``models``
holds the image/video diffusion models (diffusers models) and the HVAE of §5.2.1,
``pipelines`` a diffusers pipeline that samples the video model with any scheduler, and ``training``
trains a model through Hugging Face ``accelerate``.
"""

from importlib.metadata import PackageNotFoundError as _PackageNotFoundError
from importlib.metadata import version as _version

try:
    __version__ = _version("probseq")  # one source: the version in setup.cfg, read from the installed metadata
except _PackageNotFoundError:  # pragma: no cover - the source tree on sys.path without an install
    __version__ = "0+unknown"

from .augment import METHODS, make_pseudo_video
from .scaling import to_data_range, to_model_range
from .theory import context_gain_table, min_mse, optimal_predictor

__all__ = [
    "__version__",
    "METHODS",
    "make_pseudo_video",
    "min_mse",
    "optimal_predictor",
    "context_gain_table",
    "to_model_range",
    "to_data_range",
]
