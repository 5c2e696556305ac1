"""The rows a Distributed summary is assembled from, read from DuckDB in one snapshot.

A summary over 5M points reads the step rows of ``step_stats`` and scans three narrow
columns of ``rank_points`` (the scores kept at ingest) instead of sorting every step's
values again. The answer itself is assembled by :mod:`instantml.summary.assemble`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import duckdb

from ...summary import bucket_size
from ...summary.params import ROBUST_Z_THRESHOLD
from ..records import SummaryRows

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
        found.outliers = cur.execute(
            "WITH o AS (SELECT step, rank, local_rank, value, delta, z, robust_z FROM rank_points"
            " WHERE series_id = $sid AND step BETWEEN $lo AND $hi"
            " AND (abs(z) >= $z OR abs(robust_z) >= $rz)"
            " ORDER BY abs(robust_z) DESC, abs(z) DESC, step, rank LIMIT $limit)"
            " SELECT o.step, o.rank, o.local_rank, o.value, s.mean, o.delta, o.z, o.robust_z"
            " FROM o JOIN step_stats s ON s.series_id = $sid AND s.step = o.step"
            " ORDER BY abs(o.robust_z) DESC, abs(o.z) DESC, o.step, o.rank",
            {**scores, "limit": params.outlier_limit},
        ).fetchall()
        first = int(steps[0])
        found.heat_size = bucket_size(first, int(steps[-1]), len(steps), params.heatmap_steps)
        found.cells = cur.execute(
            "SELECT rank, (step - $first) // $size AS b,"
            " coalesce(avg(value) FILTER (WHERE isfinite(value)), 'nan') AS v,"
            " count(*) FILTER (WHERE NOT isfinite(value)) AS marks FROM rank_points"
            " WHERE series_id = $sid AND step BETWEEN $lo AND $hi GROUP BY rank, b",
            {**where, "first": first, "size": found.heat_size},
        ).fetchnumpy()
        if stats["nonfinite"].any():
            step, rank, value = cur.execute(
                "SELECT step, rank, value FROM rank_points WHERE series_id = $sid"
                " AND step BETWEEN $lo AND $hi AND NOT isfinite(value)"
                " ORDER BY step, rank LIMIT 1",
                where,
            ).fetchall()[0]
            found.first_nonfinite = (int(step), int(rank), float(value))
        cur.execute("COMMIT")
    except BaseException:
        cur.execute("ROLLBACK")
        raise
    return found


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
