"""Metric points and their per-step aggregates in DuckDB.

Rank points have no primary key (its index cost a quarter of every ingest and most of the
memory). A point is unique by construction instead, which only works because one process
owns the file: the store knows each (series, rank)'s newest committed step, so a point
beyond it is new (nearly all of them) and one at or before it may rewrite an existing
point, whose old row is deleted in the same unit before the new one goes in.

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

from collections.abc import Callable, Sequence
from itertools import repeat
from typing import TYPE_CHECKING, Any

import numpy as np

from ...rankmath import covers as block_math
from ...rankmath.params import ROBUST_Z_THRESHOLD
from ...rankmath.rows import SummaryRows
from ...rankmath.step_stats import REFERENCE_STEPS, robust_spread, step_stats
from ..records import ScalarPoint, latest_points, step_number
from . import aggregates, block_tables, summary
from .engine import Engine

if TYPE_CHECKING:
    from ...rankmath.params import SummaryParams

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

REFRESH_CHUNK = 4096  # stale steps recomputed per unit of background work
BLOCK_CHUNK = 4096  # stale level-1 blocks rebuilt per unit of background work
READ_STALE_BLOCKS = 256  # a summary reads up to this many stale level-1 blocks' points
FRESH_MIN_POINTS = 64  # a unit writing fewer points of a series leaves its new steps stale
TAIL_POINTS = 1 << 18  # points of open steps kept in memory (the oldest tails dropped past it)
_POINT_NAMES = ("series_id", "step", "rank", "world_size", "local_rank", "value", "weight", "ts")
_TAIL_NAMES = _POINT_NAMES[1:]


def _float_scalar_steps(con: Any) -> None:
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


class _Staged:
    def __init__(self) -> None:
        self.rank: dict[int, list[dict[str, np.ndarray]]] = {}
        self.scalars: dict[tuple[int, int | float], ScalarPoint] = {}
        self.refresh: set[int] = set()
        self.maintain: tuple[int, list[int]] | None = None
        self.maintain_blocks: dict[int, list[int]] | None = None
        # Each staged series' open step's points after this unit (None: it has none).
        self.tails: dict[int, dict[str, np.ndarray] | None] = {}
        self.rescored: list[tuple[int, int]] = []  # (series, step) scored again whole
        # Steps scored while staging: (series, steps, n, mad), for the spreads remembered.
        self.spreads: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []
        # Filled by flush, for committed():
        self.frames: list[dict[str, np.ndarray]] = []
        self.last_step: dict[int, int] = {}
        self.stale: dict[int, set[int]] = {}
        self.refreshed: dict[int, set[int]] = {}
        self.dirty: dict[int, set[int]] = {}  # level-1 blocks newly stale
        self.rebuilt: dict[int, set[int]] = {}


class DuckDBPoints:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        con = engine.con
        _float_scalar_steps(con)
        con.execute(SCHEMA)
        block_tables.create(engine)
        self._stale: dict[int, set[int]] = {}
        self._floors: dict[tuple[int, int], int] = {}  # (series, steps): a window's first
        for sid, step in con.execute("SELECT DISTINCT series_id, step FROM stale_steps").fetchall():
            self._stale.setdefault(sid, set()).add(step)
        # Level-1 blocks behind their points (blocks.py), by series.
        self._dirty: dict[int, set[int]] = {}
        for sid, start in con.execute(
            "SELECT DISTINCT series_id, start FROM stale_blocks"
        ).fetchall():
            self._dirty.setdefault(sid, set()).add(start)
        # Each rank series' newest step, and each of its ranks' (see the module docstring).
        self._rank_last: dict[int, np.ndarray] = {}
        newest = con.execute(
            "SELECT series_id, rank, max(step) AS step FROM rank_points GROUP BY series_id, rank"
        ).fetchnumpy()
        aggregates.raise_rank_last(
            self._rank_last, newest["series_id"], newest["rank"], newest["step"]
        )
        self._last_step = {sid: int(steps.max()) for sid, steps in self._rank_last.items()}
        # Each series' open step, by its points (``_TAIL_NAMES``): its newest step when that
        # was scored whole in the last unit that wrote the series and has fewer points than
        # its world size.
        self._tails: dict[int, dict[str, np.ndarray]] = {}
        # Per series: the last scored steps with 2 finite values or more, and their robust
        # spreads (a new step's reference spread is taken over them), loaded on first use.
        self._spreads: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._tail_points = 0  # the points the tails hold, at most TAIL_POINTS
        self._staged = _Staged()
        engine.join(self)

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
        if self._stale:
            sid, steps = next(iter(self._stale.items()))
            self._staged.maintain = (sid, sorted(steps)[:REFRESH_CHUNK])
            return True
        if self._dirty:  # of every series at once, up to a chunk
            chosen: dict[int, list[int]] = {}
            room = BLOCK_CHUNK
            for sid, starts in self._dirty.items():
                chosen[sid] = sorted(starts)[:room]
                room -= len(chosen[sid])
                if room <= 0:
                    break
            self._staged.maintain_blocks = chosen
            return sum(map(len, self._dirty.values())) > BLOCK_CHUNK - room
        return False

    def backlog(self) -> int:
        """Background work waiting: stale steps, and stale level-1 blocks (a block's
        rebuild costs about what one step's recompute does)."""
        steps = sum(len(s) for s in self._stale.values())
        return steps + sum(len(s) for s in self._dirty.values())

    def needs_refresh(self, series_id: int) -> bool:
        # A summary reads the points of stale blocks itself (summary.py); past a few it
        # costs less to have the writer rebuild them first.
        dirty = self._dirty.get(series_id, ())
        return bool(self._stale.get(series_id)) or len(dirty) > READ_STALE_BLOCKS

    # ---- reads ----

    def rank_points(self, series_id: int) -> list[tuple[int, int, float, float, int | None, int]]:
        rows = (
            self._engine.cursor()
            .execute(
                "SELECT step, rank, value, weight, local_rank, world_size FROM rank_points"
                " WHERE series_id = ? ORDER BY step, rank",
                [series_id],
            )
            .fetchall()
        )
        return [tuple(row) for row in rows]

    def scalar_points(self, series_id: int) -> list[tuple[float, float]]:
        rows = (
            self._engine.cursor()
            .execute(
                "SELECT step, value FROM scalar_points WHERE series_id = ? ORDER BY step",
                [series_id],
            )
            .fetchall()
        )
        return [(step_number(s), float(v)) for s, v in rows]

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

    def summary_rows(
        self, series_id: int, params: SummaryParams, pause: Callable[[], None] | None = None
    ) -> SummaryRows:
        return summary.rows(self._engine.cursor(), series_id, params, pause or summary.go_on)

    def window_medians(
        self, series_id: int, window: int, step_max: int | None = None
    ) -> tuple[tuple[int, int] | None, dict[int, tuple[float, int]]]:
        if step_max is not None:  # a zoom's window: no floor guessed or kept
            return summary.window_medians(self._engine.cursor(), series_id, window, None, step_max)
        span, medians = summary.window_medians(
            self._engine.cursor(), series_id, window, self._floors.get((series_id, window))
        )
        self._remember_floor(series_id, window, None if span is None else span[0])
        return span, medians

    def window_points(self, series_id: int, steps: int) -> dict[str, np.ndarray]:
        columns = summary.window_points(
            self._engine.cursor(), series_id, steps, self._floors.get((series_id, steps))
        )
        first = int(columns["step"][0]) if len(columns["step"]) else None
        self._remember_floor(series_id, steps, first)
        return columns

    def next_step(self, series_id: int, after: int | None) -> int | None:
        return summary.next_step(self._engine.cursor(), series_id, after)

    def last_steps_of(
        self, series_id: int, ranks: list[int], before: int | None = None
    ) -> dict[int, int]:
        return summary.last_steps_of(self._engine.cursor(), series_id, ranks, before)

    def first_nonfinite(
        self, series_id: int, lo: int = 0, hi: int = 2**63 - 1
    ) -> dict[int, tuple[int, float]]:
        return summary.first_nonfinite(self._engine.cursor(), series_id, lo, hi)

    def _remember_floor(self, series_id: int, steps: int, first: int | None) -> None:
        """The first of a series' last ``steps`` steps, as the next look's guess: a window's
        first step only rises as steps arrive, so the next look reads the step rows from
        there, not the whole run's."""
        if first is None:
            return
        if len(self._floors) >= 65_536:  # many series looked at: start again
            self._floors.clear()
        self._floors[(series_id, steps)] = first

    # ---- the unit ----

    def begin(self) -> None:
        self._staged = _Staged()

    def flush(self) -> None:
        staged = self._staged
        if staged.rank:
            self._flush_rank(staged)
        if staged.scalars:
            self._flush_scalars(list(staged.scalars.values()))
        todo = {
            sid: self._stale.get(sid, set()) | staged.stale.get(sid, set())
            for sid in staged.refresh
        }
        if staged.maintain is not None:
            chosen, chunk = staged.maintain
            todo[chosen] = todo.get(chosen, set()) | set(chunk)
        for sid, stale in todo.items():
            if stale:
                ranges = aggregates.recompute(self._engine, sid, sorted(stale))
                self._spreads.pop(sid, None)  # read again from the rows just written
                known = self._stale.get(sid, set()) | staged.stale.get(sid, set())
                staged.refreshed[sid] = {
                    s for s in known if any(lo <= s <= hi for lo, hi in ranges)
                } | stale
                rescored = np.concatenate(
                    [np.arange(lo, hi + 1, dtype=np.int64) for lo, hi in ranges]
                )
                self._mark_blocks(
                    {"series_id": np.full(len(rescored), sid, dtype=np.int32), "step": rescored},
                    staged,
                )
        dirty = {
            sid: self._dirty.get(sid, set()) | staged.dirty.get(sid, set())
            for sid in staged.refresh
        }
        for sid, chunk in (staged.maintain_blocks or {}).items():
            dirty[sid] = dirty.get(sid, set()) | set(chunk)
        dirty = {sid: starts for sid, starts in dirty.items() if starts}
        if dirty:
            last = {sid: max(self._last_step.get(sid, -1), staged.last_step.get(sid, -1))
                    for sid in dirty}  # fmt: skip
            block_tables.recompute(self._engine, {sid: sorted(s) for sid, s in dirty.items()}, last)
            staged.rebuilt.update(dirty)

    def committed(self) -> None:
        staged = self._staged
        for sid, steps in staged.stale.items():
            self._stale.setdefault(sid, set()).update(steps)
        for sid, last in staged.last_step.items():
            self._last_step[sid] = max(self._last_step.get(sid, -1), last)
        for frame in staged.frames:
            aggregates.raise_rank_last(
                self._rank_last, frame["series_id"], frame["rank"], frame["step"]
            )
        for sid, new_steps, n, mad in staged.spreads:
            self._remember_spreads(sid, new_steps, n, mad)
        for sid, steps in staged.refreshed.items():
            remaining = self._stale.get(sid, set()) - steps
            if remaining:
                self._stale[sid] = remaining
            else:
                self._stale.pop(sid, None)
        for sid, starts in staged.dirty.items():
            self._dirty.setdefault(sid, set()).update(starts)
        for sid, starts in staged.rebuilt.items():
            left = self._dirty.get(sid, set()) - starts
            if left:
                self._dirty[sid] = left
            else:
                self._dirty.pop(sid, None)
        for sid, tail in staged.tails.items():
            kept = self._tails.pop(sid, None)  # a kept tail moves to the end: the newest
            if kept is not None:
                self._tail_points -= len(kept["step"])
            if tail is not None:
                self._tails[sid] = tail
                self._tail_points += len(tail["step"])
        while self._tail_points > TAIL_POINTS:
            self._tail_points -= len(self._tails.pop(next(iter(self._tails)))["step"])
        self._staged = _Staged()

    def rolled_back(self) -> None:
        self._staged = _Staged()

    def _remember_spreads(
        self, sid: int, steps: np.ndarray, n: np.ndarray, mad: np.ndarray
    ) -> None:
        """Keep the last scored steps' spreads (those with 2 finite values or more) of a
        series whose spreads are in memory, with these steps' over any older score."""
        known = self._spreads.get(sid)
        if known is None:
            return
        old_steps, old = known
        kept = ~np.isin(old_steps, steps)
        qualifies = n >= 2
        all_steps = np.concatenate([old_steps[kept], steps[qualifies]])
        spreads = np.concatenate([old[kept], robust_spread(n[qualifies], mad[qualifies])])
        order = np.argsort(all_steps, kind="stable")[-(REFERENCE_STEPS - 1) :]
        self._spreads[sid] = (all_steps[order], spreads[order])
        if len(self._spreads) > 65_536:  # many series written: start again
            self._spreads.clear()

    def _flush_rank(self, staged: _Staged) -> None:
        engine = self._engine
        frames: list[dict[str, np.ndarray]] = []
        stats: list[dict[str, np.ndarray]] = []
        rewrites: list[tuple[int, int, int]] = []
        for sid, chunks in staged.rank.items():
            points = latest_points(chunks)
            frames.append(self._stage(sid, points, stats, rewrites, staged))
        if rewrites:
            self._delete(rewrites)
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
        with engine.frame("rank_batch", frame) as (source, params):
            engine.con.execute(
                "INSERT INTO rank_points (series_id, step, rank, world_size, local_rank, value,"
                " weight, ts, delta, z, robust_z) SELECT series_id, step, rank, world_size,"
                " nullif(local_rank, -1), value, weight, ts,"
                " CASE WHEN isnan(delta) THEN NULL ELSE delta END,"
                " CASE WHEN isnan(z) THEN NULL ELSE z END,"
                f" CASE WHEN isnan(robust_z) THEN NULL ELSE robust_z END FROM {source}",
                params,
            )
        self._insert_outliers(frame)
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
                engine.con.execute(
                    f"INSERT INTO stale_steps SELECT series_id, step FROM {source}", params
                )

    def _insert_outliers(self, frame: dict[str, np.ndarray]) -> None:
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
        with self._engine.frame("outliers", rows) as (source, params):
            self._engine.con.execute(
                "INSERT INTO outlier_rows SELECT series_id, step, rank, nullif(local_rank, -1),"
                f" value, delta, z, robust_z FROM {source}",
                params,
            )

    def _mark_blocks(self, frame: dict[str, np.ndarray], staged: _Staged) -> None:
        """Mark stale the level-1 blocks these points are in (those not stale already),
        and the one that held the series' newest step when these points take it past that
        block's end: the blocks left unbuilt while incomplete are among its ancestors
        (``block_tables.recompute``)."""
        sids, steps = frame["series_id"], frame["step"]
        new: dict[int, set[int]] = {}
        for sid in np.unique(sids).tolist():
            mine = steps[sids == sid]
            starts = set(block_math.level_one(mine).tolist())
            before = self._last_step.get(sid, -1)
            if before >= 0 and int(mine.max()) // block_math.BASE > before // block_math.BASE:
                starts.add(before // block_math.BASE * block_math.BASE)
            starts -= self._dirty.get(sid, set()) | staged.dirty.get(sid, set())
            if starts:
                new[sid] = starts
                staged.dirty.setdefault(sid, set()).update(starts)
        if not new:
            return
        rows = {
            "series_id": np.concatenate(
                [np.full(len(s), sid, dtype=np.int32) for sid, s in new.items()]
            ),
            "start": np.concatenate(
                [np.fromiter(s, dtype=np.int64, count=len(s)) for s in new.values()]
            ),
        }
        with self._engine.frame("stale_block_batch", rows) as (source, params):
            self._engine.con.execute(
                f"INSERT INTO stale_blocks SELECT series_id, start FROM {source}", params
            )

    def _stage(
        self,
        sid: int,
        points: dict[str, np.ndarray],
        stats: list[dict[str, np.ndarray]],
        rewrites: list[tuple[int, int, int]],
        staged: _Staged,
    ) -> dict[str, np.ndarray]:
        """One series' points, ready to insert: steps newer than any the series has get
        their reducers and scores now (from these points, the latest write of each rank),
        and so does its open step, with its tail's points (written again); older steps are
        marked stale. Points that may exist already are noted to delete."""
        last = self._last_step.get(sid, -1)
        batch = len(points["step"]) >= FRESH_MIN_POINTS
        tail = self._tails.get(sid) if batch else None
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
        # ranks arrive: they go stale, for the idle-time refresh (1.8 ms of a 6.4 ms write
        # otherwise, measured).
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
        top = max(self._last_step.get(sid, -1), int(steps.max()))
        staged.last_step[sid] = top
        staged.tails[sid] = _open_step(points, fresh, top)
        known = self._rank_last.get(sid)
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
        known = self._spreads.get(sid)
        if known is None:
            known = self._spreads[sid] = aggregates.spread_history(self._engine, sid, None)
        steps, spreads = known
        earlier = steps < before
        if earlier.all() or len(steps) < REFERENCE_STEPS - 1:
            return spreads[earlier]
        return aggregates.spread_history(self._engine, sid, before)[1]

    def _delete(self, points: list[tuple[int, int, int]]) -> None:
        """Delete these (series, step, rank) points where they exist: a rewrite's old row."""
        sids, steps, ranks = (np.array(c, dtype=np.int64) for c in zip(*points))
        frame: dict[str, np.ndarray] = {
            "series_id": sids.astype(np.int32),
            "step": steps,
            "rank": ranks.astype(np.int16),
        }
        with self._engine.frame("rewrites", frame) as (source, params):
            # The ranges let zone maps skip the row groups no rewrite can be in.
            self._engine.con.execute(
                f"DELETE FROM rank_points USING {source} WHERE"
                " rank_points.series_id = rewrites.series_id AND rank_points.step = rewrites.step"
                " AND rank_points.rank = rewrites.rank"
                " AND rank_points.series_id BETWEEN ? AND ? AND rank_points.step BETWEEN ? AND ?",
                [*params, int(sids.min()), int(sids.max()), int(steps.min()), int(steps.max())],
            )

    def _flush_scalars(self, points: list[ScalarPoint]) -> None:
        columns: dict[str, tuple[list[Any], Any]] = {
            "series_id": ([p.series_id for p in points], np.int32),
            "step": ([p.step for p in points], np.float64),
            "value": ([p.value for p in points], np.float64),
            "ts": ([p.ts for p in points], np.float64),
            "preview": ([p.preview for p in points], np.bool_),
        }
        with self._engine.rows("scalar_batch", columns) as (source, params):
            self._engine.con.execute(
                "INSERT OR REPLACE INTO scalar_points"
                f" SELECT series_id, step, value, ts, preview FROM {source}",
                params,
            )


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
