"""The rows a Distributed summary is assembled from, read from DuckDB in one snapshot.

A summary over 5M points reads the step rows of ``step_stats`` and scans three narrow
columns of ``rank_points`` (the scores kept at ingest) instead of sorting every step's
values again. The answer itself is assembled by :mod:`instantml.summary.assemble`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import duckdb
import numpy as np

from ...summary import bucket_size
from ...summary.params import ROBUST_Z_THRESHOLD
from ..records import SummaryRows
from . import blocks

if TYPE_CHECKING:
    from ...summary import SummaryParams


def rows(cur: duckdb.DuckDBPyConnection, series_id: int, params: SummaryParams) -> SummaryRows:
    lo = params.step_min if params.step_min is not None else 0
    hi = params.step_max if params.step_max is not None else 2**63 - 1
    where = {"sid": series_id, "lo": lo, "hi": hi}
    scores = {**where, "z": params.z, "rz": ROBUST_Z_THRESHOLD}
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
        found = SummaryRows(int(world_size), stats)
        steps = stats["step"]
        if len(steps) == 0:
            cur.execute("COMMIT")
            return found
        first = int(steps[0])
        found.heat_size = bucket_size(first, int(steps[-1]), len(steps), params.heatmap_steps)
        if params.z == blocks.DEFAULT_Z:
            _from_blocks(cur, found, series_id, first)
        else:  # the blocks keep outlier counts for the default z only: scan the points
            _scanned(cur, found, where, scores, first)
        found.outliers = cur.execute(
            f"WITH o AS (SELECT step, rank, local_rank, value, delta, z, robust_z"
            f" FROM {'outlier_rows' if params.z == blocks.DEFAULT_Z else 'rank_points'}"
            " WHERE series_id = $sid AND step BETWEEN $lo AND $hi"
            " AND (abs(z) >= $z OR abs(robust_z) >= $rz)"
            " ORDER BY abs(robust_z) DESC, abs(z) DESC, step, rank LIMIT $limit)"
            " SELECT o.step, o.rank, o.local_rank, o.value, s.mean, o.delta, o.z, o.robust_z"
            " FROM o JOIN step_stats s ON s.series_id = $sid AND s.step = o.step"
            " ORDER BY abs(o.robust_z) DESC, abs(o.z) DESC, o.step, o.rank",
            {**scores, "limit": params.outlier_limit},
        ).fetchall()
        marked = np.flatnonzero(stats["nonfinite"] > 0)
        if len(marked):  # the earliest step with a mark, then its lowest rank
            step, rank, value = cur.execute(
                "SELECT step, rank, value FROM rank_points WHERE series_id = $sid"
                " AND step = $step AND NOT isfinite(value) ORDER BY rank LIMIT 1",
                {"sid": series_id, "step": int(steps[marked[0]])},
            ).fetchall()[0]
            found.first_nonfinite = (int(step), int(rank), float(value))
        cur.execute("COMMIT")
    except BaseException:
        cur.execute("ROLLBACK")
        raise
    return found


def _scanned(
    cur: duckdb.DuckDBPyConnection,
    found: SummaryRows,
    where: dict[str, int],
    scores: dict[str, float],
    first: int,
) -> None:
    """Rollup and heatmap cells from every point of the range (a non-default z)."""
    # A rank's last_step and local_rank count its marks (it reported); its
    # steps_reported, deltas and scores count only finite values.
    found.rollup = cur.execute(
        "SELECT rank, count(*) FILTER (WHERE isfinite(value)) AS steps_reported,"
        " max(step) AS last_step, avg(delta) AS mean_delta, avg(abs(z)) AS mean_abs_z,"
        " count(*) FILTER (WHERE abs(z) >= $z OR abs(robust_z) >= $rz) AS outlier_steps,"
        " arg_max(local_rank, step) FILTER (WHERE local_rank IS NOT NULL) AS local_rank,"
        " count(*) FILTER (WHERE NOT isfinite(value)) AS nonfinite_steps"
        " FROM rank_points WHERE series_id = $sid AND step BETWEEN $lo AND $hi"
        " GROUP BY rank ORDER BY rank",
        scores,
    ).fetchall()
    found.cells = cur.execute(
        "SELECT rank, (step - $first) // $size AS b,"
        " coalesce(avg(value) FILTER (WHERE isfinite(value)), 'nan') AS v,"
        " count(*) FILTER (WHERE NOT isfinite(value)) AS marks FROM rank_points"
        " WHERE series_id = $sid AND step BETWEEN $lo AND $hi GROUP BY rank, b",
        {**where, "first": first, "size": found.heat_size},
    ).fetchnumpy()


def _from_blocks(
    cur: duckdb.DuckDBPyConnection,
    found: SummaryRows,
    series_id: int,
    first: int,
) -> None:
    """Heatmap cells and the rollup as sums of block rows: each heatmap bucket is covered
    by a few blocks per level plus at most a few single steps at its edges, so the rows
    read grow with the buckets and the ranks, not with the points."""
    steps = found.stats["step"]
    size = found.heat_size
    keys = (steps - first) // size
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    ends = np.r_[starts[1:], len(steps)] - 1
    levels: list[int] = []
    block_starts: list[int] = []
    block_bucket: list[int] = []
    raw: list[int] = []
    raw_bucket: list[int] = []
    for bucket, lo_i, hi_i in zip(keys[starts].tolist(), starts.tolist(), ends.tolist()):
        lo, hi = int(steps[lo_i]), int(steps[hi_i])
        present = hi_i - lo_i + 1
        if (hi - lo + 1) // blocks.BASE**blocks.LEVELS > present:  # sparse: points are fewer
            raw += steps[lo_i : hi_i + 1].tolist()
            raw_bucket += [bucket] * present
            continue
        covered, single = blocks.cover(lo, hi)
        for level, start in covered:
            levels.append(level)
            block_starts.append(start)
            block_bucket.append(bucket)
        raw += single
        raw_bucket += [bucket] * len(single)
    pieces = {
        "level": np.array(levels, dtype=np.int8),
        "start": np.array(block_starts, dtype=np.int64),
        "b": np.array(block_bucket, dtype=np.int64),
    }
    singles = {"step": np.array(raw, dtype=np.int64), "b": np.array(raw_bucket, dtype=np.int64)}
    cur.register("pieces", pieces)
    cur.register("singles", singles)
    try:
        cells = cur.execute(
            f"SELECT rank, b, {blocks.BLOCK_SUMS} FROM ("
            f" SELECT p.b, {blocks.BLOCK_COLUMNS} FROM rank_blocks r"
            " JOIN pieces p ON p.level = r.level AND p.start = r.start"
            " WHERE r.series_id = $sid AND r.start IN (SELECT start FROM pieces)"
            f" UNION ALL SELECT e.b, {blocks.POINT_AS_BLOCK} FROM rank_points"
            " JOIN singles e USING (step) WHERE series_id = $sid"
            " AND step IN (SELECT step FROM singles)"
            ") GROUP BY rank, b ORDER BY rank, b",
            {"sid": series_id},
        ).fetchnumpy()
    finally:
        cur.unregister("pieces")
        cur.unregister("singles")
    names = ("rank", "b", "n", "marks", "total", "last", "sum_delta", "sum_abs_z", "outliers",
             "lr_step", "local_rank")  # fmt: skip
    columns = dict(zip(names, cells.values(), strict=True))
    n = np.asarray(columns["n"], dtype=np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        value = np.where(n > 0, np.asarray(columns["total"], dtype=np.float64) / n, np.nan)
    found.cells = {
        "rank": np.asarray(columns["rank"]),
        "b": np.asarray(columns["b"]),
        "v": value,
        "marks": np.asarray(columns["marks"]),
    }
    found.rollup = _rollup(columns)


def _rollup(columns: dict[str, np.ndarray]) -> list[tuple[object, ...]]:
    """Per rank (cells come sorted by rank): the sums of its cells."""
    rank = np.asarray(columns["rank"], dtype=np.int64)
    if not len(rank):
        return []
    starts = np.flatnonzero(np.r_[True, rank[1:] != rank[:-1]])

    def total(name: str) -> np.ndarray:
        return np.add.reduceat(np.asarray(columns[name], dtype=np.float64), starts)

    n = np.add.reduceat(np.asarray(columns["n"], dtype=np.int64), starts)
    marks = np.add.reduceat(np.asarray(columns["marks"], dtype=np.int64), starts)
    outliers = np.add.reduceat(np.asarray(columns["outliers"], dtype=np.int64), starts)
    last = np.maximum.reduceat(np.asarray(columns["last"], dtype=np.int64), starts)
    sum_delta, sum_abs_z = total("sum_delta"), total("sum_abs_z")
    lr_step = np.ma.filled(np.ma.masked_invalid(_floats(columns["lr_step"])), -1.0)
    local = _floats(columns["local_rank"])
    out: list[tuple[object, ...]] = []
    for i, (lo, hi) in enumerate(zip(starts, np.r_[starts[1:], len(rank)], strict=True)):
        latest = lo + int(np.argmax(lr_step[lo:hi]))
        local_rank = None if lr_step[latest] < 0 else int(local[latest])
        count = int(n[i])
        out.append((
            int(rank[lo]), count, int(last[i]),
            float(sum_delta[i]) / count if count else None,
            float(sum_abs_z[i]) / count if count else None,
            int(outliers[i]), local_rank, int(marks[i]),
        ))  # fmt: skip
    return out


def _floats(column: np.ndarray) -> np.ndarray:
    """A column that may hold NULLs (a masked array from fetchnumpy) as floats, NaN for
    NULL."""
    return np.ma.filled(np.ma.asarray(column).astype(np.float64), np.nan)


def window_medians(
    cur: duckdb.DuckDBPyConnection, series_id: int, window: int
) -> tuple[tuple[int, int] | None, dict[int, tuple[float, int]]]:
    """Per rank, the median of its finite values over the series' last ``window`` steps.
    The steps come from the step rows (every step is in ``step_stats`` or stale), not
    from a scan of the points."""
    rows = cur.execute(
        "SELECT min(step), max(step) FROM (SELECT step FROM step_stats WHERE series_id = $sid"
        " UNION SELECT step FROM stale_steps WHERE series_id = $sid"
        " ORDER BY step DESC LIMIT $window)",
        {"sid": series_id, "window": window},
    ).fetchall()
    first, last = rows[0]
    if first is None:
        return None, {}
    medians = cur.execute(
        "SELECT rank, median(value), count(DISTINCT step) FROM rank_points"
        " WHERE series_id = $sid AND step BETWEEN $first AND $last AND isfinite(value)"
        " GROUP BY rank",
        {"sid": series_id, "first": first, "last": last},
    ).fetchall()
    return (int(first), int(last)), {int(r): (float(m), int(n)) for r, m, n in medians}
