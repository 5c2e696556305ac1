"""Metric points and their per-step aggregates in ClickHouse, for any number of writers.

No process can know whether another wrote other ranks of a step, so every step a unit
writes is marked stale, and its reducers and scores are recomputed from all its points
(``FINAL``) by :func:`instantml.summary.step_stats.step_stats`, the one implementation:
before a summary reads the series, or in the background. A refresh stamps what it writes
with the time it *read* the points: a step written again after that read stays stale, and
of two refreshes the one that read later wins, whichever finishes last.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ...summary.step_stats import step_stats
from .. import blocks as block_math
from ..records import ScalarPoint, SummaryRows, latest_points, step_number
from . import blocks, summary
from .engine import ChEngine

if TYPE_CHECKING:
    from ...summary import SummaryParams

REFRESH_CHUNK = 4096
_POINT_COLUMNS = ("step", "rank", "world_size", "local_rank", "value", "weight", "ts")
_STATS = ("n", "expected", "mean", "weighted_mean", "min", "max", "std", "p05", "p50",
          "p95", "mad", "mean_ad", "nonfinite")  # fmt: skip


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
        _copy_int_scalars(engine)
        # Points written before blocks existed: every step stale once, so its blocks are
        # built by the refresh (a cheap check: count() of a MergeTree is metadata).
        ((blocks_kept,),) = engine.rows(f"SELECT count() FROM {engine.table('rank_blocks')}")
        if not blocks_kept:  # (their outlier rows come with the refresh)
            with engine.guarded() as client:
                client.command(
                    f"INSERT INTO {engine.table('stale_steps')} SELECT DISTINCT series_id,"
                    f" step, 1, {engine.version()} FROM {engine.table('rank_points')}"
                )

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

    def needs_refresh(self, series_id: int) -> bool:
        return bool(self._stale_steps(series_id, limit=1))

    # ---- reads ----

    def rank_points(self, series_id: int) -> list[tuple[int, int, float, float, int | None, int]]:
        rows = self._engine.rows(
            "SELECT step, rank, value, weight, local_rank, world_size FROM"
            f" {self._engine.table('rank_points')} FINAL WHERE series_id = {{sid:UInt64}}"
            " ORDER BY step, rank",
            {"sid": series_id},
        )
        return [(s, r, v, w, None if lr < 0 else lr, ws) for s, r, v, w, lr, ws in rows]

    def scalar_points(self, series_id: int) -> list[tuple[float, float]]:
        rows = self._engine.rows(
            f"SELECT step, value FROM {self._engine.table('scalars')} FINAL"
            " WHERE series_id = {sid:UInt64} ORDER BY step",
            {"sid": series_id},
        )
        return [(step_number(s), float(v)) for s, v in rows]

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

    def summary_rows(self, series_id: int, params: SummaryParams) -> SummaryRows:
        return summary.rows(self._engine, series_id, params)

    def window_medians(
        self, series_id: int, window: int
    ) -> tuple[tuple[int, int] | None, dict[int, tuple[float, int]]]:
        return summary.window_medians(self._engine, series_id, window)

    def window_points(self, series_id: int, steps: int) -> dict[str, np.ndarray]:
        return summary.window_points(self._engine, series_id, steps)

    # ---- the unit ----

    def begin(self) -> _Staged:
        return _Staged()

    def flush(self, staged: _Staged) -> None:
        if staged.rank:
            staged.marked = self._flush_rank(staged.rank)
        if staged.scalars:
            self._flush_scalars(list(staged.scalars.values()))
        for sid in staged.refresh:
            while self._refresh_chunk(sid, self._stale_steps(sid, REFRESH_CHUNK)):
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
        stale = self._engine.rows(
            f"SELECT series_id, step FROM {self._engine.table('stale_steps')} FINAL"
            f" WHERE stale = 1 LIMIT {REFRESH_CHUNK}"
        )
        by_series: dict[int, list[int]] = {}
        for sid, step in stale:
            by_series.setdefault(int(sid), []).append(int(step))
        for sid, chunk in by_series.items():
            self._refresh_chunk(sid, chunk)
        if len(stale) < REFRESH_CHUNK:
            self._backlog = 0  # every stale step is done, not only the ones marked here

    def committed(self, staged: _Staged) -> None:
        self._backlog += staged.marked

    def _stale_steps(self, series_id: int, limit: int) -> list[int]:
        rows = self._engine.rows(
            f"SELECT step FROM {self._engine.table('stale_steps')} FINAL"
            " WHERE series_id = {sid:UInt64} AND stale = 1 ORDER BY step LIMIT {n:UInt32}",
            {"sid": series_id, "n": limit},
        )
        return [int(step) for (step,) in rows]

    def _refresh_chunk(self, sid: int, steps: list[int]) -> bool:
        """Recompute these steps of one series from all their points; True if any."""
        if not steps:
            return False
        engine = self._engine
        read_at = engine.version()  # before the read: anything written later stays stale
        # Whole level-1 blocks: their rows are rebuilt from all their points.
        points = engine.query_np(
            "SELECT step, rank, value, weight, world_size, local_rank FROM"
            f" {engine.table('rank_points')} FINAL WHERE series_id = {{sid:UInt64}}"
            " AND step IN {steps:Array(Int64)}",
            {"sid": sid, "steps": blocks.level_one_steps(steps)},
        )
        done = np.array(steps, dtype=np.int64)
        if len(points):
            rows, delta, z, robust = step_stats(
                points["step"].astype(np.int64), points["value"].astype(np.float64),
                points["weight"].astype(np.float64), points["world_size"].astype(np.int64),
            )  # fmt: skip
            n = len(rows["step"])
            engine.insert(
                "step_stats",
                {
                    "series_id": np.full(n, sid, dtype=np.uint64),
                    "step": rows["step"],
                    **{k: rows[k] for k in _STATS},
                    "version": np.full(n, read_at, dtype=np.uint64),
                },
            )
            engine.insert(
                "scores",
                {
                    "series_id": np.full(len(delta), sid, dtype=np.uint64),
                    "step": points["step"].astype(np.int64),
                    "rank": points["rank"].astype(np.int16),
                    "delta": delta,
                    "z": z,
                    "robust_z": robust,
                    "version": np.full(len(delta), read_at, dtype=np.uint64),
                },
            )
            scored = {
                "step": points["step"], "rank": points["rank"], "value": points["value"],
                "delta": delta, "z": z, "robust_z": robust, "local_rank": points["local_rank"],
            }  # fmt: skip
            rows = block_math.of_points(scored)
            blocks.rebuild(engine, sid, rows, read_at)
            chosen = np.flatnonzero(rows["outliers"] > 0)
            if len(chosen):
                engine.insert(
                    "outlier_rows",
                    {
                        "series_id": np.full(len(chosen), sid, dtype=np.uint64),
                        **{
                            name: np.asarray(scored[name])[chosen]
                            for name in (
                                "step",
                                "rank",
                                "local_rank",
                                "value",
                                "delta",
                                "z",
                                "robust_z",
                            )
                        },
                        "version": np.full(len(chosen), read_at, dtype=np.uint64),
                    },
                )
        engine.insert(
            "stale_steps",
            {
                "series_id": np.full(len(done), sid, dtype=np.uint64),
                "step": done,
                "stale": np.zeros(len(done), dtype=np.uint8),
                "version": np.full(len(done), read_at, dtype=np.uint64),
            },
        )
        self._backlog = max(0, self._backlog - len(done))
        return True


def _copy_int_scalars(engine: ChEngine) -> None:
    """Scalar points of an earlier version (Int64 steps, ``scalar_points``) into the
    Float64 table, once: when that table exists and this one is empty."""
    ((old,),) = engine.rows(
        "SELECT count() FROM system.tables WHERE database = {db:String} AND name = 'scalar_points'",
        {"db": engine.database},
    )
    if not old or engine.rows(f"SELECT count() FROM {engine.table('scalars')}")[0][0]:
        return
    with engine.guarded() as client:
        client.command(
            f"INSERT INTO {engine.table('scalars')} SELECT series_id, toFloat64(step), value, ts,"
            f" preview, version FROM {engine.table('scalar_points')}"
        )


def _concat(frames: list[dict[str, Any]]) -> dict[str, Any]:
    if len(frames) == 1:
        return frames[0]
    return {name: np.concatenate([f[name] for f in frames]) for name in frames[0]}
