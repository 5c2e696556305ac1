"""Metric points and their per-step aggregates in ClickHouse, for any number of writers.

No process can know whether another wrote other ranks of a step, so every step a unit
writes is marked stale, and its reducers and scores are recomputed from all its points
(``FINAL``) by :func:`instantml.rankmath.step_stats.step_stats`, the one implementation:
before a summary reads the series, or in the background. A refresh stamps what it writes
with the time it *read* the points: a step written again after that read stays stale, and
of two refreshes the one that read later wins, whichever finishes last.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ...rankmath import covers as block_math
from ...rankmath.rows import SummaryRows
from ...rankmath.step_stats import REFERENCE_STEPS, reach, robust_spread, step_stats
from .. import querier
from ..records import ScalarPoint, latest_points, step_number
from . import block_tables, migrations, windows
from .engine import TABLES, ChEngine
from .summary_tables import ClickHouseSummaryTables

if TYPE_CHECKING:
    from ...rankmath.params import SummaryParams

REFRESH_CHUNK = 4096
_POINT_COLUMNS = ("step", "rank", "world_size", "local_rank", "value", "weight", "ts")
_STATS = ("n", "expected", "mean", "weighted_mean", "min", "max", "std", "p05", "p50",
          "p95", "mad", "mean_ad", "nonfinite")  # fmt: skip
_SCORES = ("step", "rank", "delta", "z", "robust_z")
_OUTLIER = ("step", "rank", "local_rank", "value", "delta", "z", "robust_z")


@dataclass
class _Staged:
    rank: dict[int, list[dict[str, np.ndarray]]] = field(default_factory=dict)
    scalars: dict[tuple[int, int | float], ScalarPoint] = field(default_factory=dict)
    refresh: set[int] = field(default_factory=set)
    maintain: bool = False
    marked: int = 0


class ChPoints:
    def __init__(self, engine: ChEngine) -> None:
        self._engine = engine
        self._backlog = 0  # stale steps this process marked and has not seen refreshed
        engine.join(self)
        migrations.upgrade_points(engine)

    # ---- writes, in a unit ----

    def write_rank(self, series_id: int, columns: dict[str, np.ndarray]) -> None:
        self._engine.staged(self).rank.setdefault(series_id, []).append(columns)

    def write_scalars(self, points: list[ScalarPoint]) -> None:
        staged: _Staged = self._engine.staged(self)
        for point in points:
            staged.scalars[(point.series_id, point.step)] = point

    def refresh(self, series_id: int) -> None:
        self._engine.staged(self).refresh.add(series_id)

    def maintain(self) -> bool:
        self._engine.staged(self).maintain = True
        return self._backlog > REFRESH_CHUNK

    def backlog(self) -> int:
        return self._backlog

    def forget(self, series_ids: Sequence[int]) -> None:
        pass  # nothing of a series is kept in this process

    def purge(self, series_ids: Sequence[int], budget: int) -> bool:
        # Lightweight deletes, one statement per table: rows are masked at once and leave
        # the disk as ClickHouse merges their parts (no mutation rewrites them here).
        engine = self._engine
        ids = {"ids": [int(sid) for sid in series_ids]}
        for name in TABLES:
            engine.command(
                f"DELETE FROM {engine.local(name)} WHERE series_id IN {{ids:Array(UInt64)}}", ids
            )
        return False

    def needs_refresh(self, series_id: int) -> bool:
        return bool(self._stale([series_id], limit=1))

    # ---- reads ----

    def counts(self, series_ids: Sequence[int]) -> dict[int, tuple[int, int | float | None]]:
        if not series_ids:
            return {}
        out: dict[int, tuple[int, int | float | None]] = {}
        for table in ("rank_points", "scalars"):
            for sid, n, last in self._engine.rows(
                f"SELECT series_id, count(), max(step) FROM {self._engine.table(table)} FINAL"
                " WHERE series_id IN {ids:Array(UInt64)} GROUP BY series_id",
                {"ids": list(series_ids)},
            ):
                out[int(sid)] = (int(n), step_number(last))
        return out

    def summary_reading(self, series_id: int, params: SummaryParams) -> querier.Reading:
        return querier.read(ClickHouseSummaryTables(self._engine), series_id, params)

    def summary_rows(self, series_id: int, params: SummaryParams) -> SummaryRows:
        return querier.drive(self.summary_reading(series_id, params))

    def window_medians(
        self, series_id: int, window: int, step_max: int | None = None
    ) -> tuple[tuple[int, int] | None, dict[int, tuple[float, int]]]:
        return windows.window_medians(self._engine, series_id, window, step_max)

    def window_points(self, series_id: int, steps: int) -> dict[str, np.ndarray]:
        return windows.window_points(self._engine, series_id, steps)

    def next_step(self, series_id: int, after: int | None) -> int | None:
        return windows.next_step(self._engine, series_id, after)

    def last_steps_of(
        self, series_id: int, ranks: list[int], before: int | None = None
    ) -> dict[int, int]:
        return windows.last_steps_of(self._engine, series_id, ranks, before)

    def first_nonfinite(
        self, series_id: int, lo: int = 0, hi: int = 2**63 - 1
    ) -> dict[int, tuple[int, float]]:
        return windows.first_nonfinite(self._engine, series_id, lo, hi)

    # ---- the unit ----

    def begin(self) -> _Staged:
        return _Staged()

    def flush(self, staged: _Staged) -> None:
        if staged.rank:
            staged.marked = self._flush_rank(staged.rank)
        if staged.scalars:
            self._flush_scalars(list(staged.scalars.values()))
        if staged.refresh:
            while self._refresh(self._stale(sorted(staged.refresh), REFRESH_CHUNK)):
                pass
        if staged.maintain:
            self._maintain()

    def _flush_rank(self, rank: dict[int, list[dict[str, np.ndarray]]]) -> int:
        """Insert the unit's rank points (each a version above the last) and mark their
        steps stale; how many steps were marked."""
        engine = self._engine
        version = engine.version()
        frames, marks = [], []
        for sid, chunks in rank.items():
            points = latest_points(chunks)
            n = len(points["step"])
            frame = {"series_id": np.full(n, sid, dtype=np.uint64)}
            frame.update({k: points[k] for k in _POINT_COLUMNS})
            frame["version"] = version + points["seq"].astype(np.uint64)
            frames.append(frame)
            steps = np.unique(points["step"])
            marks.append((np.full(len(steps), sid, dtype=np.uint64), steps))
        engine.insert("rank_points", _concat(frames))
        sids = np.concatenate([m[0] for m in marks])
        steps = np.concatenate([m[1] for m in marks])
        engine.insert(
            "stale_steps",
            {
                "series_id": sids,
                "step": steps,
                "stale": np.ones(len(steps), dtype=np.uint8),
                "version": np.full(len(steps), engine.version(), dtype=np.uint64),
            },
        )
        return len(steps)

    def _flush_scalars(self, points: list[ScalarPoint]) -> None:
        self._engine.insert(
            "scalars",
            {
                "series_id": np.array([p.series_id for p in points], dtype=np.uint64),
                "step": np.array([p.step for p in points], dtype=np.float64),
                "value": np.array([p.value for p in points], dtype=np.float64),
                "ts": np.array([p.ts for p in points], dtype=np.float64),
                "preview": np.array([p.preview for p in points], dtype=np.uint8),
                "version": np.full(len(points), self._engine.version(), dtype=np.uint64),
            },
        )

    def _maintain(self) -> None:
        """Refresh a chunk of stale steps, whichever process marked them."""
        stale = self._stale(None, REFRESH_CHUNK)
        self._refresh(stale)
        if sum(len(steps) for steps in stale.values()) < REFRESH_CHUNK:
            self._backlog = 0  # every stale step is done, not only the ones marked here

    def committed(self, staged: _Staged) -> None:
        self._backlog += staged.marked

    def _stale(self, series_ids: Sequence[int] | None, limit: int) -> dict[int, list[int]]:
        """Up to ``limit`` stale steps (of these series, or of any), by series."""
        where = "" if series_ids is None else " AND series_id IN {ids:Array(UInt64)}"
        rows = self._engine.rows(
            f"SELECT series_id, step FROM {self._engine.table('stale_steps')} FINAL"
            f" WHERE stale = 1{where} ORDER BY series_id, step LIMIT {{n:UInt32}}",
            {"n": limit, **({} if series_ids is None else {"ids": list(series_ids)})},
        )
        by_series: dict[int, list[int]] = {}
        for sid, step in rows:
            by_series.setdefault(int(sid), []).append(int(step))
        return by_series

    def _ranges(self, chunks: dict[int, list[int]]) -> dict[int, list[np.ndarray]]:
        """Per series, the steps to score again for these stale ones, by range
        (``step_stats.reach``): one read for every series."""
        sids = list(chunks)
        rows = _columns(self._engine.rows(
            f"SELECT series_id, step FROM {self._engine.table('step_stats')} FINAL"
            " WHERE series_id IN {sids:Array(UInt64)} AND n >= 2 AND step >"
            " arrayElement({los:Array(Int64)}, indexOf({sids:Array(UInt64)}, series_id))"
            " ORDER BY series_id, step",
            {"sids": sids, "los": [chunks[sid][0] for sid in sids]},
        ), ("series_id", "step"))  # fmt: skip
        of = rows["series_id"].astype(np.int64)
        out = {}
        for sid, steps in chunks.items():
            later = rows["step"][of == sid].astype(np.int64)
            out[sid] = _steps_of(reach(steps, later), steps, later)
        return out

    def _histories(self, befores: dict[int, int]) -> dict[int, np.ndarray]:
        """Per series, the robust spreads of its last scored steps before its ``befores``
        step with 2 finite values or more, oldest first: one read for every series."""
        sids = list(befores)
        rows = _columns(self._engine.rows(
            "SELECT series_id, step, n, mad FROM"
            f" {self._engine.table('step_stats')} FINAL WHERE series_id IN {{sids:Array(UInt64)}}"
            " AND n >= 2 AND step <"
            " arrayElement({befores:Array(Int64)}, indexOf({sids:Array(UInt64)}, series_id))"
            " ORDER BY series_id, step DESC LIMIT {k:UInt32} BY series_id",
            {"sids": sids, "befores": [befores[sid] for sid in sids], "k": REFERENCE_STEPS - 1},
        ), ("series_id", "step", "n", "mad"))  # fmt: skip
        of = rows["series_id"].astype(np.int64)
        out = {}
        for sid in sids:
            mine = of == sid
            n = rows["n"][mine].astype(np.int64)[::-1]
            out[sid] = robust_spread(n, rows["mad"][mine].astype(np.float64)[::-1])
        return out

    def _history(self, sid: int, before: int, fresh: dict[int, float | None]) -> np.ndarray:
        """The robust spreads of the series' last scored steps before ``before`` with 2
        finite values or more, oldest first: a step's reference spread is taken over them.
        ``fresh``: steps scored again in this refresh, not yet written (None: fewer than 2
        finite values now), over the stored ones."""
        k = REFERENCE_STEPS - 1
        rows = self._engine.rows(
            f"SELECT step, n, mad FROM {self._engine.table('step_stats')} FINAL"
            " WHERE series_id = {sid:UInt64} AND step < {before:Int64} AND n >= 2"
            " ORDER BY step DESC LIMIT {k:UInt32}",
            {"sid": sid, "before": before, "k": k + len(fresh)},
        )
        spreads: dict[int, float | None] = {
            int(step): float(robust_spread(np.array([n]), np.array([mad]))[0])
            for step, n, mad in rows
        }
        spreads.update({step: v for step, v in fresh.items() if step < before})
        kept = sorted((step, v) for step, v in spreads.items() if v is not None)[-k:]
        return np.array([v for _, v in kept], dtype=np.float64)

    def _refresh(self, chunks: dict[int, list[int]]) -> bool:
        """Recompute these steps of these series from all their points; True if any. One
        read of the points and one insert a table for every series together: a unit that
        wrote 150 keys costs the round trips (and the parts) that one key does."""
        chunks = {sid: steps for sid, steps in chunks.items() if steps}
        if not chunks:
            return False
        engine = self._engine
        read_at = engine.version()  # before the read: anything written later stays stale
        # Whole level-1 blocks: their rows are rebuilt from all their points. And the steps
        # whose reference spread takes a changed step's in, each range with its history.
        ranges = self._ranges(chunks)
        histories = self._histories({sid: int(parts[0].min()) for sid, parts in ranges.items()})
        wanted = {sid: np.concatenate(parts) for sid, parts in ranges.items()}
        found = engine.query_np(
            "SELECT series_id, step, rank, value, weight, world_size, local_rank FROM"
            f" {engine.table('rank_points')} FINAL WHERE series_id IN {{sids:Array(UInt64)}}"
            " AND step IN {steps:Array(Int64)}",
            {"sids": list(wanted), "steps": sorted(set().union(*map(set, wanted.values())))},
        )
        of_series = found["series_id"].astype(np.int64)
        stats, scores, outliers = [], [], []
        block_rows: dict[int, block_math.Rows] = {}
        for sid, parts in ranges.items():
            mine = found[of_series == sid]
            fresh: dict[int, float | None] = {}
            for part in parts:
                points = mine[np.isin(mine["step"], part)]
                if not len(points):
                    continue
                history = (  # a later range's history holds the earlier ones' new spreads
                    self._history(sid, int(part.min()), fresh) if fresh else histories[sid]
                )
                rows, delta, z, robust = step_stats(
                    points["step"].astype(np.int64), points["value"].astype(np.float64),
                    points["weight"].astype(np.float64), points["world_size"].astype(np.int64),
                    history,
                )  # fmt: skip
                stats.append(
                    {"series_id": sid, "step": rows["step"], **{k: rows[k] for k in _STATS}}
                )
                spread = robust_spread(rows["n"], rows["mad"])
                fresh.update(
                    (int(step), float(v) if n >= 2 else None)
                    for step, n, v in zip(rows["step"], rows["n"], spread, strict=True)
                )
                scored = {
                    "step": points["step"].astype(np.int64),
                    "rank": points["rank"].astype(np.int16),
                    "value": points["value"], "delta": delta, "z": z, "robust_z": robust,
                    "local_rank": points["local_rank"],
                }  # fmt: skip
                scores.append({"series_id": sid, **{k: scored[k] for k in _SCORES}})
                rows_of = block_math.of_points(scored)
                block_rows[sid] = (
                    rows_of if sid not in block_rows else _concat([block_rows[sid], rows_of])
                )
                chosen = np.flatnonzero(rows_of["outliers"] > 0)
                if len(chosen):
                    outliers.append(
                        {"series_id": sid, **{k: np.asarray(scored[k])[chosen] for k in _OUTLIER}}
                    )
        engine.insert_series("step_stats", stats, read_at)
        engine.insert_series("scores", scores, read_at)
        step_rows: dict[int, list[dict[str, Any]]] = {}
        for of_sid in stats:
            step_rows.setdefault(cast(int, of_sid["series_id"]), []).append(
                {k: v for k, v in of_sid.items() if k != "series_id"}
            )
        settled = block_tables.rebuild(
            engine,
            block_rows,
            {sid: _concat(parts) for sid, parts in step_rows.items()},
            read_at,
        )
        engine.insert_series("outlier_rows", outliers, read_at)
        if settled:  # else the steps stay stale: their blocks' ancestors may be behind
            done = [
                {"series_id": sid, "step": np.array(steps, dtype=np.int64),
                 "stale": np.zeros(len(steps), dtype=np.uint8)}
                for sid, steps in chunks.items()
            ]  # fmt: skip
            engine.insert_series("stale_steps", done, read_at)
        self._backlog = max(0, self._backlog - sum(len(steps) for steps in chunks.values()))
        return True


def _steps_of(
    ranges: list[tuple[int, int]], stale: list[int], later: np.ndarray
) -> list[np.ndarray]:
    """Per range: the steps to score again, in whole level-1 blocks (a block's rows are
    rebuilt from all its points): the stale ones, and the scored ones with 2 finite values
    or more within it. Ranges whose blocks meet are one."""
    parts: list[np.ndarray] = []
    stale_arr = np.asarray(stale, dtype=np.int64)
    for lo, hi in ranges:
        own = stale_arr[(stale_arr >= lo) & (stale_arr <= hi)]
        ahead = later[(later >= lo) & (later <= hi)]
        steps = np.asarray(block_tables.level_one_steps(np.union1d(own, ahead).tolist()), np.int64)
        if parts and steps.min() <= parts[-1].max() + 1:
            parts[-1] = np.union1d(parts[-1], steps)
        else:
            parts.append(steps)
    return parts


def _columns(rows: list[tuple[Any, ...]], names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Rows as numpy columns (none when there are no rows)."""
    if not rows:
        return {name: np.empty(0) for name in names}
    return {name: np.array(column) for name, column in zip(names, zip(*rows), strict=True)}


def _concat(frames: list[dict[str, Any]]) -> dict[str, Any]:
    if len(frames) == 1:
        return frames[0]
    return {name: np.concatenate([f[name] for f in frames]) for name in frames[0]}
