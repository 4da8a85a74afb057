"""Solar irradiance: global horizontal irradiance from the TMY3 file bundled with ``pvlib``.

A TMY3 file is a typical meteorological year: each month is taken from another year (January 1988, March 1996,
April 1990, ...), so the index pvlib reads goes back and forth in time. :func:`load_tmy3` puts every month on
one year, so that its index increases and a :class:`~gpytorch_hippo.timeaxis.TimeAxis` streams it in order.
:class:`IrradianceObjective` turns the same year into an objective of a solar panel's angles that changes every hour.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

import numpy as np
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


def load_solar_series(resolution: str = "hourly") -> Any:
    """Global horizontal irradiance (W/m^2) as a pandas ``Series`` indexed by its timestamps (the TMY3 year of
    :func:`~gpytorch_hippo.data.solar.load_tmy3`).

    ``"hourly"`` (default): the 8760 readings at their hours (the file's fixed UTC offset kept); ``"daily"``: the 365
    daily means of :func:`load_solar_ghi`, indexed by the first hour of each day. The values are those of
    :func:`load_solar_ghi` in the same order.

    :param resolution: ``"hourly"`` (default) or ``"daily"``.
    """
    if resolution not in ("daily", "hourly"):
        raise ValueError(f"resolution must be 'daily' or 'hourly', got {resolution!r}")
    ghi = load_tmy3()["ghi"].astype(float).rename("ghi")
    if resolution == "hourly":
        return ghi
    daily = ghi.to_numpy().reshape(365, 24).mean(axis=1)
    return type(ghi)(daily, index=ghi.index[::24], name="ghi")


#: The panel angles (degrees) of :class:`IrradianceObjective`'s unit square: tilt and azimuth.
TILT_RANGE, AZIMUTH_RANGE = (0.0, 90.0), (90.0, 270.0)


class IrradianceObjective:
    r"""Plane-of-array irradiance (kW/m²) of hour ``k`` of the TMY3 year as a function of panel angles: a
    time-varying objective for streaming Bayesian optimisation, whose best angles move with the sun and the clouds.

    The value is pvlib's isotropic transposition of the hour's measured GHI, DNI and DHI onto a panel of tilt
    :math:`\beta` and azimuth :math:`\gamma` (degrees), at the sun's position in the middle of the hour. Inputs
    live in the unit square: :math:`x = (\beta / 90, (\gamma - 90) / 180)`.

    :param first_day: the first day of the year used (0-based; default 80, about the March equinox).
    :param min_elevation: the least solar elevation in degrees of a used hour (default 10; hours with zero GHI are
        left out too).
    """

    def __init__(self, first_day: int = 80, min_elevation: float = 10.0):
        pvlib = require("pvlib", "data", "the irradiance objective")

        frame, meta = pvlib.iotools.read_tmy3(tmy3_path(pvlib), map_variables=True)
        # TMY3 values integrate the hour ending at the stamp: the sun's position at its middle
        position = pvlib.solarposition.get_solarposition(frame.index - np.timedelta64(30, "m"), meta["latitude"], meta["longitude"])
        self.zenith = position["apparent_zenith"].to_numpy()
        self.sun_azimuth = position["azimuth"].to_numpy()
        self.ghi, self.dni, self.dhi = (frame[name].to_numpy(dtype=float) for name in ("ghi", "dni", "dhi"))
        hours = np.arange(len(frame))
        self.hours = hours[(hours >= 24 * first_day) & (90.0 - self.zenith > min_elevation) & (self.ghi > 0)]
        self._pvlib = pvlib
        tilt, azimuth = np.meshgrid(np.linspace(0, 1, 91), np.linspace(0, 1, 91))
        self.grid = np.stack([tilt.ravel(), azimuth.ravel()], axis=-1)

    def __call__(self, x: np.ndarray, hour: int) -> np.ndarray:
        """Irradiance at unit-square angles ``x`` of shape ``(n, 2)`` during ``hour``."""
        tilt = TILT_RANGE[0] + x[:, 0] * (TILT_RANGE[1] - TILT_RANGE[0])
        azimuth = AZIMUTH_RANGE[0] + x[:, 1] * (AZIMUTH_RANGE[1] - AZIMUTH_RANGE[0])
        poa = self._pvlib.irradiance.get_total_irradiance(
            tilt, azimuth, self.zenith[hour], self.sun_azimuth[hour], self.dni[hour], self.ghi[hour], self.dhi[hour]
        )["poa_global"]
        return np.nan_to_num(np.asarray(poa, dtype=float)) / 1000.0

    def best(self, hour: int) -> float:
        """The largest irradiance over the 1° x 2° grid of angles during ``hour`` (kW/m²).

        :param hour: the hour of the TMY3 year (an index into its 8760 hours).
        """
        return float(self(self.grid, hour).max())
