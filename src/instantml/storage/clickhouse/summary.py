"""The rows a Distributed summary is assembled from, read from ClickHouse (``FINAL``: the
newest version of each row). Scores of non-finite points are NaN: kept out of every mean
and never an outlier (a comparison with NaN is false)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ...rankmath import covers as block_math
from ...rankmath.params import ROBUST_Z_THRESHOLD, bucket_size
from ...rankmath.rows import SummaryRows
from . import block_tables
from .engine import ChEngine

if TYPE_CHECKING:
    from ...rankmath.params import SummaryParams

_STEP_COLUMNS = ("step", "n", "expected", "mean", "weighted_mean", "min", "max", "std", "p05",
                 "p50", "p95", "nonfinite")  # fmt: skip
_INTS = {"step": np.int64, "n": np.int64, "expected": np.int64, "nonfinite": np.int64}


def _columns(
    engine: ChEngine, sql: str, params: dict[str, Any], names: tuple[str, ...]
) -> dict[str, np.ndarray]:
    with engine.guarded() as client:
        result = client.query(sql, parameters=params).result_columns
    if not result:
        result = [[] for _ in names]
    return {
        name: np.asarray(column, dtype=_INTS.get(name, np.float64))
        for name, column in zip(names, result, strict=True)
    }


def _none(value: Any) -> Any:
    return None if isinstance(value, float) and value != value else value


def rows(engine: ChEngine, series_id: int, params: SummaryParams) -> SummaryRows:
    lo = params.step_min if params.step_min is not None else 0
    hi = params.step_max if params.step_max is not None else 2**63 - 1
    where = {"sid": series_id, "lo": lo, "hi": hi}
    points, scores, stats_table = (engine.table(t) for t in ("rank_points", "scores", "step_stats"))
    in_range = "series_id = {sid:UInt64} AND step BETWEEN {lo:Int64} AND {hi:Int64}"
    (world_size,) = engine.rows(
        f"SELECT max(expected) FROM {stats_table} FINAL WHERE series_id = {{sid:UInt64}}",
        {"sid": series_id},
    )[0]
    stats = _columns(
        engine,
        f"SELECT {', '.join(_STEP_COLUMNS)} FROM {stats_table} FINAL WHERE {in_range}"
        " ORDER BY step",
        where,
        _STEP_COLUMNS,
    )
    found = SummaryRows(int(world_size or 0), stats)
    steps = stats["step"]
    if len(steps) == 0:
        return found
    thresholds = {**where, "z": params.z, "rz": ROBUST_Z_THRESHOLD}
    first = int(steps[0])
    found.heat_size = bucket_size(first, int(steps[-1]), len(steps), params.heatmap_steps)
    if params.z == block_math.DEFAULT_Z:
        _from_blocks(engine, found, series_id, first)
        # The kept rows, each still current if the point's scores have its version (a
        # later refresh that found it no outlier wrote newer scores, and no row).
        candidates = (
            f"SELECT o.step AS step, o.rank AS rank, o.local_rank AS local_rank, o.value AS value,"
            " o.delta AS delta, o.z AS z, o.robust_z AS robust_z FROM"
            f" (SELECT * FROM {engine.table('outlier_rows')} FINAL WHERE {in_range}) AS o"
            f" INNER JOIN (SELECT step, rank, version FROM {scores} FINAL WHERE {in_range}"
            f" AND (step, rank) IN (SELECT step, rank FROM {engine.table('outlier_rows')}"
            f" WHERE {in_range})) AS s"
            " ON o.step = s.step AND o.rank = s.rank AND o.version = s.version"
        )
    else:  # the blocks keep outlier counts for the default z only: scan the points
        _scanned(engine, found, where, thresholds, first)
        candidates = (
            "SELECT p.step AS step, p.rank AS rank, p.local_rank AS local_rank,"
            " p.value AS value, o.delta AS delta, o.z AS z, o.robust_z AS robust_z FROM"
            f" (SELECT step, rank, delta, z, robust_z FROM {scores} FINAL WHERE {in_range}"
            " AND (abs(z) >= {z:Float64} OR abs(robust_z) >= {rz:Float64})) AS o"
            f" INNER JOIN (SELECT step, rank, local_rank, value FROM {points} FINAL"
            f" WHERE {in_range}) AS p ON o.step = p.step AND o.rank = p.rank"
        )
    found.outliers = [
        (int(s), int(r), None if lr < 0 else int(lr), v, mean, d, z, rz)
        for s, r, lr, v, mean, d, z, rz in engine.rows(
            "SELECT o.step, o.rank, o.local_rank, o.value, st.mean, o.delta, o.z, o.robust_z"
            f" FROM (SELECT * FROM ({candidates})"
            " ORDER BY abs(robust_z) DESC, abs(z) DESC, step, rank LIMIT {limit:UInt32}) AS o"
            f" INNER JOIN (SELECT step, mean FROM {stats_table} FINAL WHERE {in_range}) AS st"
            " ON o.step = st.step"
            " ORDER BY abs(o.robust_z) DESC, abs(o.z) DESC, o.step, o.rank",
            {**thresholds, "limit": params.outlier_limit},
        )
    ]
    if stats["nonfinite"].any():
        found.nonfinite_firsts = first_nonfinite(engine, series_id, lo, hi)
    return found


def _scanned(
    engine: ChEngine,
    found: SummaryRows,
    where: dict[str, Any],
    thresholds: dict[str, Any],
    first: int,
) -> None:
    """Rollup and heatmap cells from every point of the range (a non-default z)."""
    points, scores = engine.table("rank_points"), engine.table("scores")
    in_range = "series_id = {sid:UInt64} AND step BETWEEN {lo:Int64} AND {hi:Int64}"
    reports = engine.rows(
        "SELECT rank, countIf(isFinite(value)), max(step),"
        " argMaxIf(local_rank, step, local_rank >= 0), countIf(local_rank >= 0),"
        f" countIf(NOT isFinite(value)) FROM {points} FINAL WHERE {in_range} GROUP BY rank",
        where,
    )
    scored = {
        int(rank): (delta, abs_z, outliers)
        for rank, delta, abs_z, outliers in engine.rows(
            "SELECT rank, avgIf(delta, isFinite(delta)), avgIf(abs(z), isFinite(z)),"
            " countIf(abs(z) >= {z:Float64} OR abs(robust_z) >= {rz:Float64})"
            f" FROM {scores} FINAL WHERE {in_range} GROUP BY rank",
            thresholds,
        )
    }
    found.rollup = []
    for rank, reported, last, local, has_local, nonfinite in sorted(reports):
        delta, abs_z, outliers = scored.get(int(rank), (None, None, 0))
        found.rollup.append(
            (int(rank), int(reported), int(last), _none(delta), _none(abs_z), int(outliers),
             int(local) if has_local else None, int(nonfinite))
        )  # fmt: skip
    found.cells = _columns(
        engine,
        "SELECT rank, intDiv(step - {first:Int64}, {size:Int64}) AS b,"
        " avgIf(value, isFinite(value)), countIf(NOT isFinite(value))"
        f" FROM {points} FINAL WHERE {in_range} GROUP BY rank, b",
        {**where, "first": first, "size": found.heat_size},
        ("rank", "b", "v", "marks"),
    )
    found.cells["rank"] = found.cells["rank"].astype(np.int64)
    found.cells["b"] = found.cells["b"].astype(np.int64)


def _from_blocks(engine: ChEngine, found: SummaryRows, series_id: int, first: int) -> None:
    """Heatmap cells and the rollup as sums of block rows and the few single steps at
    the covers' edges (see the DuckDB store's twin)."""
    steps = found.stats["step"]
    pieces = block_math.buckets(steps, first, found.heat_size)
    rows, group = block_tables.read(engine, series_id, pieces, ("rank", "n", "marks", "total"))
    singles = _singles(engine, series_id, pieces)
    found.cells = block_math.cells(
        {name: np.concatenate([rows[name], singles[name]]) for name in rows},
        np.concatenate([group, singles["b"]]),
    )
    whole = block_math.whole(steps)
    rows, _ = block_tables.read(engine, series_id, whole, block_math.FIELDS)
    found.rollup = block_math.rollup(
        block_math.concat([block_tables.as_rows(rows), _singles(engine, series_id, whole)])
    )


_SCORED = ("step", "rank", "value", "local_rank", "delta", "z", "robust_z")  # a point, scored


def _singles(engine: ChEngine, series_id: int, pieces: block_math.Pieces) -> block_math.Rows:
    """The pieces' single steps' points, scored, as rows of one step (with ``b``)."""
    listed = pieces.singles()
    if not len(listed["step"]):
        rows = block_math.of_points({name: np.empty(0) for name in _SCORED})
        rows["b"] = np.empty(0, dtype=np.int64)
        return rows
    found = engine.query_np(
        "SELECT p.step, p.rank, p.value, p.local_rank, s.delta, s.z, s.robust_z FROM"
        f" (SELECT step, rank, value, local_rank FROM {engine.table('rank_points')} FINAL"
        " WHERE series_id = {sid:UInt64} AND step IN {steps:Array(Int64)}) AS p"
        f" LEFT JOIN (SELECT step, rank, delta, z, robust_z FROM {engine.table('scores')} FINAL"
        " WHERE series_id = {sid:UInt64} AND step IN {steps:Array(Int64)}) AS s"
        " ON p.step = s.step AND p.rank = s.rank",
        {"sid": series_id, "steps": listed["step"].tolist()},
    )
    columns = {name: np.asarray(found[name]) if len(found) else np.empty(0) for name in _SCORED}
    rows = block_math.of_points(columns)
    rows["b"] = listed["b"][
        np.searchsorted(listed["step"], columns["step"].astype(np.int64))
    ].astype(np.int64)
    return rows


def window_medians(
    engine: ChEngine, series_id: int, window: int, step_max: int | None = None
) -> tuple[tuple[int, int] | None, dict[int, tuple[float, int]]]:
    """Every step written has a row in stale_steps (stale or not): the window's steps (the
    last ``window`` up to ``step_max``)."""
    count, first, last = engine.rows(
        "SELECT count(), min(step), max(step) FROM (SELECT step FROM"
        f" {engine.table('stale_steps')} FINAL WHERE series_id = {{sid:UInt64}}"
        " AND step <= {ceiling:Int64} ORDER BY step DESC LIMIT {window:UInt32})",
        {"sid": series_id, "window": window,
         "ceiling": np.iinfo(np.int64).max if step_max is None else step_max},
    )[0]  # fmt: skip
    if not count:
        return None, {}
    medians = engine.rows(
        "SELECT rank, quantileExactInclusive(0.5)(value), uniqExact(step) FROM"
        f" {engine.table('rank_points')} FINAL WHERE series_id = {{sid:UInt64}}"
        " AND step BETWEEN {first:Int64} AND {last:Int64} AND isFinite(value) GROUP BY rank",
        {"sid": series_id, "first": first, "last": last},
    )
    return (int(first), int(last)), {int(r): (float(m), int(n)) for r, m, n in medians}


def window_points(engine: ChEngine, series_id: int, steps: int) -> dict[str, np.ndarray]:
    """The points of the series' last ``steps`` steps (every step written has a row in
    stale_steps)."""
    count, first = engine.rows(
        "SELECT count(), min(step) FROM (SELECT step FROM"
        f" {engine.table('stale_steps')} FINAL WHERE series_id = {{sid:UInt64}}"
        " ORDER BY step DESC LIMIT {steps:UInt32})",
        {"sid": series_id, "steps": steps},
    )[0]
    rows = []
    if count:
        rows = engine.rows(
            "SELECT step, rank, value, weight, world_size, ts FROM"
            f" {engine.table('rank_points')} FINAL WHERE series_id = {{sid:UInt64}}"
            " AND step >= {first:Int64} ORDER BY step, rank",
            {"sid": series_id, "first": first},
        )
    dtypes = (np.int64, np.int64, np.float64, np.float64, np.int64, np.float64)
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(dtypes)
    return {
        name: np.array(column, dtype=dtype)
        for name, column, dtype in zip(
            ("step", "rank", "value", "weight", "world_size", "ts"), columns, dtypes, strict=True
        )
    }


def next_step(engine: ChEngine, series_id: int, after: int | None) -> int | None:
    """The series' first step after ``after`` (its first step when None)."""
    ((count, found),) = engine.rows(
        f"SELECT count(), min(step) FROM {engine.table('stale_steps')} FINAL"
        " WHERE series_id = {sid:UInt64} AND step > {after:Int64}",
        {"sid": series_id, "after": -1 if after is None else after},
    )
    return int(found) if count else None


def last_steps_of(
    engine: ChEngine, series_id: int, ranks: list[int], before: int | None = None
) -> dict[int, int]:
    """Each of these ranks' last step in the series (before ``before``; ranks with none
    absent)."""
    rows = engine.rows(
        f"SELECT rank, max(step) FROM {engine.table('rank_points')} FINAL"
        " WHERE series_id = {sid:UInt64} AND has({ranks:Array(Int64)}, rank)"
        " AND step < {before:Int64} GROUP BY rank",
        {"sid": series_id, "ranks": ranks,
         "before": np.iinfo(np.int64).max if before is None else before},
    )  # fmt: skip
    return {int(r): int(s) for r, s in rows}


def first_nonfinite(
    engine: ChEngine, series_id: int, lo: int = 0, hi: int = 2**63 - 1
) -> dict[int, tuple[int, float]]:
    """Per rank with a non-finite value in the series (in steps ``lo``-``hi``): its first
    such step, and the value."""
    rows = engine.rows(
        f"SELECT rank, min(step), argMin(value, step) FROM {engine.table('rank_points')} FINAL"
        " WHERE series_id = {sid:UInt64} AND step BETWEEN {lo:Int64} AND {hi:Int64}"
        " AND NOT isFinite(value) GROUP BY rank",
        {"sid": series_id, "lo": lo, "hi": hi},
    )
    return {int(r): (int(s), float(v)) for r, s, v in rows}
