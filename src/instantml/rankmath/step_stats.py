"""The per-step reducers and per-point scores (docs/reference.md), over numpy columns: the one
implementation every point store uses, when it stages new steps and when it refreshes
stale ones. The definitions:

- ``mean`` and ``weighted_mean`` are exactly the value when every value is equal;
- ``std`` is the population deviation ``sqrt(sum((v - mean)^2) / n)``;
- ``p05``/``p50``/``p95`` interpolate linearly between closest ranks (``quantile_cont``);
- ``mad`` is the median of ``|v - p50|``, ``mean_ad`` its mean;
- ``z = (v - mean) / std`` (0 when std is 0);
- ``robust_z = (v - p50) / max(sigma_s, sigma_ref)``: ``sigma_s = 1.4826 c_n mad`` is the
  step's robust spread (``c_n`` the MAD's small-sample factor), ``sigma_ref`` the median
  of ``sigma_t`` over the key's last 64 steps up to and including this one that have at
  least 2 finite values (``reference_spread``: with 2-8 ranks the MAD of one step is
  often near 0 by chance, and ordinary noise would score hundreds); when both are 0,
  ``0.7979 (v - p50) / mean_ad``, or 0 when that is 0 too. The steps given are taken as
  the key's steps in order, after ``history`` (the spreads of the qualifying steps before
  them, oldest first);
- a NaN or +-inf value is a mark (docs/reference.md, "The Distributed summary"): it
  counts in its step's ``expected`` and ``nonfinite`` and nowhere else; it has no scores
  (NaN), and a step whose values are all marks has ``n`` 0 and NaN reducers.
"""

from __future__ import annotations

import warnings

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
    steps: np.ndarray,
    values: np.ndarray,
    weights: np.ndarray,
    world_sizes: np.ndarray,
    history: np.ndarray | None = None,
) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
    """``(stats, delta, z, robust_z)``: one row of stats per distinct step (ascending), and
    the scores of each point in the order given. One point per (step, rank) expected;
    ``history``: the robust spreads of the key's qualifying steps before these."""
    finite = np.isfinite(values)
    if finite.all():
        stats, delta, z, robust = _finite_stats(steps, values, weights, world_sizes, history)
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
            steps[finite], values[finite], weights[finite], world_sizes[finite], history
        )
        rows = np.searchsorted(all_steps, part["step"])
        stats["n"][rows] = part["n"]
        for name in STAT_NAMES:
            stats[name][rows] = part[name]
        scores[:, finite] = delta, z, robust
    return stats, scores[0], scores[1], scores[2]


def _finite_stats(
    steps: np.ndarray,
    values: np.ndarray,
    weights: np.ndarray,
    world_sizes: np.ndarray,
    history: np.ndarray | None,
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
    spread = robust_spread(counts, mad)
    scale = np.fmax(spread, reference_spread(spread, counts, history))  # NaN ref: the step's
    g_std, g_scale, g_mean_ad = std[group], scale[group], mean_ad[group]
    centred = v - p50[group]
    with np.errstate(divide="ignore", invalid="ignore"):
        z_sorted = np.where(g_std > 0, delta_sorted / g_std, 0.0)
        robust_sorted = np.where(
            g_scale > 0,
            centred / g_scale,
            np.where(g_mean_ad > 0, 0.7979 * centred / g_mean_ad, 0.0),
        )
    delta, z, robust = (np.empty_like(v) for _ in range(3))
    delta[order], z[order], robust[order] = delta_sorted, z_sorted, robust_sorted
    return stats, delta, z, robust


# The MAD's small-sample consistency factors (Croux and Rousseeuw 1992) for n = 2..9; from
# 10 values on, n / (n - 0.8).
_MAD_FACTORS = np.array([1.0, 1.0, 1.196, 1.495, 1.363, 1.206, 1.200, 1.140, 1.129, 1.107])
REFERENCE_STEPS = 64  # the steps whose typical spread floors a step's robust spread


def robust_spread(n: np.ndarray, mad: np.ndarray) -> np.ndarray:
    """Each step's robust spread ``1.4826 c_n MAD`` from its finite values' count and MAD."""
    n = np.asarray(n, dtype=np.int64)
    factor = np.where(n >= 10, n / np.maximum(n - 0.8, 1.0), _MAD_FACTORS[np.clip(n, 0, 9)])
    return 1.4826 * factor * np.asarray(mad, dtype=np.float64)


def reference_spread(
    spread: np.ndarray, n: np.ndarray, history: np.ndarray | None = None
) -> np.ndarray:
    """Per step (ascending), the median of the robust spreads of the key's last
    ``REFERENCE_STEPS`` steps up to and including it that have at least 2 finite values;
    ``history``: those spreads of the qualifying steps before the first (oldest first).
    NaN where no step qualifies yet."""
    qualifies = np.asarray(n) >= 2
    earlier = np.empty(0) if history is None else np.asarray(history, dtype=np.float64)
    earlier = earlier[len(earlier) - min(len(earlier), REFERENCE_STEPS - 1) :]
    own = np.asarray(spread, dtype=np.float64)[qualifies]
    pad = np.full(REFERENCE_STEPS - 1 - len(earlier), np.nan)
    series = np.concatenate([pad, earlier, own])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a window of NaN only: NaN
        rolling = (  # the window ending at each qualifying step
            np.nanmedian(np.lib.stride_tricks.sliding_window_view(series, REFERENCE_STEPS), axis=1)
            if len(own)
            else np.empty(0)
        )
        before = np.nanmedian(earlier) if len(earlier) else np.nan
    # A step that does not qualify takes the reference of the last one at or before it.
    upto = np.cumsum(qualifies) - 1
    return np.where(upto >= 0, rolling[np.maximum(upto, 0)] if len(rolling) else np.nan, before)


def reach(changed: list[int], later: np.ndarray) -> list[tuple[int, int]]:
    """The step ranges to score again when the points of the ``changed`` steps (ascending)
    changed: each one's own step and its reference spread's reach, the next
    ``REFERENCE_STEPS - 1`` of ``later`` (the key's scored steps after the first changed
    one that have 2 finite values or more, ascending); ranges that touch are one."""
    ranges: list[tuple[int, int]] = []
    for step in changed:
        at = int(np.searchsorted(later, step, side="right"))
        ahead = later[at : at + REFERENCE_STEPS - 1]
        end = max(step, int(ahead[-1])) if len(ahead) else step
        if ranges and step <= ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], max(ranges[-1][1], end))
        else:
            ranges.append((step, end))
    return ranges
