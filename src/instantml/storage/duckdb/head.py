"""The DuckDB point store's head: what it knows in memory about the points it owns.

Rank points have no primary key (its index cost a quarter of every ingest and most of the
memory). A point is unique by construction instead, which only works because one process
owns the file: the head knows each (series, rank)'s newest committed step, so a point
beyond it is new (nearly all of them) and one at or before it may rewrite an existing
point, whose old row the store deletes in the same unit before the new one goes in.

Beside it: the stale steps and stale level-1 blocks waiting for the compaction work
(``stale_steps`` and ``stale_blocks`` on disk, the truth, with the blocks of the stale
steps, which need no row of their own; here, their index), each
series' open step (its *tail*: the points of a step a batch ended inside, scored again
whole when the rest arrives), the robust spreads a new step's reference spread is taken
over, and the first step of each health window looked at (a guess that saves reads).

Everything here but the stale sets and the newest steps is a cache: a head rebuilt from
disk (:meth:`Head.load`, at every start) has none of it and answers the same. A unit's
changes are collected in a :class:`Staged` and applied by :meth:`Head.commit` only after
the unit commits, so a rolled-back unit leaves the head as it was.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from ...rankmath.covers import BASE
from ...rankmath.step_stats import REFERENCE_STEPS, robust_spread
from ..records import ScalarPoint

TAIL_POINTS = 1 << 18  # points of open steps kept in memory (the oldest tails dropped past it)
CACHED_SERIES = 65_536  # spreads or window floors of more series than this: start again


class Staged:
    """One unit's writes, and what they change in the head once the unit commits."""

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
        # Filled by the store's flush, for Head.commit:
        self.frames: list[dict[str, np.ndarray]] = []
        self.last_step: dict[int, int] = {}
        self.stale: dict[int, set[int]] = {}
        self.refreshed: dict[int, set[int]] = {}
        self.dirty: dict[int, set[int]] = {}  # level-1 blocks newly stale
        self.rebuilt: dict[int, set[int]] = {}
        self.forgotten: set[int] = set()  # series deleted in this unit


class Head:
    def __init__(self) -> None:
        self.stale: dict[int, set[int]] = {}  # stale steps, by series
        self.dirty: dict[int, set[int]] = {}  # level-1 blocks behind their points, by series
        self.rank_last: dict[int, np.ndarray] = {}  # per series, each rank's newest step
        self.last_step: dict[int, int] = {}  # per series, its newest step
        # Each series' open step, by its points: its newest step when that was scored
        # whole in the last unit that wrote the series and has fewer points than its
        # world size.
        self.tails: dict[int, dict[str, np.ndarray]] = {}
        self.tail_points = 0  # the points the tails hold, at most TAIL_POINTS
        # Per series: the last scored steps with 2 finite values or more, and their robust
        # spreads (a new step's reference spread is taken over them), loaded on first use.
        self.spreads: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.floors: dict[tuple[int, int], int] = {}  # (series, steps): a window's first

    @classmethod
    def load(cls, con: Any) -> Head:
        """The head of the points on disk: their stale sets and newest steps."""
        head = cls()
        for sid, step in con.execute("SELECT DISTINCT series_id, step FROM stale_steps").fetchall():
            head.stale.setdefault(sid, set()).add(step)
        for sid, start in con.execute(
            "SELECT DISTINCT series_id, start FROM stale_blocks"
        ).fetchall():
            head.dirty.setdefault(sid, set()).add(start)
        for sid, steps in head.stale.items():  # stale by a step's row, not one of their own
            head.dirty.setdefault(sid, set()).update(implied_blocks(steps))
        newest = con.execute(
            "SELECT series_id, rank, max(step) AS step FROM rank_points GROUP BY series_id, rank"
        ).fetchnumpy()
        raise_rank_last(head.rank_last, newest["series_id"], newest["rank"], newest["step"])
        head.last_step = {sid: int(steps.max()) for sid, steps in head.rank_last.items()}
        return head

    def backlog(self) -> int:
        """Compaction work waiting: stale steps, and stale level-1 blocks (a block's
        rebuild costs about what one step's recompute does)."""
        steps = sum(len(s) for s in self.stale.values())
        return steps + sum(len(s) for s in self.dirty.values())

    def newest_by_rank(self, sid: int) -> np.ndarray | None:
        """Each rank's newest step in the series (-1 for a rank with none); None when the
        series has no points."""
        return self.rank_last.get(sid)

    def commit(self, staged: Staged) -> None:
        """Apply a committed unit's changes."""
        for sid, steps in staged.stale.items():
            self.stale.setdefault(sid, set()).update(steps)
        for sid, last in staged.last_step.items():
            self.last_step[sid] = max(self.last_step.get(sid, -1), last)
        for frame in staged.frames:
            raise_rank_last(self.rank_last, frame["series_id"], frame["rank"], frame["step"])
        for sid, new_steps, n, mad in staged.spreads:
            self._remember_spreads(sid, new_steps, n, mad)
        _forget(self.stale, staged.refreshed)
        for sid, starts in staged.dirty.items():
            self.dirty.setdefault(sid, set()).update(starts)
        _forget(self.dirty, staged.rebuilt)
        for sid, tail in staged.tails.items():
            kept = self.tails.pop(sid, None)  # a kept tail moves to the end: the newest
            if kept is not None:
                self.tail_points -= len(kept["step"])
            if tail is not None:
                self.tails[sid] = tail
                self.tail_points += len(tail["step"])
        while self.tail_points > TAIL_POINTS:
            self.tail_points -= len(self.tails.pop(next(iter(self.tails)))["step"])
        for sid in staged.forgotten:
            self._forget_series(sid)

    def _forget_series(self, sid: int) -> None:
        """A deleted series: no background work, no memory of it."""
        for index in (self.stale, self.dirty, self.rank_last, self.last_step, self.spreads):
            index.pop(sid, None)
        tail = self.tails.pop(sid, None)
        if tail is not None:
            self.tail_points -= len(tail["step"])
        for slot in [slot for slot in self.floors if slot[0] == sid]:
            del self.floors[slot]

    def remember_floor(self, series_id: int, steps: int, first: int | None) -> None:
        """The first of a series' last ``steps`` steps, as the next look's guess: a window's
        first step only rises as steps arrive, so the next look reads the step rows from
        there, not the whole run's."""
        if first is None:
            return
        if len(self.floors) >= CACHED_SERIES:
            self.floors.clear()
        self.floors[(series_id, steps)] = first

    def _remember_spreads(
        self, sid: int, steps: np.ndarray, n: np.ndarray, mad: np.ndarray
    ) -> None:
        """Keep the last scored steps' spreads (those with 2 finite values or more) of a
        series whose spreads are in memory, with these steps' over any older score."""
        known = self.spreads.get(sid)
        if known is None:
            return
        old_steps, old = known
        kept = ~np.isin(old_steps, steps)
        qualifies = n >= 2
        all_steps = np.concatenate([old_steps[kept], steps[qualifies]])
        spreads = np.concatenate([old[kept], robust_spread(n[qualifies], mad[qualifies])])
        order = np.argsort(all_steps, kind="stable")[-(REFERENCE_STEPS - 1) :]
        self.spreads[sid] = (all_steps[order], spreads[order])
        if len(self.spreads) > CACHED_SERIES:
            self.spreads.clear()


def implied_blocks(steps: Iterable[int]) -> set[int]:
    """The level-1 blocks that hold these stale steps: stale too, whether or not
    ``stale_blocks`` lists them (a unit that leaves a step stale lists its block only
    when scoring the step again)."""
    return {step // BASE * BASE for step in steps}


def _forget(sets: dict[int, set[int]], done: dict[int, set[int]]) -> None:
    """Take these series' done members out of their sets (a set left empty goes)."""
    for sid, members in done.items():
        left = sets.get(sid, set()) - members
        if left:
            sets[sid] = left
        else:
            sets.pop(sid, None)


def raise_rank_last(
    rank_last: dict[int, np.ndarray], sids: np.ndarray, ranks: np.ndarray, steps: np.ndarray
) -> None:
    """Raise each (series, rank)'s newest step to the given points' where they are newer."""
    if not len(sids):
        return
    order = np.lexsort((ranks, sids))
    sids, ranks, steps = sids[order], ranks[order].astype(np.int64), steps[order]
    starts = np.flatnonzero(np.r_[True, sids[1:] != sids[:-1]])
    for start, end in zip(starts, np.r_[starts[1:], len(sids)], strict=True):
        sid = int(sids[start])
        r, s = ranks[start:end], steps[start:end].astype(np.int64)
        known = rank_last.get(sid)
        size = int(r.max()) + 1
        if known is None or len(known) < size:
            grown = np.full(max(size, 0 if known is None else len(known)), -1, dtype=np.int64)
            if known is not None:
                grown[: len(known)] = known
            known = rank_last[sid] = grown
        np.maximum.at(known, r, s)
