"""A plain numpy reading of docs/reference.md's "The Distributed summary", point by point.

Written from the definitions, independently of the server's SQL: the tests hold the
server's answers to this.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Point:
    step: int
    rank: int
    value: float
    weight: float = 1.0
    local_rank: int | None = None
    world_size: int = 8


def _bucket_size(first: int, last: int, distinct: int, cap: int) -> int:
    """The smallest power of 4 of at least ceil(span / cap) when the range holds more than
    ``cap`` distinct steps."""
    if distinct <= cap:
        return 1
    need = math.ceil((last - first + 1) / cap)
    return next(4**k for k in range(1, 64) if 4**k >= need)


def _groups(steps: list[int], size: int) -> list[list[int]]:
    """Buckets aligned to multiples of ``size`` from step 0."""
    groups: dict[int, list[int]] = defaultdict(list)
    for s in steps:
        groups[s // size].append(s)
    return [groups[k] for k in sorted(groups)]


def _mark(value: float) -> str:
    return "nan" if value != value else ("inf" if value > 0 else "-inf")


def _mean_or_none(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


# The MAD's small-sample consistency factors (Croux and Rousseeuw 1992), n = 2..9.
_C = {2: 1.196, 3: 1.495, 4: 1.363, 5: 1.206, 6: 1.200, 7: 1.140, 8: 1.129, 9: 1.107}


def robust_spreads(latest: dict[tuple[int, int], Point]) -> dict[int, float]:
    """Per step of the key (every step, whatever the range asked): sigma_ref, the median of
    the robust spreads 1.4826 c_n MAD of its last 64 steps up to and including it that
    have at least 2 finite values (NaN before any has)."""
    values: dict[int, list[float]] = defaultdict(list)
    for (step, _), p in latest.items():
        if math.isfinite(p.value):
            values[step].append(p.value)
    qualifying: list[float] = []
    out: dict[int, float] = {}
    for step in sorted({s for s, _ in latest}):
        v = values.get(step, [])
        if len(v) >= 2:
            n = len(v)
            mad = float(np.median(np.abs(np.array(v) - np.median(v))))
            qualifying.append(1.4826 * (_C[n] if n < 10 else n / (n - 0.8)) * mad)
        out[step] = float(np.median(qualifying[-64:])) if qualifying else math.nan
    return out


def reference(
    writes: list[Point],
    step_min: int | None = None,
    step_max: int | None = None,
    max_points: int = 500,
    heatmap_steps: int = 200,
    z: float = 3.0,
    outlier_limit: int = 100,
) -> dict[str, Any]:
    latest: dict[tuple[int, int], Point] = {}
    for p in writes:  # a rank's latest write wins
        latest[(p.step, p.rank)] = p
    world_size = max(p.world_size for p in latest.values())
    lo = -1 if step_min is None else step_min
    hi = math.inf if step_max is None else step_max
    points = [p for p in latest.values() if lo <= p.step <= hi]
    by_step: dict[int, list[Point]] = defaultdict(list)
    for p in points:
        by_step[p.step].append(p)
    steps = sorted(by_step)

    # NaN and +-inf are marks: a report (coverage), never a value (reducers, scores, cells).
    stats: dict[int, dict[str, Any]] = {}
    scores: dict[tuple[int, int], tuple[float, float, float]] = {}
    reference_spread = robust_spreads(latest)
    for s in steps:
        every = sorted(by_step[s], key=lambda p: p.rank)
        ps = [p for p in every if math.isfinite(p.value)]
        entry: dict[str, Any] = {
            "count": len(ps),
            "expected": max(p.world_size for p in every),
            "nonfinite": len(every) - len(ps),
        }
        stats[s] = entry
        if not ps:
            entry.update(dict.fromkeys(
                ("mean", "weighted_mean", "min", "max", "std", "p05", "p50", "p95")
            ))  # fmt: skip
            continue
        v = np.array([p.value for p in ps])
        w = np.array([p.weight for p in ps])
        constant = bool(v.min() == v.max())
        mean = float(v[0]) if constant else float(v.mean())
        std = 0.0 if constant else float(np.sqrt(((v - mean) ** 2).sum() / len(v)))
        p05, p50, p95 = (float(x) for x in np.percentile(v, [5, 50, 95]))
        ad = np.abs(v - p50)
        mad, mean_ad = float(np.median(ad)), float(ad.mean())
        n = len(v)
        sigma = 1.4826 * (_C.get(n, 1.0) if n < 10 else n / (n - 0.8)) * mad
        scale = (
            max(sigma, reference_spread[s]) if reference_spread[s] == reference_spread[s] else sigma
        )
        entry.update(
            {
                "mean": mean,
                "weighted_mean": float(v[0]) if constant else float((w * v).sum() / w.sum()),
                "min": float(v.min()),
                "max": float(v.max()),
                "std": std,
                "p05": p05,
                "p50": p50,
                "p95": p95,
            }
        )
        for p in ps:
            delta = p.value - mean
            zs = delta / std if std > 0 else 0.0
            if scale > 0:
                robust = (p.value - p50) / scale
            elif mean_ad > 0:
                robust = 0.7979 * (p.value - p50) / mean_ad
            else:
                robust = 0.0
            scores[(s, p.rank)] = (delta, zs, robust)

    def is_outlier(key: tuple[int, int]) -> bool:
        _, zs, robust = scores[key]
        return abs(zs) >= z or abs(robust) >= 3.5

    if not steps:
        return {
            "world_size": world_size,
            "steps": [],
            "step_range": None,
            "bucket_size": 1,
            "coverage": {"full_steps": 0, "partial_steps": 0, "missing": []},
            "heatmap": {
                "ranks": [],
                "bucket_size": 1,
                "buckets": [],
                "values": [],
                "nonfinite": [],
            },
            "outliers": [],
            "outliers_total": 0,
            "ranks": [],
            "first_nonfinite": None,
            "all_scores": [],
        }

    size = _bucket_size(steps[0], steps[-1], len(steps), max_points)
    step_rows = []
    for group in _groups(steps, size):
        rows = [stats[s] for s in group]
        valued = [r for r in rows if r["count"]]
        # The least-covered step: fewest count + nonfinite, the earliest on ties.
        least = min(rows, key=lambda r: r["count"] + r["nonfinite"])
        lo_v = min((r["min"] for r in valued), default=None)
        hi_v = max((r["max"] for r in valued), default=None)
        step_rows.append(
            {
                "step": group[0],
                "step_end": group[-1],
                "count": least["count"],
                "expected": max(r["expected"] for r in rows),
                **{
                    k: _mean_or_none([r[k] for r in valued])
                    for k in ("mean", "weighted_mean", "std", "p05", "p50", "p95")
                },
                "min": lo_v,
                "max": hi_v,
                "range": None if lo_v is None or hi_v is None else hi_v - lo_v,
                "nonfinite": least["nonfinite"],
                "nonfinite_total": sum(r["nonfinite"] for r in rows),
            }
        )

    last_of: dict[int, int] = {}
    for p in points:
        last_of[p.rank] = max(last_of.get(p.rank, -1), p.step)
    missing = []
    for r in range(stats[steps[-1]]["expected"]):  # the world size reported at the last step
        seen = last_of.get(r)
        if seen == steps[-1]:
            continue
        after = steps[0] if seen is None else min(s for s in steps if s > seen)
        earlier = [p.step for p in latest.values() if p.rank == r and p.step < lo]
        if seen is None and step_min is not None and earlier:
            seen = max(earlier)  # a zoom: a rank gone before the range is last seen there
        missing.append({"rank": r, "last_seen_step": seen, "first_missing_step": after})

    heat_size = _bucket_size(steps[0], steps[-1], len(steps), heatmap_steps)
    heat_groups = _groups(steps, heat_size)
    ranks = sorted({p.rank for p in points})
    values = []
    heat_marks = []
    for i, r in enumerate(ranks):
        row = []
        for j, group in enumerate(heat_groups):
            mine = [latest[(s, r)] for s in group if (s, r) in latest and s in by_step]
            row.append(_mean_or_none([p.value for p in mine if math.isfinite(p.value)]))
            if any(not math.isfinite(p.value) for p in mine):
                heat_marks.append([i, j])
        values.append(row)

    every_outlier = [k for k in scores if is_outlier(k)]
    outliers = sorted(
        every_outlier, key=lambda k: (-abs(scores[k][2]), -abs(scores[k][1]), k[0], k[1])
    )[:outlier_limit]
    rollup = []
    for r in ranks:
        reports = [(s, r) for s in steps if (s, r) in latest and s in by_step]
        keys = [k for k in reports if k in scores]
        local = [latest[k].local_rank for k in reports if latest[k].local_rank is not None]
        rollup.append(
            {
                "rank": r,
                "local_rank": local[-1] if local else None,
                "steps_reported": len(keys),
                "last_step": reports[-1][0],
                "mean_delta": float(np.mean([scores[k][0] for k in keys])) if keys else 0.0,
                "mean_abs_z": float(np.mean([abs(scores[k][1]) for k in keys])) if keys else 0.0,
                "outlier_steps": sum(is_outlier(k) for k in keys),
                "nonfinite_steps": len(reports) - len(keys),
                "first_nonfinite_step": next(
                    (s for s, _ in reports if not math.isfinite(latest[(s, r)].value)), None
                ),
            }
        )
    marks = sorted((p.step, p.rank) for p in points if not math.isfinite(p.value))
    reported = {s: stats[s]["count"] + stats[s]["nonfinite"] for s in steps}
    return {
        "world_size": world_size,
        "step_range": [steps[0], steps[-1]],
        "bucket_size": size,
        "steps": step_rows,
        "coverage": {
            "full_steps": sum(reported[s] == stats[s]["expected"] for s in steps),
            "partial_steps": sum(reported[s] < stats[s]["expected"] for s in steps),
            "missing": missing,
        },
        "heatmap": {
            "ranks": ranks,
            "bucket_size": heat_size,
            "buckets": [[g[0], g[-1]] for g in heat_groups],
            "values": values,
            "nonfinite": heat_marks,
        },
        "outliers": [
            {
                "step": s,
                "rank": r,
                "local_rank": latest[(s, r)].local_rank,
                "value": latest[(s, r)].value,
                "mean": stats[s]["mean"],
                "delta": scores[(s, r)][0],
                "z": scores[(s, r)][1],
                "robust_z": scores[(s, r)][2],
            }
            for s, r in outliers
        ],
        "outliers_total": len(every_outlier),
        "ranks": rollup,
        "first_nonfinite": None
        if not marks
        else {
            "step": marks[0][0],
            "rank": marks[0][1],
            "value": _mark(latest[marks[0]].value),
        },
        # Not part of the answer: every row's scores, for tests that must know borderline rows.
        "all_scores": [
            {"step": s, "rank": r, "z": sc[1], "robust_z": sc[2]} for (s, r), sc in scores.items()
        ],
    }
