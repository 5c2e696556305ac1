"""The per-step reducers and per-point scores of DESIGN.md, over numpy columns: the one
implementation every point store uses, when it stages new steps and when it refreshes
stale ones. The definitions:

- ``mean`` and ``weighted_mean`` are exactly the value when every value is equal;
- ``std`` is the population deviation ``sqrt(sum((v - mean)^2) / n)``;
- ``p05``/``p50``/``p95`` interpolate linearly between closest ranks (``quantile_cont``);
- ``mad`` is the median of ``|v - p50|``, ``mean_ad`` its mean;
- ``z = (v - mean) / std`` (0 when std is 0); ``robust_z = 0.6745 (v - p50) / mad``, or
  ``0.7979 (v - p50) / mean_ad`` when mad is 0, or 0 when both are;
- a NaN or +-inf value is a mark (DESIGN.md, "Non-finite values"): it counts in its step's
  ``expected`` and ``nonfinite`` and nowhere else; it has no scores (NaN), and a step whose
  values are all marks has ``n`` 0 and NaN reducers.
"""

from __future__ import annotations

import numpy as np


def _quantile(
    sorted_values: np.ndarray, starts: np.ndarray, counts: np.ndarray, q: float
) -> np.ndarray:
    """Per group of ``sorted_values`` (each group ascending, at ``starts``)."""
    position = (counts - 1) * q
    below = np.floor(position).astype(np.int64)
    fraction = position - below
    low = sorted_values[starts + below]
    high = sorted_values[starts + np.minimum(below + 1, counts - 1)]
    return low + fraction * (high - low)


STAT_NAMES = (
    "mean", "weighted_mean", "min", "max", "std", "p05", "p50", "p95", "mad", "mean_ad"
)  # fmt: skip


def step_stats(
    steps: np.ndarray, values: np.ndarray, weights: np.ndarray, world_sizes: np.ndarray
) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
    """``(stats, delta, z, robust_z)``: one row of stats per distinct step (ascending), and
    the scores of each point in the order given. One point per (step, rank) expected."""
    finite = np.isfinite(values)
    if finite.all():
        stats, delta, z, robust = _finite_stats(steps, values, weights, world_sizes)
        stats["nonfinite"] = np.zeros(len(stats["step"]), dtype=np.int64)
        return stats, delta, z, robust
    # Marks: reducers and scores from the finite values; every point counts for expected.
    all_steps, where = np.unique(steps, return_inverse=True)
    expected = np.zeros(len(all_steps), dtype=np.int64)
    np.maximum.at(expected, where, world_sizes.astype(np.int64))
    stats = {
        "step": all_steps,
        "n": np.zeros(len(all_steps), dtype=np.int64),
        "expected": expected,
        "nonfinite": np.bincount(where, weights=~finite, minlength=len(all_steps)).astype(np.int64),
        **{name: np.full(len(all_steps), np.nan) for name in STAT_NAMES},
    }
    scores = np.full((3, len(values)), np.nan)
    if finite.any():
        part, delta, z, robust = _finite_stats(
            steps[finite], values[finite], weights[finite], world_sizes[finite]
        )
        rows = np.searchsorted(all_steps, part["step"])
        stats["n"][rows] = part["n"]
        for name in STAT_NAMES:
            stats[name][rows] = part[name]
        scores[:, finite] = delta, z, robust
    return stats, scores[0], scores[1], scores[2]


def _finite_stats(
    steps: np.ndarray, values: np.ndarray, weights: np.ndarray, world_sizes: np.ndarray
) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
    order = np.lexsort((values, steps))
    s_step, v, w = steps[order], values[order], weights[order]
    first = np.r_[True, s_step[1:] != s_step[:-1]]
    starts = np.flatnonzero(first)
    counts = np.diff(np.r_[starts, len(v)])
    group = np.cumsum(first) - 1  # each sorted point's group
    lo = v[starts]
    hi = v[starts + counts - 1]
    constant = lo == hi
    mean = np.where(constant, lo, np.add.reduceat(v, starts) / counts)
    weighted = np.where(constant, lo, np.add.reduceat(w * v, starts) / np.add.reduceat(w, starts))
    delta_sorted = v - mean[group]
    std = np.where(constant, 0.0, np.sqrt(np.add.reduceat(delta_sorted**2, starts) / counts))
    p05 = _quantile(v, starts, counts, 0.05)
    p50 = _quantile(v, starts, counts, 0.5)
    p95 = _quantile(v, starts, counts, 0.95)
    deviation = np.abs(v - p50[group])
    mad = _quantile(deviation[np.lexsort((deviation, group))], starts, counts, 0.5)
    mean_ad = np.add.reduceat(deviation, starts) / counts
    stats = {
        "step": s_step[starts],
        "n": counts,
        "expected": np.maximum.reduceat(world_sizes[order], starts),
        "mean": mean,
        "weighted_mean": weighted,
        "min": lo,
        "max": hi,
        "std": std,
        "p05": p05,
        "p50": p50,
        "p95": p95,
        "mad": mad,
        "mean_ad": mean_ad,
    }
    g_std, g_mad, g_mean_ad = std[group], mad[group], mean_ad[group]
    centred = v - p50[group]
    with np.errstate(divide="ignore", invalid="ignore"):
        z_sorted = np.where(g_std > 0, delta_sorted / g_std, 0.0)
        robust_sorted = np.where(
            g_mad > 0,
            0.6745 * centred / g_mad,
            np.where(g_mean_ad > 0, 0.7979 * centred / g_mean_ad, 0.0),
        )
    delta, z, robust = (np.empty_like(v) for _ in range(3))
    delta[order], z[order], robust[order] = delta_sorted, z_sorted, robust_sorted
    return stats, delta, z, robust
