"""The table reads of a Distributed summary in DuckDB (the flow, and every figure's
definition: :mod:`instantml.storage.querier`), in one snapshot.

A summary over 5M points reads the step rows of ``step_stats`` and the block rows of its
covers (:mod:`.block_tables`), not every point; the level-1 blocks still stale in the
snapshot (written since the last rebuild) are read as points, so the answer holds every
committed point without waiting for them to be rebuilt.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import duckdb
import numpy as np

from ...rankmath import covers, step_blocks
from ...rankmath.params import ROBUST_Z_THRESHOLD
from ..querier import CELL_SUMS, STEP_COLUMNS, CellSums
from . import block_tables
from .windows import first_nonfinite

if TYPE_CHECKING:
    from ...rankmath.params import SummaryParams


class DuckDBSummaryTables:
    # A zoom whose buckets are a few steps wide: most of its cover would be single steps,
    # so one contiguous read of its points costs less, up to twice the cover's rows.
    scan_ratio = 2.0

    def __init__(self, cur: duckdb.DuckDBPyConnection) -> None:
        self._cur = cur

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        self._cur.execute("BEGIN TRANSACTION")
        try:
            yield
        except BaseException:
            self._cur.execute("ROLLBACK")
            raise
        self._cur.execute("COMMIT")

    def world_size(self, series_id: int) -> int:
        (found,) = self._cur.execute(
            "SELECT coalesce(max(expected), 0) FROM step_stats WHERE series_id = $sid",
            {"sid": series_id},
        ).fetchall()[0]
        return int(found)

    def step_span(self, series_id: int, lo: int, hi: int) -> tuple[int, int, int]:
        count, first, last = self._cur.execute(
            "SELECT count(*), min(step), max(step) FROM step_stats"
            " WHERE series_id = $sid AND step BETWEEN $lo AND $hi",
            {"sid": series_id, "lo": lo, "hi": hi},
        ).fetchall()[0]
        return (int(count), int(first), int(last)) if count else (0, 0, 0)

    def step_rows_at(self, series_id: int, steps: np.ndarray) -> dict[str, np.ndarray]:
        if not len(steps):
            return {
                name: np.empty(0, dtype=_STEP_DTYPES.get(name, np.float64)) for name in STEP_COLUMNS
            }
        stats = self._cur.execute(
            f"SELECT {', '.join(STEP_COLUMNS)} FROM step_stats WHERE series_id = $sid"
            " AND step BETWEEN $lo AND $hi AND list_contains($steps, step)",
            {"sid": series_id, "lo": int(steps.min()), "hi": int(steps.max()),
             "steps": np.asarray(steps, dtype=np.int64).tolist()},
        ).fetchnumpy()  # fmt: skip
        return _in_step_order(stats)

    def step_block_rows(
        self, series_id: int, pieces: covers.Pieces
    ) -> tuple[step_blocks.Rows, np.ndarray]:
        blocked = pieces.blocks()
        if not len(blocked["start"]):
            return _no_step_blocks(), np.empty(0, dtype=np.int64)
        cur = self._cur
        cur.register("pieces", blocked)
        try:
            found = cur.execute(
                f"SELECT p.b, {', '.join('r.' + c for c in step_blocks.FIELDS)} FROM step_blocks r"
                " JOIN pieces p ON p.level = r.level AND p.start = r.start"
                " WHERE r.series_id = $sid AND r.start BETWEEN $lo AND $hi"
                " AND r.start IN (SELECT start FROM pieces)",
                {
                    "sid": series_id,
                    "lo": int(blocked["start"].min()),
                    "hi": int(blocked["start"].max()),
                },
            ).fetchnumpy()
        finally:
            cur.unregister("pieces")
        return (
            {c: np.asarray(found[c]) for c in step_blocks.FIELDS},
            np.asarray(found["b"]).astype(np.int64),
        )

    def next_steps(self, series_id: int, after: list[int]) -> dict[int, int]:
        rows = self._cur.execute(
            "SELECT a.step, (SELECT min(s.step) FROM step_stats s WHERE s.series_id = $sid"
            " AND s.step > a.step) FROM (SELECT unnest($after) AS step) a",
            {"sid": series_id, "after": after},
        ).fetchall()
        return {int(a): int(n) for a, n in rows if n is not None}

    def step_rows(self, series_id: int, lo: int, hi: int) -> dict[str, np.ndarray]:
        stats = self._cur.execute(
            f"SELECT {', '.join(STEP_COLUMNS)} FROM step_stats"
            " WHERE series_id = $sid AND step BETWEEN $lo AND $hi",
            {"sid": series_id, "lo": lo, "hi": hi},
        ).fetchnumpy()
        return _in_step_order(stats)

    def stale_blocks(self, series_id: int) -> np.ndarray:
        found = self._cur.execute(
            "SELECT start FROM stale_blocks WHERE series_id = $sid UNION"  # with implied_blocks
            f" SELECT step // {covers.BASE} * {covers.BASE} FROM stale_steps WHERE series_id = $sid"
            " ORDER BY start",
            {"sid": series_id},
        ).fetchnumpy()["start"]
        return np.asarray(found, dtype=np.int64)

    def point_cell_sums(self, series_id: int, lo: int, hi: int, size: int) -> CellSums:
        """Summed per (rank, bucket) in DuckDB: one row per cell comes back, not a row per
        point."""
        found = self._cur.execute(
            "SELECT rank, step // $size AS b,"
            " count(*) FILTER (WHERE isfinite(value)) AS n,"
            " coalesce(sum(value) FILTER (WHERE isfinite(value)), 0) AS total,"
            " count(*) FILTER (WHERE NOT isfinite(value)) AS marks FROM rank_points"
            " WHERE series_id = $sid AND step BETWEEN $lo AND $hi GROUP BY rank, b",
            {"sid": series_id, "lo": lo, "hi": hi, "size": size},
        ).fetchnumpy()
        return (
            {name: np.asarray(found[name]) for name in CELL_SUMS},
            np.asarray(found["b"]).astype(np.int64),
        )

    def cover_rows(self, series_id: int, pieces: covers.Pieces) -> tuple[covers.Rows, np.ndarray]:
        blocked = pieces.blocks()
        fields = ", ".join("r." + name for name in covers.FIELDS)
        covered = block_tables.covering(blocked["level"], blocked["start"], fields)
        cur = self._cur
        cur.register("pieces", blocked)
        cur.register("singles", pieces.singles())
        try:
            found = cur.execute(
                f"{covered + ' UNION ALL ' if covered else ''}SELECT e.b,"
                f" {block_tables.POINT_AS_BLOCK} FROM rank_points JOIN singles e USING (step)"
                " WHERE series_id = $sid AND step IN (SELECT step FROM singles)",
                {"sid": series_id},
            ).fetchnumpy()
        finally:
            cur.unregister("pieces")
            cur.unregister("singles")
        return _as_rows(found), np.asarray(found["b"]).astype(np.int64)

    def range_rollup(
        self, series_id: int, lo: int, hi: int, z: float, robust_z: float
    ) -> covers.Rows:
        # A rank's last_step and local rank count its marks (it reported); its
        # steps_reported, deltas and scores count only finite values.
        found = self._cur.execute(
            "SELECT rank, count(*) FILTER (WHERE isfinite(value)) AS n,"
            " count(*) FILTER (WHERE NOT isfinite(value)) AS marks, 0.0 AS total,"
            " max(step) AS last_step, coalesce(sum(delta), 0) AS sum_delta,"
            " coalesce(sum(abs(z)), 0) AS sum_abs_z,"
            " count(*) FILTER (WHERE abs(z) >= $z OR abs(robust_z) >= $rz) AS outliers,"
            " max(step) FILTER (WHERE local_rank IS NOT NULL) AS lr_step,"
            " arg_max(local_rank, step) FILTER (WHERE local_rank IS NOT NULL) AS local_rank"
            " FROM rank_points WHERE series_id = $sid AND step BETWEEN $lo AND $hi"
            " GROUP BY rank",
            {"sid": series_id, "lo": lo, "hi": hi, "z": z, "rz": robust_z},
        ).fetchnumpy()
        return _as_rows(found)

    def outliers(
        self, series_id: int, lo: int, hi: int, params: SummaryParams, kept: bool
    ) -> list[tuple[Any, ...]]:
        return self._cur.execute(
            f"WITH o AS (SELECT step, rank, local_rank, value, delta, z, robust_z"
            f" FROM {'outlier_rows' if kept else 'rank_points'}"
            " WHERE series_id = $sid AND step BETWEEN $lo AND $hi"
            " AND (abs(z) >= $z OR abs(robust_z) >= $rz)"
            " ORDER BY abs(robust_z) DESC, abs(z) DESC, step, rank LIMIT $limit)"
            " SELECT o.step, o.rank, o.local_rank, o.value, s.mean, o.delta, o.z, o.robust_z"
            " FROM o JOIN step_stats s ON s.series_id = $sid AND s.step = o.step"
            " ORDER BY abs(o.robust_z) DESC, abs(o.z) DESC, o.step, o.rank",
            {"sid": series_id, "lo": lo, "hi": hi, "z": params.z, "rz": ROBUST_Z_THRESHOLD,
             "limit": params.outlier_limit},
        ).fetchall()  # fmt: skip

    def first_nonfinite(self, series_id: int, lo: int, hi: int) -> dict[int, tuple[int, float]]:
        return first_nonfinite(self._cur, series_id, lo, hi)


def _in_step_order(stats: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The step rows by step. Read without ORDER BY: they come in the order they were
    written, which is almost always by step, and checking that costs far less than
    DuckDB's sort of every column; a run whose steps were rewritten out of order is
    sorted here."""
    steps = stats["step"]
    if len(steps) < 2 or bool((steps[1:] > steps[:-1]).all()):
        return stats
    order = np.argsort(steps, kind="stable")
    return {name: column[order] for name, column in stats.items()}


def _as_rows(found: dict[str, Any]) -> covers.Rows:
    """Fetched columns (``covers.FIELDS``; NULLs masked) as rows: a missing local rank,
    and the step it was given at, -1."""
    rows: covers.Rows = {}
    for name in covers.FIELDS:
        column = np.ma.asarray(found[name])
        if name in ("total", "sum_delta", "sum_abs_z"):
            rows[name] = np.ma.filled(column.astype(np.float64), 0.0)
        else:
            rows[name] = np.ma.filled(column.astype(np.int64), -1)
    return rows


_STEP_DTYPES = {"step": np.int64, "n": np.int64, "expected": np.int64, "nonfinite": np.int64}


def _no_step_blocks() -> step_blocks.Rows:
    return {
        c: np.empty(0, dtype=np.int64 if c in step_blocks.INTS else np.float64)
        for c in step_blocks.FIELDS
    }
