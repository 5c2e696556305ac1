"""Per-step aggregates of rank points in DuckDB: the ``step_stats`` rows (reducers per
step), each point's scores (``delta``, ``z``, ``robust_z`` in ``rank_points``), and the
helpers the point store stages with. Reducers and scores always come from
:func:`instantml.rankmath.step_stats.step_stats`, the one implementation of docs/reference.md's
definitions: there is no SQL twin of it."""

from __future__ import annotations

import numpy as np

from ...rankmath.covers import DEFAULT_Z
from ...rankmath.params import ROBUST_Z_THRESHOLD
from ...rankmath.step_stats import REFERENCE_STEPS, reach, robust_spread, step_stats
from .engine import Engine

STATS_COLUMNS = (
    "step", "n", "expected", "mean", "weighted_mean", "min", "max", "std", "p05", "p50",
    "p95", "mad", "mean_ad", "nonfinite",
)  # fmt: skip


def insert_stats(engine: Engine, rows: dict[str, np.ndarray]) -> None:
    names = ("series_id", *STATS_COLUMNS)
    listed = ", ".join(names)
    with engine.frame("stats_batch", {n: rows[n] for n in names}) as (source, params):
        engine.run(f"INSERT INTO step_stats ({listed}) SELECT {listed} FROM {source}", params)


def unscore(
    engine: Engine,
    steps: dict[str, np.ndarray],
    tables: tuple[str, ...] = ("step_stats", "outlier_rows"),
) -> None:
    """Delete the rows of these (``series_id``, ``step``)s from each of ``tables``: steps to
    be scored again. The steps' range lets zone maps skip the row groups outside it."""
    low, high = int(steps["step"].min()), int(steps["step"].max())
    for table in tables:
        with engine.frame("rescored", steps) as (source, params):
            engine.run(
                f"DELETE FROM {table} USING {source} WHERE {table}.series_id ="
                f" rescored.series_id AND {table}.step = rescored.step"
                f" AND {table}.step BETWEEN ? AND ?",
                [*params, low, high],
            )


def spread_history(engine: Engine, sid: int, before: int | None) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, spreads)``: the series' last ``REFERENCE_STEPS - 1`` scored steps before
    ``before`` (all when None) with 2 finite values or more, oldest first, and each one's
    robust spread: what a step's reference spread is taken over, with its own."""
    rows = (
        engine.run(  # the unit's own connection: it sees the unit's rows
            "SELECT step, n, mad FROM step_stats WHERE series_id = $sid AND step < $before"
            " AND n >= 2 ORDER BY step DESC LIMIT $limit",
            {"sid": sid, "before": np.iinfo(np.int64).max if before is None else before,
             "limit": REFERENCE_STEPS - 1},
        )
        .fetchnumpy()
    )  # fmt: skip
    steps = np.asarray(rows["step"], dtype=np.int64)[::-1]
    return steps, robust_spread(np.asarray(rows["n"])[::-1], np.asarray(rows["mad"])[::-1])


def affected(engine: Engine, sid: int, steps: list[int]) -> list[tuple[int, int]]:
    """The step ranges to score again when these steps' points changed (``reach``)."""
    later = engine.run(
        "SELECT step FROM step_stats WHERE series_id = $sid AND step > $lo AND n >= 2"
        " ORDER BY step",
        {"sid": sid, "lo": steps[0]},
    ).fetchnumpy()["step"]
    return reach(steps, np.asarray(later, dtype=np.int64))


def recompute(
    engine: Engine, sid: int, steps: list[int]
) -> tuple[list[tuple[int, int]], np.ndarray]:
    """Reducers and scores of these steps of one series, from all their points, and the
    scores of the steps whose reference spread they are in. Returns the step ranges
    scored again and the steps in them that have points (their blocks are stale): a range
    can span a long gap between a step and the next ones it reaches."""
    ranges = affected(engine, sid, steps)
    scored = [_recompute_range(engine, sid, lo, hi) for lo, hi in ranges]
    return ranges, np.concatenate(scored) if scored else np.empty(0, dtype=np.int64)


def _recompute_range(engine: Engine, sid: int, lo: int, hi: int) -> np.ndarray:
    """Every step from ``lo`` to ``hi`` of one series, scored again from its points; the
    steps that have points."""
    con = engine.con
    _, history = spread_history(engine, sid, lo)
    # The range lets zone maps skip every row group outside the steps.
    points = con.execute(
        "SELECT step, rank, value, weight, world_size, local_rank FROM rank_points"
        " WHERE series_id = $sid AND step BETWEEN $lo AND $hi",
        {"sid": sid, "lo": lo, "hi": hi},
    ).fetchnumpy()
    for table in ("step_stats", "stale_steps", "outlier_rows"):
        con.execute(
            f"DELETE FROM {table} WHERE series_id = $sid AND step BETWEEN $lo AND $hi",
            {"sid": sid, "lo": lo, "hi": hi},
        )
    if not len(points["step"]):
        return np.empty(0, dtype=np.int64)
    step_rows, delta, z, robust = step_stats(
        points["step"], points["value"], points["weight"], points["world_size"], history
    )
    step_rows["series_id"] = np.full(len(step_rows["step"]), sid, dtype=np.int32)
    insert_stats(engine, step_rows)
    scored = {
        "step": points["step"],
        "rank": points["rank"],
        "delta": delta,
        "z": z,
        "robust_z": robust,
    }
    outlier = (np.abs(z) >= DEFAULT_Z) | (np.abs(robust) >= ROBUST_Z_THRESHOLD)
    if outlier.any():
        local = np.ma.filled(np.ma.asarray(points["local_rank"]).astype(np.float64), np.nan)
        rows = {
            "series_id": np.full(int(outlier.sum()), sid, dtype=np.int32),
            "step": points["step"][outlier],
            "rank": points["rank"][outlier],
            "local_rank": local[outlier],
            "value": points["value"][outlier],
            "delta": delta[outlier],
            "z": z[outlier],
            "robust_z": robust[outlier],
        }
        with engine.frame("outliers", rows) as (source, params):
            con.execute(
                "INSERT INTO outlier_rows SELECT series_id, step, rank,"
                " CASE WHEN isnan(local_rank) THEN NULL ELSE local_rank END, value, delta, z,"
                f" robust_z FROM {source}",
                params,
            )
    with engine.frame("scored", scored) as (source, params):
        con.execute(
            "UPDATE rank_points SET delta = CASE WHEN isnan(scored.delta) THEN NULL ELSE"
            " scored.delta END, z = CASE WHEN isnan(scored.z) THEN NULL ELSE scored.z END,"
            " robust_z = CASE WHEN isnan(scored.robust_z) THEN NULL ELSE scored.robust_z END"
            f" FROM {source} WHERE rank_points.series_id = ? AND rank_points.step = scored.step"
            " AND rank_points.rank = scored.rank AND rank_points.step BETWEEN ? AND ?",
            [*params, sid, lo, hi],
        )
    return np.asarray(step_rows["step"], dtype=np.int64)
