"""Paired per-seed comparison of two methods (or two runs) of the chapter-3 experiments.

Usage::

    python -m experiments.sgpa.paired out/a/results.csv:sgpa out/b/results.csv:sgpa

Each argument is ``CSV:METHOD`` (a results file of :mod:`~experiments.sgpa.calibration`
or :mod:`~experiments.sgpa.language_model` and a method in it).  Rows are paired by seed
(each seed shares its data subsets and initialisation across methods); for every metric the table
gives the per-seed differences ``B - A``, their mean, a paired t-test p-value and the exact
two-sided sign-test p-value.  With 3 seeds the sign test cannot go below :math:`p = 0.25` (two-sided):
"B better in 3/3 seeds" is the strongest statement such a run supports.
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

from scipy import stats

__all__ = ["paired_differences", "sign_test", "format_paired", "main"]


def sign_test(differences) -> float:
    """Exact two-sided sign-test p-value of the non-zero ``differences`` (1.0 when there are none;
    NaN when a difference is NaN, e.g. a KL column of a method without one).

    :param differences: the per-seed differences (floats).
    """
    if any(math.isnan(d) for d in differences):
        return math.nan
    nonzero = [d for d in differences if d != 0]
    if not nonzero:
        return 1.0
    positive = sum(d > 0 for d in nonzero)
    return float(stats.binomtest(positive, len(nonzero), 0.5).pvalue)


def paired_differences(rows_a, rows_b, metrics) -> list[dict]:
    """Per metric: seeds, differences ``b - a`` per seed, mean, paired-t p and sign-test p.

    :param rows_a: the rows of the reference A (dicts with ``seed`` and the metric columns).
    :param rows_b: the rows of the compared B, paired with A's by seed.
    :param metrics: the metric columns to compare.
    """
    by_seed_a = {int(r["seed"]): r for r in rows_a}
    by_seed_b = {int(r["seed"]): r for r in rows_b}
    seeds = sorted(set(by_seed_a) & set(by_seed_b))
    if not seeds:
        raise ValueError("the two sets of rows share no seed to pair")
    out = []
    for metric in metrics:
        diffs = [float(by_seed_b[s][metric]) - float(by_seed_a[s][metric]) for s in seeds]
        t_p = (
            float(stats.ttest_rel([float(by_seed_b[s][metric]) for s in seeds], [float(by_seed_a[s][metric]) for s in seeds]).pvalue)
            if len(seeds) > 1
            else math.nan
        )
        out.append(
            {
                "metric": metric,
                "seeds": seeds,
                "differences": diffs,
                "mean": sum(diffs) / len(diffs),
                "t_p": t_p,
                "sign_p": sign_test(diffs),
            }
        )
    return out


def format_paired(results, label_a: str, label_b: str) -> str:
    """Markdown table of the per-seed differences ``B - A``.

    :param results: the entries of :func:`paired_differences`.
    :param label_a: the name of A shown in the heading (e.g. its ``CSV:METHOD``).
    :param label_b: the name of B shown in the heading.
    """
    lines = [
        f"B - A with A = {label_a}, B = {label_b}",
        "",
        "| metric | per-seed B - A | mean | B > A in | paired t p | sign p |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        per_seed = ", ".join(f"{d:+.4f}" for d in r["differences"])
        wins = sum(d > 0 for d in r["differences"])
        lines.append(
            f"| {r['metric']} | {per_seed} | {r['mean']:+.4f} | {wins}/{len(r['differences'])} | {r['t_p']:.3f} | {r['sign_p']:.3f} |"
        )
    return "\n".join(lines)


def _read(spec: str):
    path, _, method = spec.rpartition(":")
    if not path or not method:
        raise ValueError(f"expected CSV:METHOD, got {spec!r}")
    with open(Path(path)) as handle:
        rows = [r for r in csv.DictReader(handle) if r["method"] == method]
    if not rows:
        raise ValueError(f"no rows of method {method!r} in {path}")
    return rows


def main(argv=None) -> list[dict]:
    """The command line (module docstring): print the paired table of two methods and return its entries.

    :param argv: the command-line arguments; ``None`` (the default): ``sys.argv[1:]``.
    """
    parser = argparse.ArgumentParser(prog="python -m experiments.sgpa.paired", description=__doc__.split("\n\n")[0])
    parser.add_argument("a", help="CSV:METHOD of the reference A")
    parser.add_argument("b", help="CSV:METHOD of the compared B")
    parser.add_argument("--metrics", default="accuracy,nll,ece,auroc,kl_init,kl_final", help="comma-separated CSV columns to compare")
    args = parser.parse_args(argv)
    rows_a, rows_b = _read(args.a), _read(args.b)
    metrics = [m for m in args.metrics.split(",") if m and m in rows_a[0] and m in rows_b[0]]
    results = paired_differences(rows_a, rows_b, metrics)
    print(format_paired(results, args.a, args.b))
    return results


if __name__ == "__main__":
    main()
