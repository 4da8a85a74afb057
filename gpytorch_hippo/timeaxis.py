"""Calendar time as the online models' inputs: one documented conversion with a unit and an origin.

The online GPs work in plain numbers: a time ``t`` in some unit since some origin (HiPPO's LegS
bases cover ``[0, t]``, so the origin belongs near the stream's start, and the unit sets the
length scales). :class:`TimeAxis` turns pandas ``Timestamp``/``DatetimeIndex``/``Series``, NumPy
``datetime64`` values and ``datetime`` objects into such numbers, ``(t - origin) / unit``, and back;
:class:`~gpytorch_hippo.online.OnlineSGPR` keeps one (``time_axis=``) so that ``update``, ``log_bound``,
prediction and ``model.time_axis(timestamp)`` (for ``advance``) take calendar times. It needs NumPy
only (pandas objects convert through ``numpy.asarray``).
"""

from __future__ import annotations

import datetime

import numpy as np
import torch
from torch import Tensor

__all__ = ["TimeAxis", "is_datetime_like"]

#: the units of :class:`TimeAxis` (NumPy's ``timedelta64`` codes)
UNITS = ("W", "D", "h", "m", "s", "ms", "us", "ns")


def _as_datetime64(values) -> np.ndarray | None:
    """``values`` as a ``datetime64[ns]`` array, or ``None`` if they are not calendar times."""
    if isinstance(values, Tensor):
        return None
    if isinstance(values, (datetime.datetime, datetime.date, np.datetime64)) or type(values).__name__ == "Timestamp":
        values = [values]
    tz = getattr(getattr(values, "dt", values), "tz", None)
    if tz is not None:
        raise TypeError("time-zone-aware times: convert them to UTC and drop the zone first (e.g. index.tz_convert(None))")
    try:
        array = np.asarray(values)
    except (TypeError, ValueError):
        return None
    if array.dtype.kind == "M":
        return array.astype("datetime64[ns]")
    if (
        array.dtype.kind == "O"
        and array.size
        and all(isinstance(v, (datetime.datetime, datetime.date, np.datetime64)) or type(v).__name__ == "Timestamp" for v in array.flat)
    ):
        if any(getattr(v, "tzinfo", None) is not None for v in array.flat):
            raise TypeError("time-zone-aware times: convert them to UTC and drop the zone first (e.g. .tz_convert(None))")
        return array.astype("datetime64[ns]")
    return None


def _nanoseconds(unit: str) -> float:
    """One ``unit`` (a NumPy ``timedelta64`` code) in nanoseconds."""
    return float(np.ones((), dtype=f"timedelta64[{unit}]").astype("timedelta64[ns]").astype(np.int64))


def is_datetime_like(values) -> bool:
    """Whether ``values`` are calendar times that :class:`TimeAxis` converts.

    :param values: anything: a pandas ``Timestamp``/``DatetimeIndex``/``Series``, NumPy ``datetime64`` values,
        ``datetime``/``date`` objects (or sequences of them), tensors or numbers (the last two are not calendar times).
    :raises TypeError: for time-zone-aware times.
    """
    return _as_datetime64(values) is not None


class TimeAxis:
    r"""Calendar times as numbers: :math:`t = (\mathrm{time} - \mathrm{origin}) / \mathrm{unit}`, in float64.

    :param unit: one of ``"W"``, ``"D"``, ``"h"``, ``"m"``, ``"s"``, ``"ms"``, ``"us"``, ``"ns"`` (NumPy's codes).
    :param origin: the time that becomes ``t = 0`` (a ``Timestamp``, ``datetime``, ``datetime64`` or ISO
        string); ``None`` (default): the earliest time of the first
        call, so that a stream starts at 0 (as LegS bases, which cover ``[0, t]``, need).

    Numbers (tensors, NumPy arrays, pandas numeric objects) pass through unchanged as float64 tensors:
    a model with a time axis still accepts times already converted.
    """

    def __init__(self, unit: str = "h", origin=None):
        if unit not in UNITS:
            raise ValueError(f"unit must be one of {UNITS}, got {unit!r}")
        #: the unit of the numbers (NumPy's code, e.g. ``"h"``)
        self.unit = unit
        #: the time that is ``t = 0`` (``numpy.datetime64`` in ns; ``None`` until set or taken from the first times)
        self.origin: np.datetime64 | None = None
        if origin is not None:
            if isinstance(origin, str):
                try:
                    origin = np.datetime64(origin, "ns")
                except ValueError:
                    raise ValueError(f"origin must be an ISO date or time such as '2013-01-01', got {origin!r}") from None
            converted = _as_datetime64(origin)
            if converted is None or converted.size != 1:
                raise TypeError(f"origin must be one calendar time (a Timestamp, datetime or datetime64), got {origin!r}")
            self.origin = converted.reshape(-1)[0]

    def __repr__(self) -> str:
        return f"TimeAxis(unit={self.unit!r}, origin={None if self.origin is None else str(self.origin)!r})"

    def __call__(self, values) -> Tensor:
        """``values`` as a float64 tensor of times in :attr:`unit` since :attr:`origin` (same shape)."""
        array = _as_datetime64(values)
        if array is None:
            if isinstance(values, Tensor):
                return values.to(torch.float64)
            try:
                return torch.as_tensor(np.array(values, dtype=np.float64))
            except (TypeError, ValueError):
                raise TypeError(f"times must be calendar times or numbers, got {type(values).__name__}") from None
        if np.isnat(array).any():
            raise ValueError("the times contain NaT (missing times): drop those rows first")
        if self.origin is None:
            self.origin = array.min()
        step = _nanoseconds(self.unit)
        offsets = (array - self.origin).astype("timedelta64[ns]").astype(np.float64) / step
        return torch.as_tensor(offsets, dtype=torch.float64)

    def to_datetime(self, t) -> np.ndarray:
        r"""The calendar times :math:`\mathrm{origin} + t \cdot \mathrm{unit}` of numbers ``t`` (``datetime64[ns]``), e.g. for plots.

        :param t: times in :attr:`unit` since :attr:`origin`, a tensor, array or number of any shape (rounded to nanoseconds).
        :raises RuntimeError: if the axis has no origin yet.
        """
        if self.origin is None:
            raise RuntimeError("this TimeAxis has no origin yet: convert the first times (or pass origin=) first")
        t = np.asarray(t.detach().cpu() if isinstance(t, Tensor) else t, dtype=np.float64)
        step = _nanoseconds(self.unit)
        return self.origin + (t * step).round().astype("timedelta64[ns]")

    def state(self) -> dict:
        """``unit`` and ``origin`` (ISO string) for a checkpoint; :meth:`from_state` rebuilds the axis."""
        return {"unit": self.unit, "origin": None if self.origin is None else str(self.origin)}

    @classmethod
    def from_state(cls, state: dict) -> TimeAxis:
        """The axis that :meth:`state` saved.

        :param state: a dict with ``"unit"`` (one of :data:`UNITS`) and ``"origin"`` (an ISO string, or ``None``/absent for none yet).
        """
        origin = state.get("origin")
        return cls(state["unit"], None if origin is None else np.datetime64(origin, "ns"))
