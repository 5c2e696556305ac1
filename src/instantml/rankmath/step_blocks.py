"""A step series' sums by block of steps: the band chart's buckets without its step rows.

A step block is the same interval of steps as a rank block (:mod:`.covers`: level k holds
the 4**k steps from a multiple of 4**k), with one row per series instead of one per rank:
what a bucket of the band chart needs of its steps (docs/reference.md, "The Distributed
summary"): the present steps' count, first and last; the sums of the six meaned reducers
over the steps with a finite value and how many those are; the least of the minima and the
greatest of the maxima; the largest ``expected``; the marks and finite values summed; the
steps whose every expected rank reported; and the least-covered step (fewest count +
marks, the earliest on ties) with its count and marks. A row of level 0 is one step row;
rows combine by summing, taking extremes and the least-covered of the least-covered, so a
bucket aligned to a block is that block's row, and any interval is a few block rows and
step rows at its edges. This is the one definition: the band's buckets are made here from
step rows or block rows alike.
"""

from __future__ import annotations

import numpy as np

MEANED = ("mean", "weighted_mean", "std", "p05", "p50", "p95")
# A step block's columns, after (series, level, start), in every store's order.
FIELDS = (
    "steps", "first_step", "last_step", "valued", *MEANED, "min", "max", "expected",
    "nonfinite", "points", "full_steps", "least_covered", "least_step", "least_n",
    "least_nonfinite",
)  # fmt: skip
INTS = frozenset(FIELDS) - set(MEANED) - {"min", "max"}
_SUMMED = ("steps", "valued", *MEANED, "nonfinite", "points", "full_steps")
_LEAST = ("least_covered", "least_step", "least_n", "least_nonfinite")
Rows = dict[str, np.ndarray]


def of_steps(stats: dict[str, np.ndarray]) -> Rows:
    """Step rows (``step, n, expected, nonfinite`` and the reducers; NaN reducers where a
    step has no finite value) as rows of one step each."""
    step = np.asarray(stats["step"], dtype=np.int64)
    n = np.asarray(stats["n"], dtype=np.int64)
    marks = np.asarray(stats["nonfinite"], dtype=np.int64)
    expected = np.asarray(stats["expected"], dtype=np.int64)
    valued = n > 0
    covered = n + marks
    rows: Rows = {
        "steps": np.ones(len(step), dtype=np.int64),
        "first_step": step,
        "last_step": step,
        "valued": valued.astype(np.int64),
        **{name: np.where(valued, stats[name], 0.0) for name in MEANED},
        "min": np.where(valued, stats["min"], np.inf),
        "max": np.where(valued, stats["max"], -np.inf),
        "expected": expected,
        "nonfinite": marks,
        "points": n,
        "full_steps": (covered == expected).astype(np.int64),
        "least_covered": covered,
        "least_step": step,
        "least_n": n,
        "least_nonfinite": marks,
    }
    return rows


def combine(group: np.ndarray, rows: Rows) -> tuple[np.ndarray, Rows]:
    """Rows summed per group: the groups (ascending) and their rows."""
    group = np.asarray(group, dtype=np.int64)
    if not len(group):
        return group, {name: rows[name][:0] for name in FIELDS}
    order = np.lexsort((rows["least_step"], rows["least_covered"], group))
    g = group[order]
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    out: Rows = {}
    for name in _SUMMED:
        out[name] = np.add.reduceat(rows[name][order], starts)
    out["first_step"] = np.minimum.reduceat(rows["first_step"][order], starts)
    out["min"] = np.minimum.reduceat(rows["min"][order], starts)
    for name in ("last_step", "max", "expected"):
        out[name] = np.maximum.reduceat(rows[name][order], starts)
    for name in _LEAST:  # the first of each group in (covered, step) order
        out[name] = rows[name][order][starts]
    return g[starts], out


def concat(parts: list[Rows]) -> Rows:
    return {name: np.concatenate([p[name] for p in parts]) for name in FIELDS}


def entries(rows: Rows) -> dict[str, np.ndarray]:
    """The band's entries of these rows (one per bucket): ``step`` and ``step_end`` (its
    first and last present steps), the means of its steps' reducers (NaN when none has a
    finite value), min of mins, max of maxes, the ``count`` and ``nonfinite`` of its
    least-covered step, its marks summed (``nonfinite_total``) and largest ``expected``."""
    valued = rows["valued"]
    out = {
        "step": rows["first_step"],
        "step_end": rows["last_step"],
        "count": rows["least_n"],
        "expected": rows["expected"],
        "nonfinite": rows["least_nonfinite"],
        "nonfinite_total": rows["nonfinite"],
        "min": np.where(valued > 0, rows["min"], np.nan),
        "max": np.where(valued > 0, rows["max"], np.nan),
    }
    with np.errstate(invalid="ignore", divide="ignore"):
        for name in MEANED:
            out[name] = np.where(valued > 0, rows[name] / np.maximum(valued, 1), np.nan)
    return out
