"""Reads of a series' newest steps in DuckDB, for run health and live coverage: the last
N steps (from the step rows, not a scan of the points), each rank's median over them,
their points, a rank's last step, the first non-finite values."""

from __future__ import annotations

import duckdb
import numpy as np


def last_steps(
    cur: duckdb.DuckDBPyConnection,
    series_id: int,
    steps: int,
    floor: int | None = None,
    ceiling: int | None = None,
) -> tuple[int, int, int] | None:
    """The (count, first, last) of the series' last ``steps`` distinct steps (None when it
    has none), found from the step rows (every step is in ``step_stats`` or stale), not
    from a scan of the points. ``floor``: a guess of the first, so that only the steps from
    it on are read; when fewer than ``steps`` are, the guess was too high (or the series
    has fewer steps) and every step is read. Any guess gives the same answer: if ``steps``
    steps lie at or above it, the last ``steps`` all do. ``ceiling``: the last step to
    count (a zoom's)."""
    query = (
        "SELECT count(*), min(step), max(step) FROM (SELECT step FROM step_stats"
        " WHERE series_id = $sid AND step BETWEEN $floor AND $ceiling UNION SELECT step"
        " FROM stale_steps WHERE series_id = $sid AND step BETWEEN $floor AND $ceiling"
        " ORDER BY step DESC LIMIT $steps)"
    )
    lowest, highest = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    params = {
        "sid": series_id,
        "steps": steps,
        "floor": lowest if floor is None else floor,
        "ceiling": highest if ceiling is None else ceiling,
    }
    count, first, last = cur.execute(query, params).fetchall()[0]
    if count < steps and floor is not None and floor > lowest:
        count, first, last = cur.execute(query, {**params, "floor": lowest}).fetchall()[0]
    return (int(count), int(first), int(last)) if count else None


def window_medians(
    cur: duckdb.DuckDBPyConnection,
    series_id: int,
    window: int,
    floor: int | None = None,
    ceiling: int | None = None,
) -> tuple[tuple[int, int] | None, dict[int, tuple[float, int]]]:
    """Per rank, the median of its finite values over the series' last ``window`` steps
    (up to ``ceiling``; ``floor``: as in ``last_steps``)."""
    found = last_steps(cur, series_id, window, floor, ceiling)
    if found is None:
        return None, {}
    _, first, last = found
    medians = cur.execute(
        "SELECT rank, median(value), count(DISTINCT step) FROM rank_points"
        " WHERE series_id = $sid AND step BETWEEN $first AND $last AND isfinite(value)"
        " GROUP BY rank",
        {"sid": series_id, "first": first, "last": last},
    ).fetchall()
    return (first, last), {int(r): (float(m), int(n)) for r, m, n in medians}


def window_points(
    cur: duckdb.DuckDBPyConnection, series_id: int, steps: int, floor: int | None = None
) -> dict[str, np.ndarray]:
    """The points of the series' last ``steps`` steps (``floor``: as in ``last_steps``)."""
    found = last_steps(cur, series_id, steps, floor)
    first = np.iinfo(np.int64).max if found is None else found[1]
    rows = cur.execute(
        "SELECT step, rank, value, weight, world_size, ts FROM rank_points"
        " WHERE series_id = $sid AND step >= $first ORDER BY step, rank",
        {"sid": series_id, "first": first},
    ).fetchnumpy()
    return {name: np.asarray(rows[name]) for name in WINDOW_COLUMNS}


WINDOW_COLUMNS = ("step", "rank", "value", "weight", "world_size", "ts")


def next_step(cur: duckdb.DuckDBPyConnection, series_id: int, after: int | None) -> int | None:
    """The series' first step after ``after`` (its first step when None)."""
    (found,) = cur.execute(
        "SELECT min(step) FROM rank_points WHERE series_id = $sid AND step > $after",
        {"sid": series_id, "after": -1 if after is None else after},
    ).fetchone() or (None,)
    return None if found is None else int(found)


def last_steps_of(
    cur: duckdb.DuckDBPyConnection, series_id: int, ranks: list[int], before: int | None = None
) -> dict[int, int]:
    """Each of these ranks' last step in the series (before ``before``; ranks with none
    absent)."""
    rows = cur.execute(
        "SELECT rank, max(step) FROM rank_points WHERE series_id = $sid"
        " AND list_contains($ranks, rank) AND step < $before GROUP BY rank",
        {"sid": series_id, "ranks": ranks,
         "before": np.iinfo(np.int64).max if before is None else before},
    ).fetchall()  # fmt: skip
    return {int(r): int(s) for r, s in rows}


def first_nonfinite(
    cur: duckdb.DuckDBPyConnection, series_id: int, lo: int = 0, hi: int = 2**63 - 1
) -> dict[int, tuple[int, float]]:
    """Per rank with a non-finite value in the series (in steps ``lo``-``hi``): its first
    such step, and the value."""
    rows = cur.execute(
        "SELECT rank, min(step), arg_min(value, step) FROM rank_points"
        " WHERE series_id = $sid AND step BETWEEN $lo AND $hi AND NOT isfinite(value)"
        " GROUP BY rank",
        {"sid": series_id, "lo": lo, "hi": hi},
    ).fetchall()
    return {int(r): (int(s), float(v)) for r, s, v in rows}
