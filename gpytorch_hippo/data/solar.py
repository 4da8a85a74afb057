"""Solar irradiance: global horizontal irradiance from the TMY3 file bundled with ``pvlib``."""

from __future__ import annotations

import os
from types import ModuleType

import torch

from .._optional import require

TMY3_FILE = "723170TYA.CSV"  # Greensboro, NC: hourly typical meteorological year, 8760 hours


def tmy3_path(pvlib: ModuleType) -> str:
    """The path of the TMY3 file bundled with the imported ``pvlib`` module; ``FileNotFoundError`` if it is missing.

    The file (``TMY3_FILE``, Greensboro NC) is the one :func:`load_solar_ghi` reads.

    :param pvlib: the imported ``pvlib`` module.
    """
    if pvlib.__file__ is None:
        raise FileNotFoundError(f"{TMY3_FILE} is missing: the 'pvlib' package has no install folder; reinstall it")
    path = os.path.join(os.path.dirname(pvlib.__file__), "data", TMY3_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} is missing: reinstall the 'pvlib' package")
    return path


def load_solar_ghi(resolution: str = "daily", dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """Global horizontal irradiance (W/m^2) as ``(times, values)``.

    ``resolution="daily"`` gives 365 daily means at ``times = 0, 1, ..., 364`` (days);
    ``"hourly"`` gives the 8760 raw hourly values at ``times = 0, ..., 8759`` (hours).

    :param resolution: ``"daily"`` (default) or ``"hourly"``.
    :param dtype: dtype of both returned tensors (default ``torch.float64``).
    """
    if resolution not in ("daily", "hourly"):
        raise ValueError(f"resolution must be 'daily' or 'hourly', got {resolution!r}")
    pvlib = require("pvlib", "data", "the solar series")
    frame, _ = pvlib.iotools.read_tmy3(tmy3_path(pvlib), map_variables=True)
    ghi = torch.tensor(frame["ghi"].to_numpy(dtype=float), dtype=dtype)
    if resolution == "daily":
        ghi = ghi.reshape(365, 24).mean(dim=1)
    return torch.arange(ghi.shape[0], dtype=dtype), ghi
