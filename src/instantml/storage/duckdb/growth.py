"""What a unit adds to its runs and to the month's usage, as rows appended to one table.

Every unit that writes points grows its run (the points it holds, its last step, perhaps
its world size, when it was last written) and charges its org's month. Written where they
are kept (an ``UPDATE`` of the run's row and a usage row), that is two statements in every
unit, and DuckDB's fixed cost a statement is a large share of a small unit. Here a unit
appends one row to ``run_growth`` that carries both (one row a run, the charge on the
first), and every ``FOLD_ROWS`` rows a unit folds the table into ``runs`` and
``usage_log`` and empties it.

Nothing is in memory but a count of the rows: reads see ``runs_now`` (the runs with their
rows not yet folded added, in the same snapshot), a usage miss sums both tables, and a
crash leaves committed rows to be folded by a later unit, with no recovery to run (a
clean close folds them). A row is appended only for a run that exists (``INSERT ...
SELECT ... FROM runs``), so a run deleted while being written fails the unit as the
``UPDATE`` it replaces did.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import duckdb

from ..records import StorageError
from .engine import Engine

log = logging.getLogger(__name__)
# Rows kept before a unit folds them: a fold costs a few statements, amortised over this
# many units, and a read of ``runs_now`` aggregates at most this many rows.
FOLD_ROWS = 128

SCHEMA = """
CREATE TABLE run_growth (
    org_id INTEGER, month VARCHAR, charged BIGINT NOT NULL, run_seq INTEGER,
    world_size INTEGER NOT NULL, last_step BIGINT NOT NULL, points BIGINT NOT NULL,
    updated_at DOUBLE NOT NULL);
CREATE VIEW runs_now AS SELECT r.* REPLACE (
    CASE WHEN g.size > 0 THEN greatest(coalesce(r.world_size, 0), g.size)
        ELSE r.world_size END AS world_size,
    CASE WHEN g.last >= 0 THEN greatest(coalesce(r.last_step, -1), g.last)
        ELSE r.last_step END AS last_step,
    CASE WHEN g.run_seq IS NULL THEN r.points ELSE coalesce(r.points, 0) + g.n END AS points,
    CASE WHEN g.run_seq IS NULL THEN r.updated_at ELSE greatest(r.updated_at, g.at) END
        AS updated_at)
FROM runs r LEFT JOIN (
    SELECT run_seq, max(world_size) AS size, max(last_step) AS last, sum(points) AS n,
        max(updated_at) AS at
    FROM run_growth WHERE run_seq IS NOT NULL GROUP BY run_seq) g ON g.run_seq = r.run_seq
"""
VIEW = "runs_now"

# The usual unit: one run, its org's charge on its row; nothing appended if the run is gone.
_ONE = (
    "INSERT INTO run_growth SELECT ?, ?, ?::BIGINT, run_seq, ?::INTEGER, ?::BIGINT, ?::BIGINT,"
    " ?::DOUBLE FROM runs WHERE run_seq = ?"
)
# Any other: a row a run, and the charges (on the first run's row when there is one org's
# month, on rows of their own, with no run, otherwise), as lists (a few rows; NULLs).
_TYPES = {
    "org_id": "INTEGER", "month": "VARCHAR", "charged": "BIGINT", "run_seq": "INTEGER",
    "world_size": "INTEGER", "last_step": "BIGINT", "points": "BIGINT", "updated_at": "DOUBLE",
}  # fmt: skip
_MANY = (
    "INSERT INTO run_growth SELECT * FROM (SELECT "
    + ", ".join(f"unnest(?::{t}[]) AS {n}" for n, t in _TYPES.items())
    + ") WHERE run_seq IS NULL OR run_seq IN (SELECT run_seq FROM runs)"
)
_FOLD = (
    "UPDATE runs SET"
    " world_size = CASE WHEN g.size > 0 THEN greatest(coalesce(world_size, 0), g.size)"
    " ELSE world_size END,"
    " last_step = CASE WHEN g.last >= 0 THEN greatest(coalesce(last_step, -1), g.last)"
    " ELSE last_step END,"
    " points = coalesce(points, 0) + g.n, updated_at = greatest(updated_at, g.at)"
    " FROM (SELECT run_seq AS seq, max(world_size) AS size, max(last_step) AS last,"
    " sum(points) AS n, max(updated_at) AS at FROM run_growth WHERE run_seq IS NOT NULL"
    " GROUP BY run_seq) AS g WHERE runs.run_seq = g.seq",
    "INSERT INTO usage_log SELECT org_id, month, sum(charged) FROM run_growth"
    " WHERE org_id IS NOT NULL AND charged > 0 GROUP BY org_id, month",
    "DELETE FROM run_growth",
)


@dataclass
class _Staged:
    charges: dict[tuple[int, str], int] = field(default_factory=dict)
    runs: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # seq -> size, last, n
    written: int = 0  # rows appended by this unit
    folded: bool = False


class RunGrowth:
    """A unit participant: join it after every store that stages into it (they hand it
    their rows before their own flush ends)."""

    view = VIEW

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._rows = int(engine.run("SELECT count(*) FROM run_growth").fetchall()[0][0])
        # A run found gone when its row is appended (the runs store clears its caches).
        self.on_missing: Callable[[set[int]], None] = _missing
        # A file closed cleanly holds its runs' extents in ``runs`` alone.
        engine.closing.append(self._fold_all)

    def _staging(self) -> _Staged:
        staged: _Staged = self._engine.staged(self)
        return staged

    def charge(self, org_id: int, month: str, points: int) -> None:
        """*In a unit*: ``points`` more used by the org this month."""
        if not points:
            return
        charges = self._staging().charges
        charges[(org_id, month)] = charges.get((org_id, month), 0) + points

    def grow(self, runs: Mapping[int, tuple[int, int, int]]) -> None:
        """*In a unit*: each run's (world size, last step, points added); 0 and -1: not grown."""
        staged = self._staging().runs
        for seq, (size, last, n) in runs.items():
            old_size, old_last, old_n = staged.get(seq, (0, -1, 0))
            staged[seq] = (max(old_size, size), max(old_last, last), old_n + n)

    def write(self) -> None:
        """*In a unit*: append what is staged now (a read in the unit then sees it)."""
        staged = self._staging()
        charges, runs = staged.charges, staged.runs
        if not charges and not runs:
            return
        staged.charges, staged.runs = {}, {}
        now = time.time()
        if len(charges) == 1 and len(runs) == 1:  # nearly every unit
            ((org, month), charged), *_ = charges.items()
            (seq, (size, last, n)), *_ = runs.items()
            if not self._engine.changed(_ONE, [org, month, charged, size, last, n, now, seq]):
                self.on_missing({seq})
            staged.written += 1
            return
        rows = _rows(list(charges.items()), runs, now)
        written = self._engine.changed(_MANY, rows)
        if written < len(rows[0]):
            found = self._engine.execute(
                "SELECT run_seq FROM runs WHERE run_seq = ANY(%s::INTEGER[])", [list(runs)]
            )
            self.on_missing(set(runs) - {int(seq) for (seq,) in found})
        staged.written += written

    def fold(self) -> None:
        """*In a unit*: every row into ``runs`` and ``usage_log``; the table emptied."""
        self.write()
        for statement in _FOLD:
            self._engine.run(statement)
        self._staging().folded = True

    def _fold_all(self) -> None:
        if not self._rows:
            return
        try:
            with self._engine.unit():
                self.fold()
        except (duckdb.Error, StorageError) as exc:  # the rows stay, read through the view
            log.warning("run growth not folded at close: %s", exc)

    # ---- the unit ----

    def begin(self) -> _Staged:
        return _Staged()

    def flush(self, staged: _Staged) -> None:
        self.write()
        if self._rows + staged.written >= FOLD_ROWS:
            self.fold()

    def committed(self, staged: _Staged) -> None:
        self._rows = 0 if staged.folded else self._rows + staged.written


def _rows(
    charges: list[tuple[tuple[int, str], int]],
    runs: Mapping[int, tuple[int, int, int]],
    now: float,
) -> list[list[object]]:
    """_MANY's columns."""
    on_run = len(charges) == 1 and bool(runs)
    rows: list[tuple[object, ...]] = []
    for i, (seq, grown) in enumerate(runs.items()):
        (org, month), charged = charges[0] if on_run and i == 0 else ((None, None), 0)
        rows.append((org, month, charged, seq, *grown, now))
    if not on_run:
        rows += [(org, month, n, None, 0, -1, 0, now) for (org, month), n in charges]
    return [list(column) for column in zip(*rows, strict=True)]


def _missing(seqs: set[int]) -> None:
    raise StorageError(f"run(s) {sorted(seqs)} were deleted while being written; retry")
