"""The point tables of the DuckDB store: their schema, the migrations of stores written
by earlier versions, and the writes that are plain table operations (rows in, old rows
out). What decides those writes is the store (:mod:`.points`) and its head (:mod:`.head`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from ...rankmath import covers as block_math
from ...rankmath.params import ROBUST_Z_THRESHOLD
from ..records import ScalarPoint
from .engine import Engine

# A scalar step is any finite number >= 0 (validation.scalar_step), kept as a float64.
SCALAR_SCHEMA = """CREATE TABLE IF NOT EXISTS scalar_points (
    series_id INTEGER NOT NULL, step DOUBLE NOT NULL, value DOUBLE NOT NULL,
    ts DOUBLE NOT NULL, preview BOOLEAN NOT NULL, PRIMARY KEY (series_id, step));"""
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS rank_points (
    series_id INTEGER NOT NULL, step BIGINT NOT NULL, rank SMALLINT NOT NULL,
    world_size SMALLINT NOT NULL, local_rank SMALLINT, value DOUBLE NOT NULL,
    weight DOUBLE NOT NULL, ts DOUBLE NOT NULL,
    delta DOUBLE, z DOUBLE, robust_z DOUBLE);  -- one row per (series_id, step, rank)
{SCALAR_SCHEMA}
CREATE TABLE IF NOT EXISTS step_stats (
    series_id INTEGER NOT NULL, step BIGINT NOT NULL, n INTEGER NOT NULL,
    expected INTEGER NOT NULL, mean DOUBLE NOT NULL, weighted_mean DOUBLE NOT NULL,
    min DOUBLE NOT NULL, max DOUBLE NOT NULL, std DOUBLE NOT NULL, p05 DOUBLE NOT NULL,
    p50 DOUBLE NOT NULL, p95 DOUBLE NOT NULL, mad DOUBLE NOT NULL, mean_ad DOUBLE NOT NULL,
    PRIMARY KEY (series_id, step));
CREATE TABLE IF NOT EXISTS stale_steps (series_id INTEGER NOT NULL, step BIGINT NOT NULL);
-- Stores written by earlier versions: the columns they did not have.
ALTER TABLE rank_points ADD COLUMN IF NOT EXISTS delta DOUBLE;
ALTER TABLE rank_points ADD COLUMN IF NOT EXISTS z DOUBLE;
ALTER TABLE rank_points ADD COLUMN IF NOT EXISTS robust_z DOUBLE;
ALTER TABLE step_stats ADD COLUMN IF NOT EXISTS nonfinite INTEGER DEFAULT 0;
-- A store written before aggregates existed: every step of it is stale.
INSERT INTO stale_steps SELECT DISTINCT series_id, step FROM rank_points
WHERE NOT EXISTS (SELECT 1 FROM step_stats) AND NOT EXISTS (SELECT 1 FROM stale_steps)
    AND NOT EXISTS (SELECT 1 FROM rank_points WHERE z IS NOT NULL);
"""


def float_scalar_steps(con: Any) -> None:
    """A store from before scalar steps could be fractions keeps them as BIGINT: copy its
    scalar points into the DOUBLE column once (every integer step below 2**53 exactly)."""
    found = con.execute(
        "SELECT data_type FROM information_schema.columns"
        " WHERE table_name = 'scalar_points' AND column_name = 'step'"
    ).fetchall()
    if not found or found[0][0] == "DOUBLE":
        return
    con.execute("BEGIN TRANSACTION")
    con.execute("ALTER TABLE scalar_points RENAME TO scalar_points_int")
    con.execute(SCALAR_SCHEMA)
    con.execute(
        "INSERT INTO scalar_points SELECT series_id, step, value, ts, preview FROM scalar_points_int"
    )
    con.execute("DROP TABLE scalar_points_int")
    con.execute("COMMIT")


def insert_points(engine: Engine, frame: dict[str, np.ndarray]) -> None:
    """Append a unit's scored rank points (a local rank of -1 is none, a NaN score not
    scored: both NULL)."""
    local_rank = frame["local_rank"]
    engine.append(
        "rank_points",
        {
            **{name: frame[name] for name in ("series_id", "step", "rank", "world_size")},
            "local_rank": pa.array(local_rank, mask=local_rank < 0),
            **{name: frame[name] for name in ("value", "weight", "ts")},
            **{name: _nan_null(frame[name]) for name in ("delta", "z", "robust_z")},
        },
    )


def _nan_null(column: np.ndarray) -> pa.Array:
    return pa.array(column, mask=np.isnan(column))


def insert_outliers(engine: Engine, frame: dict[str, np.ndarray]) -> None:
    """Keep the scored points that are outliers at the default thresholds as rows (a
    few per batch: selected here, so the batch is not scanned again)."""
    with np.errstate(invalid="ignore"):
        chosen = np.flatnonzero(
            (np.abs(frame["z"]) >= block_math.DEFAULT_Z)
            | (np.abs(frame["robust_z"]) >= ROBUST_Z_THRESHOLD)
        )
    if not len(chosen):
        return
    names = ("series_id", "step", "rank", "local_rank", "value", "delta", "z", "robust_z")
    rows = {name: frame[name][chosen] for name in names}
    with engine.frame("outliers", rows) as (source, params):
        engine.run(
            "INSERT INTO outlier_rows SELECT series_id, step, rank, nullif(local_rank, -1),"
            f" value, delta, z, robust_z FROM {source}",
            params,
        )


def delete_points(engine: Engine, points: list[tuple[int, int, int]]) -> None:
    """Delete these (series, step, rank) points where they exist: a rewrite's old row."""
    sids, steps, ranks = (np.array(c, dtype=np.int64) for c in zip(*points))
    frame: dict[str, np.ndarray] = {
        "series_id": sids.astype(np.int32),
        "step": steps,
        "rank": ranks.astype(np.int16),
    }
    with engine.frame("rewrites", frame) as (source, params):
        # The ranges let zone maps skip the row groups no rewrite can be in.
        engine.run(
            f"DELETE FROM rank_points USING {source} WHERE"
            " rank_points.series_id = rewrites.series_id AND rank_points.step = rewrites.step"
            " AND rank_points.rank = rewrites.rank"
            " AND rank_points.series_id BETWEEN ? AND ? AND rank_points.step BETWEEN ? AND ?",
            [*params, int(sids.min()), int(sids.max()), int(steps.min()), int(steps.max())],
        )


def upsert_scalars(engine: Engine, points: list[ScalarPoint]) -> None:
    columns: dict[str, tuple[list[Any], Any]] = {
        "series_id": ([p.series_id for p in points], np.int32),
        "step": ([p.step for p in points], np.float64),
        "value": ([p.value for p in points], np.float64),
        "ts": ([p.ts for p in points], np.float64),
        "preview": ([p.preview for p in points], np.bool_),
    }
    with engine.rows("scalar_batch", columns) as (source, params):
        engine.run(
            "INSERT OR REPLACE INTO scalar_points"
            f" SELECT series_id, step, value, ts, preview FROM {source}",
            params,
        )
