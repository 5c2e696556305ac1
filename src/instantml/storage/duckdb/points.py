"""Metric points and their per-step aggregates in DuckDB.

Rank points have no primary key: a point is unique by construction, from what the store's
head (:mod:`.head`) knows of each (series, rank)'s newest step; a point at or before it
may rewrite an existing point, whose old row is deleted in the same unit before the new
one goes in.

Aggregates: a step whose points all arrive in one unit (a batch), newer than any its series
has, gets its reducers and each point's scores computed while staging; any other point
(single requests among them) marks its (series, step) stale, and stale steps are recomputed (``refresh``, ``maintain``) from
all their points. Both use :func:`instantml.rankmath.step_stats.step_stats`, the one
implementation of the definitions.

A batch that ends inside a step (an uploader's batch of N events splits a step's ranks
wherever N falls) leaves that step open: the store keeps its points in memory (the
series' *tail*), and the next batch that brings more of the step scores it again whole,
from the tail and its own points, in its own unit: the step's row and outlier rows are
replaced and the tail's rows written again with their new scores. No step goes stale for
it, so no background recompute, and no summary waits for one. Without a tail (after a
restart, past ``TAIL_POINTS``, after a single request) such a step goes stale as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from typing import TYPE_CHECKING

import numpy as np

from ...rankmath import covers as block_math
from ...rankmath.rows import SummaryRows
from ...rankmath.step_stats import REFERENCE_STEPS, step_stats
from .. import querier
from ..records import ScalarPoint, latest_points, step_number
from . import aggregates, block_tables, point_tables, purge, windows
from .engine import Engine
from .head import Head, Staged, implied_blocks
from .summary_tables import DuckDBSummaryTables

if TYPE_CHECKING:
    from ...rankmath.params import SummaryParams

REFRESH_CHUNK = 4096  # stale steps recomputed per unit of background work
BLOCK_CHUNK = 4096  # stale level-1 blocks rebuilt per unit of background work
READ_STALE_BLOCKS = 256  # a summary reads up to this many stale level-1 blocks' points
FRESH_MIN_POINTS = 64  # a unit writing fewer points of a series leaves its new steps stale
_POINT_NAMES = ("series_id", "step", "rank", "world_size", "local_rank", "value", "weight", "ts")
_TAIL_NAMES = _POINT_NAMES[1:]


class DuckDBPoints:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        con = engine.con
        point_tables.float_scalar_steps(con)
        con.execute(point_tables.SCHEMA)
        block_tables.create(engine)
        self._head = Head.load(con)
        engine.join(self)

    @property
    def _staged(self) -> Staged:
        """This thread's unit's staging (outside a unit: an empty one)."""
        staged: Staged = self._engine.staged(self)
        return staged

    # ---- writes, in a unit ----

    def write_rank(self, series_id: int, columns: dict[str, np.ndarray]) -> None:
        self._staged.rank.setdefault(series_id, []).append(columns)

    def write_scalars(self, points: list[ScalarPoint]) -> None:
        for point in points:
            self._staged.scalars[(point.series_id, point.step)] = point

    def refresh(self, series_id: int) -> None:
        self._staged.refresh.add(series_id)

    def maintain(self) -> bool:
        # Steps first: a block is rebuilt from its points' scores.
        if self._head.stale:
            sid, steps = next(iter(self._head.stale.items()))
            self._staged.maintain = (sid, sorted(steps)[:REFRESH_CHUNK])
            return True
        if self._head.dirty:  # of every series at once, up to a chunk
            chosen: dict[int, list[int]] = {}
            room = BLOCK_CHUNK
            for sid, starts in self._head.dirty.items():
                chosen[sid] = sorted(starts)[:room]
                room -= len(chosen[sid])
                if room <= 0:
                    break
            self._staged.maintain_blocks = chosen
            return sum(map(len, self._head.dirty.values())) > BLOCK_CHUNK - room
        return False

    def backlog(self) -> int:
        return self._head.backlog()

    def forget(self, series_ids: Sequence[int]) -> None:
        self._staged.forgotten.update(series_ids)

    def purge(self, series_ids: Sequence[int], budget: int) -> bool:
        return purge.purge(self._engine, series_ids, budget)

    def needs_refresh(self, series_id: int) -> bool:
        # A summary reads the points of stale blocks itself (summary_tables.py); past a few it
        # costs less to have the writer rebuild them first.
        dirty = self._head.dirty.get(series_id, ())
        return bool(self._head.stale.get(series_id)) or len(dirty) > READ_STALE_BLOCKS

    # ---- reads ----

    def counts(self, series_ids: Sequence[int]) -> dict[int, tuple[int, int | float | None]]:
        if not series_ids:
            return {}
        marks = ", ".join("?" * len(series_ids))
        rows = (
            self._engine.cursor()
            .execute(
                f"SELECT series_id, count(*), max(step) FROM rank_points WHERE series_id IN ({marks})"
                " GROUP BY series_id UNION ALL"
                f" SELECT series_id, count(*), max(step) FROM scalar_points"
                f" WHERE series_id IN ({marks}) GROUP BY series_id",
                [*series_ids, *series_ids],
            )
            .fetchall()
        )
        return {sid: (int(n), None if last is None else step_number(last)) for sid, n, last in rows}

    def summary_reading(self, series_id: int, params: SummaryParams) -> querier.Reading:
        return querier.read(DuckDBSummaryTables(self._engine.cursor()), series_id, params)

    def summary_rows(self, series_id: int, params: SummaryParams) -> SummaryRows:
        return querier.drive(self.summary_reading(series_id, params))

    def window_medians(
        self, series_id: int, window: int, step_max: int | None = None
    ) -> tuple[tuple[int, int] | None, dict[int, tuple[float, int]]]:
        if step_max is not None:  # a zoom's window: no floor guessed or kept
            return windows.window_medians(self._engine.cursor(), series_id, window, None, step_max)
        span, medians = windows.window_medians(
            self._engine.cursor(), series_id, window, self._head.floors.get((series_id, window))
        )
        self._head.remember_floor(series_id, window, None if span is None else span[0])
        return span, medians

    def window_points(self, series_id: int, steps: int) -> dict[str, np.ndarray]:
        columns = windows.window_points(
            self._engine.cursor(), series_id, steps, self._head.floors.get((series_id, steps))
        )
        first = int(columns["step"][0]) if len(columns["step"]) else None
        self._head.remember_floor(series_id, steps, first)
        return columns

    def next_step(self, series_id: int, after: int | None) -> int | None:
        return windows.next_step(self._engine.cursor(), series_id, after)

    def last_steps_of(
        self, series_id: int, ranks: list[int], before: int | None = None
    ) -> dict[int, int]:
        return windows.last_steps_of(self._engine.cursor(), series_id, ranks, before)

    def first_nonfinite(
        self, series_id: int, lo: int = 0, hi: int = 2**63 - 1
    ) -> dict[int, tuple[int, float]]:
        return windows.first_nonfinite(self._engine.cursor(), series_id, lo, hi)

    # ---- the unit ----

    def begin(self) -> Staged:
        return Staged()

    def flush(self, staged: Staged) -> None:
        if staged.rank:
            self._flush_rank(staged)
        if staged.scalars:
            point_tables.upsert_scalars(self._engine, list(staged.scalars.values()))
        todo = {
            sid: self._head.stale.get(sid, set()) | staged.stale.get(sid, set())
            for sid in staged.refresh
        }
        if staged.maintain is not None:
            chosen, chunk = staged.maintain
            todo[chosen] = todo.get(chosen, set()) | set(chunk)
        for sid, stale in todo.items():
            if stale:
                ranges, rescored = aggregates.recompute(self._engine, sid, sorted(stale))
                self._head.spreads.pop(sid, None)  # read again from the rows just written
                known = self._head.stale.get(sid, set()) | staged.stale.get(sid, set())
                staged.refreshed[sid] = {
                    s for s in known if any(lo <= s <= hi for lo, hi in ranges)
                } | stale
                self._mark_blocks(
                    {"series_id": np.full(len(rescored), sid, dtype=np.int32), "step": rescored},
                    staged,
                    listed=True,
                )
        dirty = {
            sid: self._head.dirty.get(sid, set()) | staged.dirty.get(sid, set())
            for sid in staged.refresh
        }
        for sid, chunk in (staged.maintain_blocks or {}).items():
            dirty[sid] = dirty.get(sid, set()) | set(chunk)
        dirty = {sid: starts for sid, starts in dirty.items() if starts}
        if dirty:
            last = {sid: max(self._head.last_step.get(sid, -1), staged.last_step.get(sid, -1))
                    for sid in dirty}  # fmt: skip
            block_tables.recompute(self._engine, {sid: sorted(s) for sid, s in dirty.items()}, last)
            staged.rebuilt.update(dirty)

    def committed(self, staged: Staged) -> None:
        self._head.commit(staged)

    def _flush_rank(self, staged: Staged) -> None:
        engine = self._engine
        frames: list[dict[str, np.ndarray]] = []
        stats: list[dict[str, np.ndarray]] = []
        rewrites: list[tuple[int, int, int]] = []
        for sid, chunks in staged.rank.items():
            points = latest_points(chunks)
            frames.append(self._stage(sid, points, stats, rewrites, staged))
        if rewrites:
            point_tables.delete_points(self._engine, rewrites)
        if staged.rescored:
            aggregates.unscore(
                self._engine,
                {
                    "series_id": np.array([sid for sid, _ in staged.rescored], dtype=np.int32),
                    "step": np.array([step for _, step in staged.rescored], dtype=np.int64),
                },
            )
        frame = {name: np.concatenate([f[name] for f in frames]) for name in frames[0]}
        staged.frames = [frame]
        point_tables.insert_points(engine, frame)
        point_tables.insert_outliers(self._engine, frame)
        self._mark_blocks(frame, staged)
        if stats:
            aggregates.insert_stats(
                self._engine, {n: np.concatenate([s[n] for s in stats]) for n in stats[0]}
            )
        if staged.stale:
            stale = {
                "series_id": np.concatenate(
                    [np.full(len(s), sid, dtype=np.int32) for sid, s in staged.stale.items()]
                ),
                "step": np.concatenate(
                    [np.fromiter(s, dtype=np.int64, count=len(s)) for s in staged.stale.values()]
                ),
            }
            with engine.frame("stale_batch", stale) as (source, params):
                engine.run(f"INSERT INTO stale_steps SELECT series_id, step FROM {source}", params)

    def _mark_blocks(
        self, frame: dict[str, np.ndarray], staged: Staged, listed: bool = False
    ) -> None:
        """Mark stale the level-1 blocks these points are in (those not stale already),
        and the one that held the series' newest step when these points take it past that
        block's end: the blocks left unbuilt while incomplete are among its ancestors
        (``block_tables.recompute``).

        A block that holds a step this unit leaves stale gets no row in ``stale_blocks``:
        it is stale by that step's row (``implied_blocks``), which saves single requests,
        whose points all go stale, a statement in every unit. When that step is scored
        again its block gets a row (``listed``: every block of these points gets one, a
        block stale until now by its steps alone among them)."""
        sids, steps = frame["series_id"], frame["step"]
        listed_now: dict[int, set[int]] = {}  # the rows to write
        for sid in np.unique(sids).tolist():
            mine = steps[sids == sid]
            starts = set(block_math.level_one(mine).tolist())
            before = self._head.last_step.get(sid, -1)
            if before >= 0 and int(mine.max()) // block_math.BASE > before // block_math.BASE:
                starts.add(before // block_math.BASE * block_math.BASE)
            fresh = starts - (self._head.dirty.get(sid, set()) | staged.dirty.get(sid, set()))
            if fresh:
                staged.dirty.setdefault(sid, set()).update(fresh)
            to_list = starts if listed else fresh - implied_blocks(staged.stale.get(sid, ()))
            if to_list:
                listed_now[sid] = to_list
        if not listed_now:
            return
        rows = {
            "series_id": np.concatenate(
                [np.full(len(s), sid, dtype=np.int32) for sid, s in listed_now.items()]
            ),
            "start": np.concatenate(
                [np.fromiter(s, dtype=np.int64, count=len(s)) for s in listed_now.values()]
            ),
        }
        with self._engine.frame("stale_block_batch", rows) as (source, params):
            self._engine.run(
                f"INSERT INTO stale_blocks SELECT series_id, start FROM {source}", params
            )

    def _stage(
        self,
        sid: int,
        points: dict[str, np.ndarray],
        stats: list[dict[str, np.ndarray]],
        rewrites: list[tuple[int, int, int]],
        staged: Staged,
    ) -> dict[str, np.ndarray]:
        """One series' points, ready to insert: steps newer than any the series has get
        their reducers and scores now (from these points, the latest write of each rank),
        and so does its open step, with its tail's points (written again); older steps are
        marked stale. Points that may exist already are noted to delete."""
        last = self._head.last_step.get(sid, -1)
        batch = len(points["step"]) >= FRESH_MIN_POINTS
        tail = self._head.tails.get(sid) if batch else None
        if tail is not None and int(tail["step"][0]) == last and (points["step"] == last).any():
            # More of the open step: its other ranks' stored points join these, to be
            # scored again whole and written again (their old rows deleted as rewrites).
            again = points["step"] == last
            others = ~np.isin(tail["rank"], points["rank"][again])
            points = {
                name: np.concatenate([points[name], tail[name][others]]) for name in _TAIL_NAMES
            }
            staged.rescored.append((sid, last))
            last -= 1  # the open step is new to this unit's scoring
        steps, ranks = points["step"], points["rank"]
        # Scoring now pays off for a batch, which holds whole steps. A few points (single
        # requests: one rank of a step each) would be scored again when the step's other
        # ranks arrive: they go stale, for the idle-time refresh, rather than cost every
        # single write a scoring pass.
        fresh = steps > last if batch else np.zeros(len(steps), bool)
        scores = np.full((3, len(steps)), np.nan)
        if fresh.any():
            step_rows, delta, z, robust = step_stats(
                steps[fresh], points["value"][fresh], points["weight"][fresh],
                points["world_size"][fresh], self._history(sid, int(steps[fresh].min())),
            )  # fmt: skip
            scores[:, fresh] = delta, z, robust
            step_rows["series_id"] = np.full(len(step_rows["step"]), sid, dtype=np.int32)
            stats.append(step_rows)
            staged.spreads.append((sid, step_rows["step"], step_rows["n"], step_rows["mad"]))
        if not fresh.all():
            staged.stale.setdefault(sid, set()).update(np.unique(steps[~fresh]).tolist())
        top = max(self._head.last_step.get(sid, -1), int(steps.max()))
        staged.last_step[sid] = top
        staged.tails[sid] = _open_step(points, fresh, top)
        known = self._head.newest_by_rank(sid)
        if known is not None:  # the series has points: any of these may rewrite one
            wide = ranks.astype(np.int64)
            missing = int(wide.max()) + 1 - len(known)
            newest = np.r_[known, np.full(missing, -1)] if missing > 0 else known
            old = np.flatnonzero(steps <= newest[wide])
            rewrites.extend(zip(repeat(sid), steps[old].tolist(), wide[old].tolist()))
        out = {name: points[name] for name in _POINT_NAMES[1:]}
        out["series_id"] = np.full(len(steps), sid, dtype=np.int32)
        out["delta"], out["z"], out["robust_z"] = scores
        return out

    def _history(self, sid: int, before: int) -> np.ndarray:
        """The robust spreads of the series' last scored steps before ``before`` that a
        step's reference spread is taken over (``aggregates.spread_history``), from memory
        when it holds them: new steps come after every one scored."""
        known = self._head.spreads.get(sid)
        if known is None:
            known = self._head.spreads[sid] = aggregates.spread_history(self._engine, sid, None)
        steps, spreads = known
        earlier = steps < before
        if earlier.all() or len(steps) < REFERENCE_STEPS - 1:
            return spreads[earlier]
        return aggregates.spread_history(self._engine, sid, before)[1]


def _open_step(
    points: dict[str, np.ndarray], fresh: np.ndarray, newest: int
) -> dict[str, np.ndarray] | None:
    """The points of the series' newest step when this unit scored it whole from them
    and it has fewer than its world size (more may come), else None."""
    steps = points["step"]
    mine = steps == newest
    if not mine.any() or not fresh[mine].all():
        return None
    if int(mine.sum()) >= int(points["world_size"][mine].max()):
        return None
    return {name: points[name][mine] for name in _TAIL_NAMES}
