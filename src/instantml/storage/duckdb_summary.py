"""The Distributed summary in DuckDB SQL, answered from aggregates kept at ingest.

Every rank point written marks its (series, step) stale, in the same transaction. The
writer thread then recomputes the stale steps' reducers into ``step_stats`` and each
point's ``delta``, ``z`` and ``robust_z`` (when idle, and always before a summary is read),
so a summary over 5M points reads 10k step rows and scans three narrow columns instead of
sorting every step's values again. Definitions: DESIGN.md, "The Distributed summary".
"""

from __future__ import annotations

from typing import Any

import duckdb
import numpy as np

from ..summary import SummaryParams, bucket_size
from ..summary.coverage import missing_ranks
from ..summary.params import ROBUST_Z_THRESHOLD
from ..validation import mark_of

SCHEMA = """
CREATE TABLE IF NOT EXISTS step_stats (
    series_id INTEGER NOT NULL, step BIGINT NOT NULL, n INTEGER NOT NULL,
    expected INTEGER NOT NULL, mean DOUBLE NOT NULL, weighted_mean DOUBLE NOT NULL,
    min DOUBLE NOT NULL, max DOUBLE NOT NULL, std DOUBLE NOT NULL, p05 DOUBLE NOT NULL,
    p50 DOUBLE NOT NULL, p95 DOUBLE NOT NULL, mad DOUBLE NOT NULL, mean_ad DOUBLE NOT NULL,
    PRIMARY KEY (series_id, step));
CREATE TABLE IF NOT EXISTS stale_steps (series_id INTEGER NOT NULL, step BIGINT NOT NULL);
ALTER TABLE rank_points ADD COLUMN IF NOT EXISTS delta DOUBLE;
ALTER TABLE rank_points ADD COLUMN IF NOT EXISTS z DOUBLE;
ALTER TABLE rank_points ADD COLUMN IF NOT EXISTS robust_z DOUBLE;
-- Ranks whose value at the step is NaN or +-inf: reporting, but not in any reducer (whose
-- columns hold NaN when the step has no finite value at all).
ALTER TABLE step_stats ADD COLUMN IF NOT EXISTS nonfinite INTEGER DEFAULT 0;
-- A store written before aggregates existed: every step of it is stale.
INSERT INTO stale_steps SELECT DISTINCT series_id, step FROM rank_points
WHERE NOT EXISTS (SELECT 1 FROM step_stats) AND NOT EXISTS (SELECT 1 FROM stale_steps)
    AND NOT EXISTS (SELECT 1 FROM rank_points WHERE z IS NOT NULL);
"""

STATS_COLUMNS = (
    "step",
    "n",
    "expected",
    "mean",
    "weighted_mean",
    "min",
    "max",
    "std",
    "p05",
    "p50",
    "p95",
    "mad",
    "mean_ad",
)

# A step whose values are all equal has std, MAD and mean absolute deviation exactly 0 and
# its mean exactly that value; floating-point sums would leave an ulp of noise instead.
# std is the definition's two-pass sqrt(sum((v - mean)^2) / n), over the mean above.
# Non-finite values (marks) count towards `expected` and `nonfinite` only; a step with no
# finite value keeps NaN in its reducers.
_STATS = """
INSERT INTO step_stats (series_id, step, n, expected, mean, weighted_mean, min, max, std,
    p05, p50, p95, mad, mean_ad, nonfinite)
WITH a AS (
    SELECT step, value AS v, weight AS w, world_size AS ws FROM rank_points
    WHERE series_id = $sid AND step BETWEEN $lo AND $hi
        AND step IN (SELECT step FROM refresh_steps)),
e AS (
    SELECT step, max(ws) AS expected, count(*) FILTER (WHERE NOT isfinite(v)) AS nonfinite
    FROM a GROUP BY step),
p AS (SELECT * FROM a WHERE isfinite(v)),
s AS (
    SELECT step, count(*) AS n, min(v) AS lo, max(v) AS hi,
        CASE WHEN min(v) = max(v) THEN min(v) ELSE avg(v) END AS mean,
        CASE WHEN min(v) = max(v) THEN min(v) ELSE sum(w * v) / sum(w) END AS wmean,
        quantile_cont(v, 0.05) AS p05, quantile_cont(v, 0.5) AS p50,
        quantile_cont(v, 0.95) AS p95
    FROM p GROUP BY step),
m AS (
    SELECT p.step, sqrt(avg((p.v - s.mean) ** 2)) AS std,
        quantile_cont(abs(p.v - s.p50), 0.5) AS mad, avg(abs(p.v - s.p50)) AS mean_ad
    FROM p JOIN s USING (step) GROUP BY p.step)
SELECT $sid, e.step, coalesce(n, 0), expected,
    coalesce(mean, 'nan'), coalesce(wmean, 'nan'), coalesce(lo, 'nan'), coalesce(hi, 'nan'),
    coalesce(std, 'nan'), coalesce(p05, 'nan'), coalesce(p50, 'nan'), coalesce(p95, 'nan'),
    coalesce(mad, 'nan'), coalesce(mean_ad, 'nan'), nonfinite
FROM e LEFT JOIN s USING (step) LEFT JOIN m USING (step)
"""

_POINT_SCORES = """
UPDATE rank_points SET
    delta = rank_points.value - s.mean,
    z = CASE WHEN s.std > 0 THEN (rank_points.value - s.mean) / s.std ELSE 0.0 END,
    robust_z = CASE
        WHEN s.mad > 0 THEN 0.6745 * (rank_points.value - s.p50) / s.mad
        WHEN s.mean_ad > 0 THEN 0.7979 * (rank_points.value - s.p50) / s.mean_ad
        ELSE 0.0 END
FROM step_stats s
WHERE rank_points.series_id = $sid AND s.series_id = $sid AND rank_points.step = s.step
    AND isfinite(rank_points.value)
    AND rank_points.step BETWEEN $lo AND $hi AND s.step BETWEEN $lo AND $hi
    AND s.step IN (SELECT step FROM refresh_steps)
"""


def refresh(con: duckdb.DuckDBPyConnection, series_id: int, steps: list[int]) -> None:
    """Recompute the reducers and point scores of ``steps`` of one series (in the caller's
    transaction), and clear their stale marks."""
    con.execute("CREATE TEMP TABLE IF NOT EXISTS refresh_steps (step BIGINT)")
    con.execute("DELETE FROM refresh_steps")
    con.register("refresh_frame", {"step": np.array(steps, dtype=np.int64)})
    try:
        con.execute("INSERT INTO refresh_steps SELECT step FROM refresh_frame")
    finally:
        con.unregister("refresh_frame")
    # The range lets zone maps skip every row group outside the stale steps: without it each
    # refresh would scan all of the key's points.
    sid = {"sid": series_id, "lo": min(steps), "hi": max(steps)}
    con.execute(
        "DELETE FROM step_stats WHERE series_id = $sid AND step BETWEEN $lo AND $hi"
        " AND step IN (SELECT step FROM refresh_steps)",
        sid,
    )
    con.execute(_STATS, sid)
    con.execute(_POINT_SCORES, sid)
    con.execute(
        "DELETE FROM stale_steps WHERE series_id = $sid AND step BETWEEN $lo AND $hi"
        " AND step IN (SELECT step FROM refresh_steps)",
        sid,
    )


# The reducers a summary answers with (mad and mean_ad only serve the robust score).
_STEP_COLUMNS = tuple(c for c in STATS_COLUMNS if c not in ("mad", "mean_ad"))
_MEANED = ("mean", "weighted_mean", "std", "p05", "p50", "p95")


def _floats(values: np.ndarray) -> list[float | None]:
    return [None if v != v else float(v) for v in values.tolist()]


def _steps(stats: dict[str, np.ndarray], first: int, size: int) -> list[dict[str, Any]]:
    """Step rows, bucketed when ``size`` > 1. A step with no finite value (only marks) has
    NaN reducers: a bucket's means skip it, its min and max ignore it (fmin/fmax)."""
    step = stats["step"]
    if size == 1:
        columns = {name: stats[name] for name in (*_STEP_COLUMNS, "nonfinite")}
        columns["step_end"] = step
        columns["count"] = columns.pop("n")
    else:
        keys = (step - first) // size
        starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
        has_value = stats["n"] > 0
        valued = np.add.reduceat(has_value, starts)
        columns = {
            "step": step[starts],
            "step_end": step[np.r_[starts[1:], len(step)] - 1],
            "count": np.minimum.reduceat(stats["n"], starts),
            "expected": np.maximum.reduceat(stats["expected"], starts),
            "nonfinite": np.add.reduceat(stats["nonfinite"], starts),
            "min": np.fmin.reduceat(stats["min"], starts),
            "max": np.fmax.reduceat(stats["max"], starts),
        }
        with np.errstate(invalid="ignore", divide="ignore"):
            for name in _MEANED:
                total = np.add.reduceat(np.where(has_value, stats[name], 0.0), starts)
                columns[name] = np.where(valued > 0, total / np.maximum(valued, 1), np.nan)
    columns["range"] = columns["max"] - columns["min"]
    ints = {name: columns[name].tolist() for name in _INT_FIELDS}
    floats = {name: _floats(columns[name]) for name in _FLOAT_FIELDS}
    return [
        {
            **{name: ints[name][i] for name in _INT_FIELDS[:4]},
            **{name: floats[name][i] for name in _FLOAT_FIELDS},
            "nonfinite": ints["nonfinite"][i],
        }
        for i in range(len(ints["step"]))
    ]


_INT_FIELDS = ("step", "step_end", "count", "expected", "nonfinite")
_FLOAT_FIELDS = (
    "mean", "weighted_mean", "min", "max", "range", "std", "p05", "p50", "p95"
)  # fmt: skip


def summary(
    cur: duckdb.DuckDBPyConnection, series_id: int, params: SummaryParams
) -> dict[str, Any]:
    """Everything but ``run_id``, ``key`` and ``keys``, read in one snapshot."""
    lo = params.step_min if params.step_min is not None else 0
    hi = params.step_max if params.step_max is not None else 2**63 - 1
    where = {"sid": series_id, "lo": lo, "hi": hi}
    cur.execute("BEGIN TRANSACTION")
    try:
        (world_size,) = cur.execute(
            "SELECT coalesce(max(expected), 0) FROM step_stats WHERE series_id = $sid",
            {"sid": series_id},
        ).fetchall()[0]
        stats = cur.execute(
            "SELECT step, n, expected, mean, weighted_mean, min, max, std, p05, p50, p95,"
            " nonfinite FROM step_stats WHERE series_id = $sid AND step BETWEEN $lo AND $hi"
            " ORDER BY step",
            where,
        ).fetchnumpy()
        steps = stats["step"]
        if len(steps) == 0:
            cur.execute("COMMIT")
            return _empty(world_size)
        first, last = int(steps[0]), int(steps[-1])
        # A rank's last_step and local_rank count its marks (it reported); its
        # steps_reported, deltas and scores count only finite values.
        rollup = cur.execute(
            "SELECT rank, count(*) FILTER (WHERE isfinite(value)) AS steps_reported,"
            " max(step) AS last_step, avg(delta) AS mean_delta, avg(abs(z)) AS mean_abs_z,"
            " count(*) FILTER (WHERE abs(z) >= $z OR abs(robust_z) >= $rz) AS outlier_steps,"
            " arg_max(local_rank, step) FILTER (WHERE local_rank IS NOT NULL) AS local_rank,"
            " count(*) FILTER (WHERE NOT isfinite(value)) AS nonfinite_steps"
            " FROM rank_points WHERE series_id = $sid AND step BETWEEN $lo AND $hi"
            " GROUP BY rank ORDER BY rank",
            {**where, "z": params.z, "rz": ROBUST_Z_THRESHOLD},
        ).fetchall()
        outliers = cur.execute(
            "WITH o AS (SELECT step, rank, local_rank, value, delta, z, robust_z FROM rank_points"
            " WHERE series_id = $sid AND step BETWEEN $lo AND $hi"
            " AND (abs(z) >= $z OR abs(robust_z) >= $rz)"
            " ORDER BY abs(robust_z) DESC, abs(z) DESC, step, rank LIMIT $limit)"
            " SELECT o.step, o.rank, o.local_rank, o.value, s.mean, o.delta, o.z, o.robust_z"
            " FROM o JOIN step_stats s ON s.series_id = $sid AND s.step = o.step"
            " ORDER BY abs(o.robust_z) DESC, abs(o.z) DESC, o.step, o.rank",
            {**where, "z": params.z, "rz": ROBUST_Z_THRESHOLD, "limit": params.outlier_limit},
        ).fetchall()
        heat_size = bucket_size(first, last, len(steps), params.heatmap_steps)
        cells = cur.execute(
            "SELECT rank, (step - $first) // $size AS b,"
            " coalesce(avg(value) FILTER (WHERE isfinite(value)), 'nan') AS v,"
            " count(*) FILTER (WHERE NOT isfinite(value)) AS marks FROM rank_points"
            " WHERE series_id = $sid AND step BETWEEN $lo AND $hi GROUP BY rank, b",
            {**where, "first": first, "size": heat_size},
        ).fetchnumpy()
        first_nonfinite = None
        if stats["nonfinite"].any():
            first_nonfinite = cur.execute(
                "SELECT step, rank, value FROM rank_points WHERE series_id = $sid"
                " AND step BETWEEN $lo AND $hi AND NOT isfinite(value)"
                " ORDER BY step, rank LIMIT 1",
                where,
            ).fetchall()[0]
        cur.execute("COMMIT")
    except BaseException:
        cur.execute("ROLLBACK")
        raise
    size = bucket_size(first, last, len(steps), params.max_points)
    reported = stats["n"] + stats["nonfinite"]  # a mark is a report (coverage)
    expected = stats["expected"]
    last_step_of_rank = {int(r[0]): int(r[2]) for r in rollup}
    ranks = _rollup(rollup)
    return {
        "world_size": int(world_size),
        "step_range": [first, last],
        "bucket_size": size,
        "steps": _steps(stats, first, size),
        "coverage": {
            "full_steps": int((reported == expected).sum()),
            "partial_steps": int((reported < expected).sum()),
            # Against the world size reported at the last step, not the key's largest: a
            # stray call with a larger world_size, or an elastic job that shrank, lists no
            # phantom ranks.
            "missing": missing_ranks(int(expected[-1]), steps.tolist(), last_step_of_rank),
        },
        "heatmap": _heatmap(steps, first, heat_size, cells),
        "outliers": [
            {
                "step": step,
                "rank": rank,
                "local_rank": local_rank,
                "value": value,
                "mean": mean,
                "delta": delta,
                "z": z,
                "robust_z": robust_z,
            }
            for step, rank, local_rank, value, mean, delta, z, robust_z in outliers
        ],
        # Every outlier row of the range: the rollup counts them per rank by the same test.
        "outliers_total": sum(r["outlier_steps"] for r in ranks),
        "ranks": ranks,
        "first_nonfinite": None
        if first_nonfinite is None
        else {
            "step": int(first_nonfinite[0]),
            "rank": int(first_nonfinite[1]),
            "value": mark_of(first_nonfinite[2]),
        },
    }


def _rollup(rows: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """Per rank, noisiest first: by mean |z|, then |mean delta|, then rank number."""
    ranked = sorted(rows, key=lambda r: (-(r[4] or 0.0), -abs(r[3] or 0.0), r[0]))
    return [
        {
            "rank": rank,
            "local_rank": local_rank,
            "steps_reported": reported,
            "last_step": last,
            "mean_delta": mean_delta or 0.0,
            "mean_abs_z": mean_abs_z or 0.0,
            "outlier_steps": outlier_steps,
            "nonfinite_steps": nonfinite_steps,
        }
        for (
            rank,
            reported,
            last,
            mean_delta,
            mean_abs_z,
            outlier_steps,
            local_rank,
            nonfinite_steps,
        ) in ranked
    ]


def _heatmap(
    steps: np.ndarray, first: int, size: int, cells: dict[str, np.ndarray]
) -> dict[str, Any]:
    """``values[i][j]``: rank ``ranks[i]``'s mean finite value in bucket j (None if none);
    ``nonfinite``: the ``[i, j]`` cells where that rank sent a NaN or +-inf."""
    keys = (steps - first) // size
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    ends = np.r_[starts[1:], len(steps)] - 1
    bucket_keys = keys[starts]
    ranks = np.unique(cells["rank"])
    rows = np.searchsorted(ranks, cells["rank"])
    cols = np.searchsorted(bucket_keys, cells["b"])
    grid = np.full((len(ranks), len(bucket_keys)), np.nan)
    grid[rows, cols] = cells["v"]
    marked = np.flatnonzero(cells["marks"] > 0)
    return {
        "ranks": ranks.tolist(),
        "buckets": np.column_stack([steps[starts], steps[ends]]).tolist(),
        "values": [_floats(row) for row in grid],
        "nonfinite": sorted(zip(rows[marked].tolist(), cols[marked].tolist())),
    }


def _empty(world_size: int) -> dict[str, Any]:
    return {
        "world_size": int(world_size),
        "step_range": None,
        "bucket_size": 1,
        "steps": [],
        "coverage": {"full_steps": 0, "partial_steps": 0, "missing": []},
        "heatmap": {"ranks": [], "buckets": [], "values": [], "nonfinite": []},
        "outliers": [],
        "outliers_total": 0,
        "ranks": [],
        "first_nonfinite": None,
    }
