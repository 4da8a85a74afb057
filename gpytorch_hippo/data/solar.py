"""Solar irradiance: global horizontal irradiance from the TMY3 file bundled with ``pvlib``.

A TMY3 file is a typical meteorological year: each month is taken from another year (January 1988, March 1996,
April 1990, ...), so the index pvlib reads goes back and forth in time. :func:`load_tmy3` puts every month on
one year, so that its index increases and a :class:`~gpytorch_hippo.timeaxis.TimeAxis` streams it in order.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

import torch

from probseq._optional import require

TMY3_FILE = "723170TYA.CSV"  # Greensboro, NC: hourly typical meteorological year, 8760 hours


def tmy3_path(pvlib: ModuleType) -> str:
    """The path of the TMY3 file bundled with the imported ``pvlib`` module; ``FileNotFoundError`` if it is missing.

    The file (``TMY3_FILE``, Greensboro NC) is the one :func:`load_tmy3` and :func:`load_solar_ghi` read.

    :param pvlib: the imported ``pvlib`` module.
    """
    if pvlib.__file__ is None:
        raise FileNotFoundError(f"{TMY3_FILE} is missing: the 'pvlib' package has no install folder; reinstall it")
    path = os.path.join(os.path.dirname(pvlib.__file__), "data", TMY3_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} is missing: reinstall the 'pvlib' package")
    return path


def load_tmy3(year: int = 1990) -> Any:
    """The bundled TMY3 file (Greensboro NC) as a pandas ``DataFrame`` of 8760 hours on one calendar year.

    Its months come from different years; pvlib's ``read_tmy3(..., coerce_year=year)`` puts them all on ``year`` (the
    last hour, 24:00 on 31 December, is midnight of the next year), so the index increases by one hour per row. The
    index keeps the file's fixed UTC offset (``UTC-05:00``), which a ``TimeAxis`` records as its zone. Columns are
    pvlib's (``map_variables=True``: ``ghi``, ``temp_air``, ...).

    :param year: the year every month is put on (default 1990, not a leap year: the file has no 29 February).
    """
    pvlib = require("pvlib", "data", "the solar series")
    frame, _ = pvlib.iotools.read_tmy3(tmy3_path(pvlib), map_variables=True, coerce_year=year)
    return frame


def load_solar_ghi(resolution: str = "daily", dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """Global horizontal irradiance (W/m^2) as ``(times, values)``.

    ``resolution="daily"`` gives 365 daily means at ``times = 0, 1, ..., 364`` (days);
    ``"hourly"`` gives the 8760 raw hourly values at ``times = 0, ..., 8759`` (hours).

    :param resolution: ``"daily"`` (default) or ``"hourly"``.
    :param dtype: dtype of both returned tensors (default ``torch.float64``).
    """
    if resolution not in ("daily", "hourly"):
        raise ValueError(f"resolution must be 'daily' or 'hourly', got {resolution!r}")
    ghi = torch.tensor(load_tmy3()["ghi"].to_numpy(dtype=float), dtype=dtype)
    if resolution == "daily":
        ghi = ghi.reshape(365, 24).mean(dim=1)
    return torch.arange(ghi.shape[0], dtype=dtype), ghi
