"""The rows a Distributed summary is assembled from, read from DuckDB in one snapshot.

A summary over 5M points reads the step rows of ``step_stats`` and scans three narrow
columns of ``rank_points`` (the scores kept at ingest) instead of sorting every step's
values again. The answer itself is assembled by :mod:`instantml.summary.assemble`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import duckdb
import numpy as np

from ...rankmath import covers as block_math
from ...rankmath.params import ROBUST_Z_THRESHOLD, bucket_size
from ...rankmath.rows import SummaryRows
from . import block_tables

if TYPE_CHECKING:
    from ...rankmath.params import SummaryParams


def go_on() -> None:
    pass


def rows(
    cur: duckdb.DuckDBPyConnection,
    series_id: int,
    params: SummaryParams,
    pause: Callable[[], None] = go_on,
) -> SummaryRows:
    """``pause`` is called before each of the larger reads (the server's: wait for the
    writes in flight, so that a read shares the cores with as few of them as it can)."""
    lo = params.step_min if params.step_min is not None else 0
    hi = params.step_max if params.step_max is not None else 2**63 - 1
    where = {"sid": series_id, "lo": lo, "hi": hi}
    scores = {**where, "z": params.z, "rz": ROBUST_Z_THRESHOLD}
    pause()
    cur.execute("BEGIN TRANSACTION")
    try:
        (world_size,) = cur.execute(
            "SELECT coalesce(max(expected), 0) FROM step_stats WHERE series_id = $sid",
            {"sid": series_id},
        ).fetchall()[0]
        stats = _in_step_order(
            cur.execute(
                "SELECT step, n, expected, mean, weighted_mean, min, max, std, p05, p50, p95,"
                " nonfinite FROM step_stats WHERE series_id = $sid AND step BETWEEN $lo AND $hi",
                where,
            ).fetchnumpy()
        )
        found = SummaryRows(int(world_size), stats)
        steps = stats["step"]
        if len(steps) == 0:
            cur.execute("COMMIT")
            return found
        first = int(steps[0])
        found.heat_size = bucket_size(first, int(steps[-1]), len(steps), params.heatmap_steps)
        if params.z == block_math.DEFAULT_Z:
            _from_blocks(cur, found, series_id, first, pause)
        else:  # the blocks keep outlier counts for the default z only: scan the points
            pause()
            _scanned(cur, found, where, scores, first)
        pause()
        found.outliers = cur.execute(
            f"WITH o AS (SELECT step, rank, local_rank, value, delta, z, robust_z"
            f" FROM {'outlier_rows' if params.z == block_math.DEFAULT_Z else 'rank_points'}"
            " WHERE series_id = $sid AND step BETWEEN $lo AND $hi"
            " AND (abs(z) >= $z OR abs(robust_z) >= $rz)"
            " ORDER BY abs(robust_z) DESC, abs(z) DESC, step, rank LIMIT $limit)"
            " SELECT o.step, o.rank, o.local_rank, o.value, s.mean, o.delta, o.z, o.robust_z"
            " FROM o JOIN step_stats s ON s.series_id = $sid AND s.step = o.step"
            " ORDER BY abs(o.robust_z) DESC, abs(o.z) DESC, o.step, o.rank",
            {**scores, "limit": params.outlier_limit},
        ).fetchall()
        if stats["nonfinite"].any():
            found.nonfinite_firsts = first_nonfinite(cur, series_id, lo, hi)
        cur.execute("COMMIT")
    except BaseException:
        cur.execute("ROLLBACK")
        raise
    return found


def _in_step_order(stats: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The step rows by step. Read without ORDER BY: they come in the order they were
    written, which is almost always by step, and checking that costs far less than
    DuckDB's sort of every column (9 of 23 ms for 110,000 steps); a run whose steps were
    rewritten out of order is sorted here."""
    steps = stats["step"]
    if len(steps) < 2 or bool((steps[1:] > steps[:-1]).all()):
        return stats
    order = np.argsort(steps, kind="stable")
    return {name: column[order] for name, column in stats.items()}


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
    pause: Callable[[], None],
) -> None:
    """Heatmap cells and the rollup as sums of block rows. Each heatmap bucket is covered
    by a few aligned blocks per level plus at most a few single steps at its edges; the
    rollup, by the same cover of the whole range. The rows read grow with the buckets, the
    ranks and the levels, not with the points.

    The level-1 blocks still stale in this snapshot (written since the last rebuild) are
    read as points, so the answer holds every committed point without waiting for the
    writer to rebuild them."""
    steps = found.stats["step"]
    stale = cur.execute(
        "SELECT DISTINCT start FROM stale_blocks WHERE series_id = $sid ORDER BY start",
        {"sid": series_id},
    ).fetchnumpy()["start"]
    pieces = block_math.buckets(steps, first, found.heat_size, stale)
    points = int(found.stats["n"].sum() + found.stats["nonfinite"].sum())
    cover = (len(pieces.starts) + len(pieces.steps)) * max(found.world_size, 1)
    pause()
    if points <= SCAN_RATIO * cover:
        # A short range (a zoom) whose buckets are a few steps wide: most of the cover would
        # be single steps, so one contiguous read of its points costs less.
        found.cells = _cells_scanned(cur, series_id, steps, first, found.heat_size)
    else:
        found.cells = _cells_from_blocks(cur, series_id, pieces, found, pause)
    pause()
    found.rollup = _read_rollup(cur, series_id, block_math.whole(steps, stale))


SCAN_RATIO = 2  # read a range's points for its cells when they are at most 2x the cover's rows


def _cells_from_blocks(
    cur: duckdb.DuckDBPyConnection,
    series_id: int,
    pieces: block_math.Pieces,
    found: SummaryRows,
    pause: Callable[[], None],
) -> dict[str, np.ndarray]:
    """The cells summed per (bucket, rank) in DuckDB, from the block rows and the single
    steps' points apart: ~1M rows of a long range's cover come back as one row per cell.
    (Summed in numpy instead, the reader held the GIL for each of them: under sustained
    writes, with the writer and the health monitor wanting it too, that part took several
    times its idle cost.)"""
    # Marks are read only where the range has some (most runs have none).
    marked = bool(found.stats["nonfinite"].any())
    blocked = pieces.blocks()
    covered = block_tables.covering(
        blocked["level"], f"r.rank, r.n, r.total{', r.marks' if marked else ''}"
    )
    if covered is None:
        cells = _no_cell_rows()
    else:
        cur.register("pieces", blocked)
        try:
            cells = cur.execute(
                "SELECT b, rank, sum(n)::BIGINT AS n, sum(total) AS total"
                f"{', sum(marks)::BIGINT AS marks' if marked else ''} FROM ({covered})"
                " GROUP BY b, rank",
                {"sid": series_id},
            ).fetchnumpy()
        finally:
            cur.unregister("pieces")
    if "marks" not in cells:
        cells["marks"] = np.zeros(len(cells["rank"]), dtype=np.int64)
    pause()
    points = _singles(cur, series_id, pieces.singles())
    return block_math.cells(
        {
            name: np.concatenate([np.asarray(cells[name]), points[name]])
            for name in ("rank", "n", "total", "marks")
        },
        np.concatenate([np.asarray(cells["b"]), points["b"]]),
    )


def _cells_scanned(
    cur: duckdb.DuckDBPyConnection, series_id: int, steps: np.ndarray, first: int, size: int
) -> dict[str, np.ndarray]:
    """The cells from every point of the range: three narrow columns, one contiguous read."""
    found = cur.execute(
        "SELECT step, rank, value FROM rank_points WHERE series_id = $sid"
        " AND step BETWEEN $lo AND $hi",
        {"sid": series_id, "lo": int(steps[0]), "hi": int(steps[-1])},
    ).fetchnumpy()
    rows = _cell_rows(found["rank"], found["value"])
    return block_math.cells(rows, (np.asarray(found["step"]) - first) // size)


def _cell_rows(rank: np.ndarray, value: np.ndarray) -> dict[str, np.ndarray]:
    """Points as cell rows (``rank, n, total, marks``)."""
    value = np.asarray(value, dtype=np.float64)
    finite = np.isfinite(value)
    return {
        "rank": np.asarray(rank, dtype=np.int64),
        "n": finite.astype(np.int64),
        "total": np.where(finite, value, 0.0),
        "marks": (~finite).astype(np.int64),
    }


def _no_cell_rows() -> dict[str, np.ndarray]:
    """No cell rows (``b, rank, n, total, marks``)."""
    empty = np.empty(0, dtype=np.int64)
    return {"b": empty, "rank": empty, "n": empty, "total": np.empty(0), "marks": empty}


def _singles(
    cur: duckdb.DuckDBPyConnection, series_id: int, singles: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """The points of these single steps summed per (bucket, rank) as cell rows (``b,
    rank, n, total, marks``). Read within the steps' span (zone maps skip the rest)."""
    listed = singles["step"]
    if not len(listed):
        return _no_cell_rows()
    cur.register("singles", singles)
    try:
        found = cur.execute(
            "SELECT e.b, r.rank, count(*) FILTER (WHERE isfinite(r.value)) AS n,"
            " coalesce(sum(r.value) FILTER (WHERE isfinite(r.value)), 0) AS total,"
            " count(*) FILTER (WHERE NOT isfinite(r.value)) AS marks"
            " FROM rank_points r JOIN singles e ON e.step = r.step"
            " WHERE r.series_id = $sid AND r.step BETWEEN $lo AND $hi"
            " AND r.step IN (SELECT step FROM singles) GROUP BY e.b, r.rank",
            {"sid": series_id, "lo": int(listed.min()), "hi": int(listed.max())},
        ).fetchnumpy()
    finally:
        cur.unregister("singles")
    return {name: np.asarray(column) for name, column in found.items()}


def _read(
    cur: duckdb.DuckDBPyConnection,
    series_id: int,
    pieces: block_math.Pieces,
    columns: str,
    of_point: str,
    then: str = "",
) -> dict[str, np.ndarray]:
    """The block rows and the points of these pieces (``columns`` of the block tables, a point
    projected by ``of_point``), each with its bucket ``b``; ``then`` wraps the union (an
    aggregate over ``u``)."""
    blocked = pieces.blocks()
    covered = block_tables.covering(
        blocked["level"], ", ".join("r." + c.strip() for c in columns.split(","))
    )
    cur.register("pieces", blocked)
    cur.register("singles", pieces.singles())
    try:
        union = (
            f"{covered + ' UNION ALL ' if covered else ''}SELECT e.b, {of_point}"
            " FROM rank_points JOIN singles e USING (step)"
            " WHERE series_id = $sid AND step IN (SELECT step FROM singles)"
        )
        sql = then.format(union=union) if then else union
        return dict(cur.execute(sql, {"sid": series_id}).fetchnumpy())
    finally:
        cur.unregister("pieces")
        cur.unregister("singles")


def _read_rollup(
    cur: duckdb.DuckDBPyConnection, series_id: int, whole: block_math.Pieces
) -> list[tuple[object, ...]]:
    """Per rank over the whole range (its cover: a few blocks per level)."""
    rows = _read(
        cur, series_id, whole,
        "rank, n, marks, total, last_step, sum_delta, sum_abs_z, outliers, lr_step, local_rank",
        block_tables.POINT_AS_BLOCK,
        then=(
            "SELECT rank, sum(n)::BIGINT AS n, max(last_step) AS last_step,"
            " sum(sum_delta) AS sum_delta, sum(sum_abs_z) AS sum_abs_z,"
            " sum(outliers)::BIGINT AS outliers,"
            " arg_max(local_rank, lr_step) FILTER (WHERE lr_step >= 0) AS local_rank,"
            " sum(marks)::BIGINT AS marks FROM ({union}) u GROUP BY rank ORDER BY rank"
        ),
    )  # fmt: skip
    local = _floats(rows["local_rank"])
    out: list[tuple[object, ...]] = []
    for i, rank in enumerate(np.asarray(rows["rank"]).tolist()):
        count = int(rows["n"][i])
        out.append((
            rank, count, int(rows["last_step"][i]),
            float(rows["sum_delta"][i]) / count if count else None,
            float(rows["sum_abs_z"][i]) / count if count else None,
            int(rows["outliers"][i]), None if local[i] != local[i] else int(local[i]),
            int(rows["marks"][i]),
        ))  # fmt: skip
    return out


def _floats(column: np.ndarray) -> np.ndarray:
    """A column that may hold NULLs (a masked array from fetchnumpy) as floats, NaN for
    NULL."""
    return np.ma.filled(np.ma.asarray(column).astype(np.float64), np.nan)


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
