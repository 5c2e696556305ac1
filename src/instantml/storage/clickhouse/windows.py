"""Reads of a series' newest steps in ClickHouse (``FINAL``), for run health and live
coverage: every step written has a row in ``stale_steps`` (stale or not), so the last N
steps are found there; each rank's median over them, their points, a rank's last step,
the first non-finite values."""

from __future__ import annotations

import numpy as np

from .engine import ChEngine


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
    dtypes = {"step": np.int64, "rank": np.int64, "value": np.float64, "weight": np.float64,
              "world_size": np.int64, "ts": np.float64}  # fmt: skip
    if not count:
        return {name: np.empty(0, dtype=dtype) for name, dtype in dtypes.items()}
    # As numpy columns: a health look reads thousands of steps of every rank while ingest
    # runs in the same process, and Python rows cost it most of its time.
    found = engine.query_np(
        f"SELECT {', '.join(dtypes)} FROM {engine.table('rank_points')} FINAL"
        " WHERE series_id = {sid:UInt64} AND step >= {first:Int64} ORDER BY step, rank",
        {"sid": series_id, "first": first},
    )
    return {
        name: np.asarray(found[name] if len(found) else [], dtype=dtype)
        for name, dtype in dtypes.items()
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
