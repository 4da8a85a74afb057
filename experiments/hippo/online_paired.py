"""Per-seed comparison of the online runner's methods against a reference method.

Usage::

    python -m experiments.hippo.online_paired out/irradiance-M50/results.csv [--reference ohsgpr]

Reads a ``results.csv`` of :mod:`experiments.hippo.online` and reduces every
``(method, seed)`` to the numbers after the last task: the mean over tasks of each task's test NLPD
/ RMSE (/ ECE for counts), task 1's test NLPD (forgetting) and the cumulative training time. Within
a seed all methods share the task split, the test points and the hyperparameters fitted on task 1,
so differences between methods are paired by seed. Printed (Markdown):

* per method, mean ± standard error over seeds of each number;
* per method and number, the paired differences ``method - reference`` (lower NLPD/RMSE/ECE/time
  is better): their mean ± standard error, in how many seeds the method is lower than the
  reference, and the exact two-sided sign-test p-value. With 5 seeds the sign test cannot go below
  :math:`p = 0.0625`: "lower in 5/5 seeds" is the strongest statement such a run supports, and a mean
  difference within about two standard errors of zero is not a difference.

The reference defaults to ``ohsgpr`` (``ohsvgp`` when the file has no ``ohsgpr``).
"""

from __future__ import annotations

import argparse
import csv
import math
from collections.abc import Sequence

from scipy import stats

__all__ = ["per_seed", "mean_se", "paired", "format_tables", "main"]

#: The per-row quantities the paired comparison reads.
QUANTITIES = ("nlpd", "rmse", "ece", "nlpd_task1", "time")


def _number(value) -> float:
    return math.nan if value in ("", None) else float(value)


def per_seed(rows: Sequence[dict]) -> dict[str, dict[int, dict[str, float]]]:
    """``method -> seed -> {quantity: value}`` after each (method, seed)'s last task (module docstring).

    :param rows: the rows of a ``results.csv`` (dicts of strings, as ``csv.DictReader`` gives).
    """
    last: dict[tuple, int] = {}
    for r in rows:
        key = (r["method"], int(r["seed"]))
        last[key] = max(last.get(key, 0), int(r["task_trained"]))
    out: dict[str, dict[int, dict[str, float]]] = {}
    for (method, seed), final in last.items():
        mine = [r for r in rows if r["method"] == method and int(r["seed"]) == seed and int(r["task_trained"]) == final]
        values = {m: sum(_number(r[m]) for r in mine) / len(mine) for m in ("nlpd", "rmse", "ece")}
        values["nlpd_task1"] = next(_number(r["nlpd"]) for r in mine if int(r["task_eval"]) == 1)
        values["time"] = _number(mine[0]["cum_time_s"])
        out.setdefault(method, {})[seed] = values
    return out


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    r"""Mean and standard error (:math:`s / \sqrt{n}` with :math:`s` the sample sd; nan for one value).

    :param values: the values, at least one.
    """
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def paired(reference: dict[int, dict[str, float]], other: dict[int, dict[str, float]], quantity: str) -> dict:
    """Differences ``other - reference`` over the seeds both have: per seed, mean, s.e., number of
    seeds where ``other`` is lower, and the exact two-sided sign-test p-value of the non-zero ones.

    :param reference: ``seed -> {quantity: value}`` of the reference method (from :func:`per_seed`).
    :param other: the same for the compared method.
    :param quantity: one of :data:`QUANTITIES`.
    """
    seeds = sorted(set(reference) & set(other))
    if not seeds:
        raise ValueError("the two methods share no seed to pair")
    diffs = [other[s][quantity] - reference[s][quantity] for s in seeds]
    nonzero = [d for d in diffs if d != 0]
    sign_p = float(stats.binomtest(sum(d < 0 for d in nonzero), len(nonzero), 0.5).pvalue) if nonzero else 1.0
    mean, se = mean_se(diffs)
    return {"seeds": seeds, "differences": diffs, "mean": mean, "se": se, "lower": sum(d < 0 for d in diffs), "sign_p": sign_p}


def _fmt(mean: float, se: float, digits: int = 3) -> str:
    if math.isnan(mean):
        return "–"
    return f"{mean:.{digits}f}" if math.isnan(se) else f"{mean:.{digits}f} ± {se:.{digits}f}"


def format_tables(rows: Sequence[dict], reference: str | None = None) -> str:
    """The two Markdown tables of the module docstring.

    :param rows: the rows of one or more ``results.csv`` files.
    :param reference: the method the others are paired against; ``None`` (default): ``ohsgpr``, or ``ohsvgp`` without it.
    """
    seeds = per_seed(rows)
    if reference is None:
        reference = "ohsgpr" if "ohsgpr" in seeds else "ohsvgp"
    if reference not in seeds:
        raise ValueError(f"reference method {reference!r} is not in the rows ({', '.join(seeds)})")
    quantities = [q for q in QUANTITIES if not all(math.isnan(v[q]) for s in seeds.values() for v in s.values())]
    names = {
        "nlpd": "NLPD (all tasks)",
        "rmse": "RMSE (all tasks)",
        "ece": "ECE (all tasks)",
        "nlpd_task1": "NLPD task 1",
        "time": "time (s)",
    }
    n = {m: len(s) for m, s in seeds.items()}
    lines = ["| method | seeds | " + " | ".join(names[q] for q in quantities) + " |", "| --- | --- |" + " --- |" * len(quantities)]
    for method, by_seed in seeds.items():
        cells = [_fmt(*mean_se([v[q] for v in by_seed.values()]), digits=2 if q == "time" else 3) for q in quantities]
        lines.append(f"| {method} | {n[method]} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Paired by seed, `method - {reference}` (mean ± s.e.; lower in k/n seeds; two-sided sign-test p):",
        "",
        "| method | " + " | ".join(names[q] for q in quantities) + " |",
        "| --- |" + " --- |" * len(quantities),
    ]
    for method, by_seed in seeds.items():
        if method == reference:
            continue
        cells = []
        for q in quantities:
            d = paired(seeds[reference], by_seed, q)
            digits = 2 if q == "time" else 3
            cells.append(
                f"{d['mean']:+.{digits}f} ± {d['se']:.{digits}f} ({d['lower']}/{len(d['seeds'])}, p={d['sign_p']:.2f})"
                if not math.isnan(d["mean"])
                else "–"
            )
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> str:
    """The command line (module docstring): read the CSV files, print and return the tables.

    :param argv: the arguments (CSV paths, ``--reference``); ``None`` (default): ``sys.argv[1:]``.
    """
    parser = argparse.ArgumentParser(prog="python -m experiments.hippo.online_paired", description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", nargs="+", help="results.csv files of the online runner (rows are concatenated)")
    parser.add_argument("--reference", default=None, help="method the others are paired against (default ohsgpr/ohsvgp)")
    args = parser.parse_args(argv)
    rows: list[dict] = []
    for path in args.csv:
        with open(path) as handle:
            rows += list(csv.DictReader(handle))
    if not rows:
        raise ValueError(f"no rows in {', '.join(args.csv)}")
    text = format_tables(rows, args.reference)
    print(text)
    return text


if __name__ == "__main__":
    main()
