"""Removing a deleted run's rows from the embedded point store, a bounded unit at a time.

Each call deletes up to about ``budget`` rows, table by table (the small ones first, so
that a restart half way finds no stale step or block of the series to recompute), a
window of steps at a time within a table. DuckDB reuses the space of deleted rows for
the next writes and gives it back to the file system at a checkpoint's vacuum.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...rankmath.covers import LEVELS
from .block_tables import table
from .engine import Engine

# (table, its step column), in the order emptied.
TABLES = (
    ("stale_steps", "step"),
    ("stale_blocks", "start"),
    ("outlier_rows", "step"),
    ("step_stats", "step"),
    ("step_blocks", "start"),
    *((table(level), "start") for level in range(LEVELS, 0, -1)),
    ("scalar_points", "step"),
    ("rank_points", "step"),
)


def purge(engine: Engine, series_ids: Sequence[int], budget: int) -> bool:
    """*In a unit*: delete up to about ``budget`` rows of these series; True while rows of
    them remain."""
    ids = ", ".join(str(int(sid)) for sid in series_ids)
    if not ids:
        return False
    left = budget
    for name, column in TABLES:
        while True:
            ((first, last, rows),) = engine.execute(
                f"SELECT min({column}), max({column}), count(*) FROM {name}"
                f" WHERE series_id IN ({ids})",
                [],
            )
            if not rows:
                break
            if left <= 0:
                return True
            if rows <= left:
                engine.execute(f"DELETE FROM {name} WHERE series_id IN ({ids})", [])
                left -= rows
                break
            # A window of steps that holds about ``left`` rows, were they spread evenly.
            width = max(1, int((last - first + 1) * left / rows))
            ((deleted,),) = engine.execute(
                f"DELETE FROM {name} WHERE series_id IN ({ids}) AND {column} < %s",
                [first + width],
            )
            left -= int(deleted)
    return False
