"""The table reads of a Distributed summary in ClickHouse (the flow, and every figure's
definition: :mod:`instantml.storage.querier`), with ``FINAL``: the newest version of each
row. Scores of non-finite points are NaN: kept out of every mean and never an outlier (a
comparison with NaN is false). Blocks are rebuilt before a read that needs them (the
store's refresh), so none is read as points here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

from ...rankmath import covers, step_blocks
from ...rankmath.params import ROBUST_Z_THRESHOLD
from ..querier import STEP_COLUMNS, CellSums
from . import block_tables
from .engine import ChEngine
from .windows import first_nonfinite

if TYPE_CHECKING:
    from ...rankmath.params import SummaryParams

_INTS = {"step": np.int64, "n": np.int64, "expected": np.int64, "nonfinite": np.int64,
         "rank": np.int64, "b": np.int64, "marks": np.int64}  # fmt: skip
_IN_RANGE = "series_id = {sid:UInt64} AND step BETWEEN {lo:Int64} AND {hi:Int64}"
_SCORED = ("step", "rank", "value", "local_rank", "delta", "z", "robust_z")  # a point, scored


class ClickHouseSummaryTables:
    scan_ratio = 0.0  # always the cover: its rows come from one primary-key read

    def __init__(self, engine: ChEngine) -> None:
        self._engine = engine

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        yield  # each query reads the newest version of every row (FINAL)

    def world_size(self, series_id: int) -> int:
        (found,) = self._engine.rows(
            f"SELECT max(expected) FROM {self._engine.table('step_stats')} FINAL"
            " WHERE series_id = {sid:UInt64}",
            {"sid": series_id},
        )[0]
        return int(found or 0)

    def step_rows(self, series_id: int, lo: int, hi: int) -> dict[str, np.ndarray]:
        return self._columns(
            f"SELECT {', '.join(STEP_COLUMNS)} FROM {self._engine.table('step_stats')} FINAL"
            f" WHERE {_IN_RANGE} ORDER BY step",
            {"sid": series_id, "lo": lo, "hi": hi},
            STEP_COLUMNS,
        )

    def step_span(self, series_id: int, lo: int, hi: int) -> tuple[int, int, int]:
        count, first, last = self._engine.rows(
            f"SELECT count(), min(step), max(step) FROM {self._engine.table('step_stats')} FINAL"
            f" WHERE {_IN_RANGE}",
            {"sid": series_id, "lo": lo, "hi": hi},
        )[0]
        return (int(count), int(first), int(last)) if count else (0, 0, 0)

    def step_rows_at(self, series_id: int, steps: np.ndarray) -> dict[str, np.ndarray]:
        return self._columns(
            f"SELECT {', '.join(STEP_COLUMNS)} FROM {self._engine.table('step_stats')} FINAL"
            " WHERE series_id = {sid:UInt64} AND step IN {steps:Array(Int64)} ORDER BY step",
            {"sid": series_id, "steps": np.asarray(steps, dtype=np.int64).tolist()},
            STEP_COLUMNS,
        )

    def step_block_rows(
        self, series_id: int, pieces: covers.Pieces
    ) -> tuple[step_blocks.Rows, np.ndarray]:
        return block_tables.read_steps(self._engine, series_id, pieces)

    def next_steps(self, series_id: int, after: list[int]) -> dict[int, int]:
        table = self._engine.table("step_stats")
        found: dict[int, int] = {}
        for step in after:  # the last steps of the ranks that left: a few
            ((count, first),) = self._engine.rows(
                f"SELECT count(), min(step) FROM {table} FINAL WHERE series_id = {{sid:UInt64}}"
                " AND step > {after:Int64}",
                {"sid": series_id, "after": step},
            )
            if count:
                found[step] = int(first)
        return found

    def stale_blocks(self, series_id: int) -> np.ndarray:
        return np.empty(0, dtype=np.int64)

    def point_cell_sums(self, series_id: int, lo: int, hi: int, size: int) -> CellSums:
        found = self._columns(
            "SELECT rank, intDiv(step, {size:Int64}) AS b,"
            " countIf(isFinite(value)), sumIf(value, isFinite(value)),"
            f" countIf(NOT isFinite(value)) FROM {self._engine.table('rank_points')} FINAL"
            f" WHERE {_IN_RANGE} GROUP BY rank, b",
            {"sid": series_id, "lo": lo, "hi": hi, "size": size},
            ("rank", "b", "n", "total", "marks"),
        )
        bucket = found.pop("b")
        return found, bucket

    def cover_rows(self, series_id: int, pieces: covers.Pieces) -> tuple[covers.Rows, np.ndarray]:
        rows, group = block_tables.read(self._engine, series_id, pieces, covers.FIELDS)
        singles = self._singles(series_id, pieces)
        return (
            covers.concat([block_tables.as_rows(rows), singles]),
            np.concatenate([group, np.asarray(singles["b"], dtype=np.int64)]),
        )

    def range_rollup(
        self, series_id: int, lo: int, hi: int, z: float, robust_z: float
    ) -> covers.Rows:
        where = {"sid": series_id, "lo": lo, "hi": hi}
        # A rank's last step and local rank count its marks (it reported); its steps
        # reported, deltas and scores count only finite values.
        reports = self._columns(
            "SELECT rank, countIf(isFinite(value)), countIf(NOT isFinite(value)), max(step),"
            " maxIf(step, local_rank >= 0), argMaxIf(local_rank, step, local_rank >= 0),"
            " countIf(local_rank >= 0)"
            f" FROM {self._engine.table('rank_points')} FINAL WHERE {_IN_RANGE} GROUP BY rank"
            " ORDER BY rank",
            where,
            ("rank", "n", "marks", "last_step", "lr_step", "local_rank", "has_local"),
        )
        scored = self._columns(
            "SELECT rank, sumIf(delta, isFinite(delta)), sumIf(abs(z), isFinite(z)),"
            " countIf(abs(z) >= {z:Float64} OR abs(robust_z) >= {rz:Float64})"
            f" FROM {self._engine.table('scores')} FINAL WHERE {_IN_RANGE} GROUP BY rank",
            {**where, "z": z, "rz": robust_z},
            ("rank", "sum_delta", "sum_abs_z", "outliers"),
        )
        ranks = reports["rank"].astype(np.int64)
        at = np.searchsorted(ranks, scored["rank"].astype(np.int64))
        rows: covers.Rows = {
            "rank": ranks,
            "n": reports["n"].astype(np.int64),
            "marks": reports["marks"].astype(np.int64),
            "total": np.zeros(len(ranks)),
            "last_step": reports["last_step"].astype(np.int64),
            "lr_step": np.where(reports["has_local"] > 0, reports["lr_step"], -1).astype(np.int64),
            "local_rank": np.where(reports["has_local"] > 0, reports["local_rank"], -1).astype(
                np.int64
            ),
        }
        for name, dtype in (("sum_delta", np.float64), ("sum_abs_z", np.float64),
                            ("outliers", np.int64)):  # fmt: skip
            column = np.zeros(len(ranks), dtype=dtype)
            column[at] = scored[name]
            rows[name] = column
        return rows

    def outliers(
        self, series_id: int, lo: int, hi: int, params: SummaryParams, kept: bool
    ) -> list[tuple[Any, ...]]:
        engine = self._engine
        scores, points = engine.table("scores"), engine.table("rank_points")
        if kept:
            # The kept rows, each still current if the point's scores have its version (a
            # later refresh that found it no outlier wrote newer scores, and no row).
            candidates = (
                "SELECT o.step AS step, o.rank AS rank, o.local_rank AS local_rank,"
                " o.value AS value, o.delta AS delta, o.z AS z, o.robust_z AS robust_z FROM"
                f" (SELECT * FROM {engine.table('outlier_rows')} FINAL WHERE {_IN_RANGE}) AS o"
                f" INNER JOIN (SELECT step, rank, version FROM {scores} FINAL WHERE {_IN_RANGE}"
                f" AND (step, rank) IN (SELECT step, rank FROM {engine.table('outlier_rows')}"
                f" WHERE {_IN_RANGE})) AS s"
                " ON o.step = s.step AND o.rank = s.rank AND o.version = s.version"
            )
        else:
            candidates = (
                "SELECT p.step AS step, p.rank AS rank, p.local_rank AS local_rank,"
                " p.value AS value, o.delta AS delta, o.z AS z, o.robust_z AS robust_z FROM"
                f" (SELECT step, rank, delta, z, robust_z FROM {scores} FINAL WHERE {_IN_RANGE}"
                " AND (abs(z) >= {z:Float64} OR abs(robust_z) >= {rz:Float64})) AS o"
                f" INNER JOIN (SELECT step, rank, local_rank, value FROM {points} FINAL"
                f" WHERE {_IN_RANGE}) AS p ON o.step = p.step AND o.rank = p.rank"
            )
        bound = {"sid": series_id, "lo": lo, "hi": hi, "z": params.z,
                   "rz": ROBUST_Z_THRESHOLD, "limit": params.outlier_limit}  # fmt: skip
        return [
            (int(s), int(r), None if lr < 0 else int(lr), v, mean, d, z, rz)
            for s, r, lr, v, mean, d, z, rz in engine.rows(
                "SELECT o.step, o.rank, o.local_rank, o.value, st.mean, o.delta, o.z,"
                f" o.robust_z FROM (SELECT * FROM ({candidates})"
                " ORDER BY abs(robust_z) DESC, abs(z) DESC, step, rank LIMIT {limit:UInt32}) AS o"
                f" INNER JOIN (SELECT step, mean FROM {engine.table('step_stats')} FINAL"
                f" WHERE {_IN_RANGE}) AS st ON o.step = st.step"
                " ORDER BY abs(o.robust_z) DESC, abs(o.z) DESC, o.step, o.rank",
                bound,
            )
        ]

    def first_nonfinite(self, series_id: int, lo: int, hi: int) -> dict[int, tuple[int, float]]:
        return first_nonfinite(self._engine, series_id, lo, hi)

    def _columns(
        self, sql: str, params: dict[str, Any], names: tuple[str, ...]
    ) -> dict[str, np.ndarray]:
        with self._engine.guarded() as client:
            result = client.query(sql, parameters=params).result_columns
        if not result:
            result = [[] for _ in names]
        return {
            name: np.asarray(column, dtype=_INTS.get(name, np.float64))
            for name, column in zip(names, result, strict=True)
        }

    def _singles(self, series_id: int, pieces: covers.Pieces) -> covers.Rows:
        """The pieces' single steps' points, scored, as rows of one step (with ``b``)."""
        listed = pieces.singles()
        if not len(listed["step"]):
            rows = covers.of_points({name: np.empty(0) for name in _SCORED})
            rows["b"] = np.empty(0, dtype=np.int64)
            return rows
        engine = self._engine
        found = engine.query_np(
            "SELECT p.step, p.rank, p.value, p.local_rank, s.delta, s.z, s.robust_z FROM"
            f" (SELECT step, rank, value, local_rank FROM {engine.table('rank_points')} FINAL"
            " WHERE series_id = {sid:UInt64} AND step IN {steps:Array(Int64)}) AS p"
            f" LEFT JOIN (SELECT step, rank, delta, z, robust_z FROM {engine.table('scores')}"
            " FINAL WHERE series_id = {sid:UInt64} AND step IN {steps:Array(Int64)}) AS s"
            " ON p.step = s.step AND p.rank = s.rank",
            {"sid": series_id, "steps": listed["step"].tolist()},
        )
        columns = {name: np.asarray(found[name]) if len(found) else np.empty(0) for name in _SCORED}
        rows = covers.of_points(columns)
        rows["b"] = listed["b"][
            np.searchsorted(listed["step"], columns["step"].astype(np.int64))
        ].astype(np.int64)
        return rows
