"""Calendar time as the online models' inputs: one documented conversion with a unit, an origin and a zone.

The online GPs work in plain numbers: a time ``t`` in some unit since some origin (HiPPO's LegS
bases cover ``[0, t]``, so the origin belongs near the stream's start, and the unit sets the
length scales). :class:`TimeAxis` turns pandas ``Timestamp``/``DatetimeIndex``/``Series``, NumPy
``datetime64`` values and ``datetime`` objects into such numbers, ``(t - origin) / unit``, and back;
times with a time zone are converted to UTC and their zone is recorded.
:class:`~gpytorch_hippo.online.OnlineSGPR` keeps one (``time_axis=``, saved in its ``state_dict``) so
that ``update``, ``log_bound``, prediction and ``model.time_axis(timestamp)`` (for ``advance``) take calendar
times. It needs NumPy only (pandas objects convert through their own ``tz_convert`` and ``numpy.asarray``).
"""

from __future__ import annotations

import datetime

import numpy as np
import torch
from torch import Tensor

__all__ = ["TimeAxis", "align_on_index", "as_time_axis", "is_datetime_like", "restore_time_axis"]

#: the units of :class:`TimeAxis` (NumPy's ``timedelta64`` codes)
UNITS = ("W", "D", "h", "m", "s", "ms", "us", "ns")


def align_on_index(x, y, names: tuple[str, str] = ("train_x", "train_y")):
    """A pandas ``y`` in the row order of ``x``'s labels (its index, or its values for a pandas ``Index``), as
    pandas aligns rows; ``y`` unchanged if either has no labels; a ``ValueError`` if ``y`` holds other labels.

    Args:
        x: the inputs: a pandas ``Series``/``DataFrame`` (labelled by its index), a pandas ``Index``
            (labelled by its values, as in ``update(series.index, series)``) or anything else (no labels).
        y: the targets: a pandas ``Series``/``DataFrame`` is aligned; anything else is returned as it is.
        names: the two arguments' names, for the error message.
    """
    x_name, y_name = names
    if not (hasattr(y, "reindex") and hasattr(y, "index")):
        return y
    labels = x.index if hasattr(x, "reindex") and hasattr(x, "index") else x
    if not hasattr(labels, "get_indexer") or y.index.equals(labels):
        return y
    if len(labels) == len(y) and labels.is_unique and y.index.is_unique and bool(y.index.isin(labels).all()):
        return y.reindex(labels)
    raise ValueError(
        f"{y_name}'s index does not hold the labels of {x_name}'s rows (pandas aligns rows on them): align the two "
        f"first (e.g. {y_name}.reindex({x_name}.index)), or pass {y_name}.to_numpy() to pair the rows by position"
    )


def as_time_axis(value: TimeAxis | str | None) -> TimeAxis | None:
    """The ``time_axis=`` argument of the online models and fleets as a :class:`TimeAxis` (``None`` stays ``None``).

    :param value: a :class:`TimeAxis`, its unit (e.g. ``"h"``: an axis whose origin is the first times'), or ``None``.
    :raises TypeError: for anything else.
    """
    if isinstance(value, str):
        return TimeAxis(value)
    if value is not None and not isinstance(value, TimeAxis):
        raise TypeError(f"time_axis must be a TimeAxis, a unit such as 'h', or None, got {type(value).__name__}")
    return value


def _is_time(value) -> bool:
    """Whether ``value`` is one calendar time (``datetime``, ``date``, ``datetime64`` or pandas ``Timestamp``)."""
    return isinstance(value, (datetime.datetime, datetime.date, np.datetime64)) or type(value).__name__ == "Timestamp"


def _as_datetime64(values) -> tuple[np.ndarray, str | None] | None:
    """``values`` as a ``datetime64[ns]`` array (in UTC for times with a zone) and their zone (``None``: naive
    times), or ``None`` if they are not calendar times."""
    if isinstance(values, Tensor):
        return None
    if _is_time(values):
        values = [values]
    tz = getattr(getattr(values, "dt", values), "tz", None)  # a pandas DatetimeIndex or Series with a zone
    if tz is not None:
        values = values.dt.tz_convert(None) if hasattr(values, "dt") else values.tz_convert(None)
        return np.asarray(values).astype("datetime64[ns]"), str(tz)
    try:
        array = np.asarray(values)
    except (TypeError, ValueError):
        return None
    if array.dtype.kind == "M":
        return array.astype("datetime64[ns]"), None
    if array.dtype.kind != "O" or not array.size or not all(_is_time(v) for v in array.flat):
        return None
    zones = [getattr(v, "tzinfo", None) for v in array.flat]
    if all(zone is None for zone in zones):
        return array.astype("datetime64[ns]"), None
    if any(zone is None for zone in zones):
        raise TypeError("the times mix values with and without a time zone: give every time a zone (e.g. .tz_localize('UTC')) first")
    utc = [v.astimezone(datetime.UTC).replace(tzinfo=None) for v in array.flat]
    return np.array(utc).astype("datetime64[ns]").reshape(array.shape), str(zones[0])


def _nanoseconds(unit: str) -> float:
    """One ``unit`` (a NumPy ``timedelta64`` code) in nanoseconds."""
    return float(np.ones((), dtype=f"timedelta64[{unit}]").astype("timedelta64[ns]").astype(np.int64))


def is_datetime_like(values) -> bool:
    """Whether ``values`` are calendar times that :class:`TimeAxis` converts.

    :param values: anything: a pandas ``Timestamp``/``DatetimeIndex``/``Series``, NumPy ``datetime64`` values,
        ``datetime``/``date`` objects (or sequences of them), with or without a time zone, tensors or numbers (the
        last two are not calendar times).
    :raises TypeError: for a sequence that mixes times with and without a time zone.
    """
    return _as_datetime64(values) is not None


class TimeAxis:
    r"""Calendar times as numbers: :math:`t = (\mathrm{time} - \mathrm{origin}) / \mathrm{unit}`, in float64.

    :param unit: one of ``"W"``, ``"D"``, ``"h"``, ``"m"``, ``"s"``, ``"ms"``, ``"us"``, ``"ns"`` (NumPy's codes).
    :param origin: the time that becomes ``t = 0`` (a ``Timestamp``, ``datetime``, ``datetime64`` or ISO
        string, with or without a time zone); ``None`` (default): the earliest time of the first non-empty
        call, so that a stream starts at 0 (as LegS bases, which cover ``[0, t]``, need).

    Times with a time zone (pandas ``tz``, ``datetime`` ``tzinfo``) are converted to UTC, so that a change of
    daylight-saving time or of zone moves nothing; the zone of the first ones is recorded in :attr:`zone`. An
    axis takes either kind, not both: naive times on an axis with a zone (or the reverse) raise a
    ``TypeError`` that names the conversion. Numbers (tensors, NumPy arrays, pandas numeric objects) pass
    through unchanged as float64 tensors: a model with a time axis still accepts times already converted.
    """

    def __init__(self, unit: str = "h", origin=None):
        if unit not in UNITS:
            raise ValueError(f"unit must be one of {UNITS}, got {unit!r}")
        #: the unit of the numbers (NumPy's code, e.g. ``"h"``)
        self.unit = unit
        #: the time that is ``t = 0`` (``numpy.datetime64`` in ns, in UTC if :attr:`zone` is set; ``None`` until set
        #: or taken from the first times)
        self.origin: np.datetime64 | None = None
        #: the time zone of the times (e.g. ``"America/New_York"``; ``None``: naive times, or none seen yet)
        self.zone: str | None = None
        if origin is not None:
            if isinstance(origin, str):
                try:
                    origin = np.datetime64(origin, "ns")
                except ValueError:
                    raise ValueError(f"origin must be an ISO date or time such as '2013-01-01', got {origin!r}") from None
            converted = _as_datetime64(origin)
            if converted is None or converted[0].size != 1:
                raise TypeError(f"origin must be one calendar time (a Timestamp, datetime or datetime64), got {origin!r}")
            self.origin, self.zone = converted[0].reshape(-1)[0], converted[1]

    def __repr__(self) -> str:
        zone = "" if self.zone is None else f", zone={self.zone!r}"
        return f"TimeAxis(unit={self.unit!r}, origin={None if self.origin is None else str(self.origin)!r}{zone})"

    def __call__(self, values) -> Tensor:
        """``values`` as a float64 tensor of times in :attr:`unit` since :attr:`origin` (same shape; an empty call
        leaves the origin unset)."""
        converted = _as_datetime64(values)
        if converted is None:
            if isinstance(values, Tensor):
                return values.to(torch.float64)
            try:
                return torch.as_tensor(np.array(values, dtype=np.float64))
            except (TypeError, ValueError):
                raise TypeError(f"times must be calendar times or numbers, got {type(values).__name__}") from None
        array, zone = converted
        if np.isnat(array).any():
            raise ValueError("the times contain NaT (missing times): drop those rows first")
        if self.origin is not None and (zone is None) != (self.zone is None):
            if zone is None:
                raise TypeError(
                    f"these times have no time zone but this axis's are in {self.zone}: "
                    f"give them one first (e.g. index.tz_localize({self.zone!r}))"
                )
            raise TypeError(
                f"these times are in {zone} but this axis's origin {self.origin} has no time zone: drop the zone "
                "first (index.tz_convert(None) gives UTC), or build the axis with an origin that has one"
            )
        if self.origin is None and array.size:
            self.origin, self.zone = array.min(), zone
        if not array.size:
            return torch.zeros(array.shape, dtype=torch.float64)
        step = _nanoseconds(self.unit)
        offsets = (array - self.origin).astype("timedelta64[ns]").astype(np.float64) / step
        return torch.as_tensor(offsets, dtype=torch.float64)

    def to_datetime(self, t) -> np.ndarray:
        r"""The calendar times :math:`\mathrm{origin} + t \cdot \mathrm{unit}` of numbers ``t`` (``datetime64[ns]``, in UTC
        if the axis has a :attr:`zone`), e.g. for plots.

        :param t: times in :attr:`unit` since :attr:`origin`, a tensor, array or number of any shape (rounded to nanoseconds).
        :raises RuntimeError: if the axis has no origin yet.
        """
        if self.origin is None:
            raise RuntimeError("this TimeAxis has no origin yet: convert the first times (or pass origin=) first")
        t = np.asarray(t.detach().cpu() if isinstance(t, Tensor) else t, dtype=np.float64)
        step = _nanoseconds(self.unit)
        return self.origin + (t * step).round().astype("timedelta64[ns]")

    def state(self) -> dict:
        """``unit``, ``origin`` (ISO string, in UTC with a zone) and ``zone`` for a checkpoint; :meth:`from_state`
        rebuilds the axis and :meth:`load_state` restores it into an existing one."""
        return {"unit": self.unit, "origin": None if self.origin is None else str(self.origin), "zone": self.zone}

    @classmethod
    def from_state(cls, state: dict) -> TimeAxis:
        """The axis that :meth:`state` saved.

        :param state: a dict with ``"unit"`` (one of :data:`UNITS`), ``"origin"`` (an ISO string, or ``None``/absent
            for none yet) and ``"zone"`` (a zone name, or ``None``/absent for naive times).
        """
        axis = cls(state["unit"])
        axis.load_state(state)
        return axis

    def load_state(self, state: dict) -> None:
        """Restore what :meth:`state` saved into this axis: it takes the saved origin and zone if it has no origin
        yet; otherwise they must equal its own.

        :param state: a dict as :meth:`from_state` takes.
        :raises ValueError: if the unit differs, or this axis has another origin or zone (nothing is changed).
        """
        saved = TimeAxis(state["unit"])
        if state.get("origin") is not None:
            saved.origin, saved.zone = np.datetime64(state["origin"], "ns"), state.get("zone")
        same_origin = saved.origin is None or self.origin is None or (saved.origin, saved.zone) == (self.origin, self.zone)
        if saved.unit != self.unit or not same_origin:
            raise ValueError(
                f"the saved time axis is {saved!r} but this one is {self!r}: build this one as "
                f"TimeAxis({saved.unit!r}) (it then takes the saved origin) or with the saved origin"
            )
        if self.origin is None:
            self.origin, self.zone = saved.origin, saved.zone


def restore_time_axis(axis: TimeAxis | None, saved: dict | None) -> TimeAxis | None:
    """``axis`` with a checkpoint's saved axis restored into it (:meth:`TimeAxis.load_state`: it takes the saved origin
    and zone if it has no origin yet); without an axis, the saved one (:meth:`TimeAxis.from_state`); without a saved
    one, ``axis`` as it is.

    :param axis: the axis of the model or fleet being restored (changed in place), or ``None``.
    :param saved: what :meth:`TimeAxis.state` saved, or ``None``.
    :raises ValueError: if the saved axis has another unit, or another origin or zone than ``axis`` has.
    """
    if saved is None:
        return axis
    if axis is None:
        return TimeAxis.from_state(saved)
    axis.load_state(saved)
    return axis
