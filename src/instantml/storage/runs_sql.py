"""Runs, their series, extents, attributes and ranks' activity, in SQL: one implementation
over DuckDB and PostgreSQL (the engine says how a statement runs and what text it can
hold; both take ``%s`` placeholders, lists as arrays, and ids from sequences named as
PostgreSQL names a serial column's).

Ids come from sequences, and a run's creation and a series' are ``INSERT ... ON
CONFLICT``, so two writers creating the same one agree on it. What this object remembers
are facts that never change once committed (a run id's number and project, a series' id,
a lower bound of a run's extent and of a rank's last sighting): caches, bounded, never
consulted for what might not exist yet, and taught only by committed units. A unit's
growth of its runs is an ``UPDATE`` of their rows, or, where the engine has a ``Growth``
(DuckDB: ``duckdb/growth.py``), a row appended there, read through its view.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from .records import (
    SEEN_RESOLUTION,
    RankActivity,
    RunConflict,
    RunRecord,
    RunRef,
    RunSpec,
    StorageError,
    run_record,
    run_values,
)
from .runs_statements import EXTEND, EXTEND_ONE, EXTEND_ONE_SAME_SIZE, SEE_RANKS
from .sql import SqlEngine

RUN_COLUMNS = (
    "org_id, run_id, project, name, status, config, tags, metadata, created_at, updated_at,"
    " world_size, last_step, points"
)
# Run refs and series ids never change once committed, so a process may remember them
# for ever; this bounds how many (a cache starts over when full).
CACHE_ENTRIES = 200_000


@dataclass
class _Staged:
    runs: dict[tuple[int, str], RunRef] = field(default_factory=dict)
    series: dict[tuple[int, int, str], int] = field(default_factory=dict)
    extents: dict[int, tuple[int, int]] = field(default_factory=dict)  # run -> (size, last)
    points: dict[int, int] = field(default_factory=dict)  # run -> points charged to it
    written_extents: dict[int, tuple[int, int]] = field(default_factory=dict)
    attributes: list[tuple[int, str | None, str | None, int | None, str, float]] = field(
        default_factory=list
    )
    seen: dict[tuple[int, int], tuple[float, float | None]] = field(default_factory=dict)
    nodes: dict[tuple[int, int], str] = field(default_factory=dict)  # (run, rank) -> node


class Growth(Protocol):
    """Where an engine keeps a unit's growth of its runs instead of ``UPDATE runs``
    (DuckDB's ``duckdb/growth.py``): reads see it in ``view``."""

    view: str
    on_missing: Callable[[set[int]], None]

    def grow(self, runs: Mapping[int, tuple[int, int, int]]) -> None: ...

    def write(self) -> None: ...


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


class SqlRuns:
    def __init__(self, engine: SqlEngine, growth: Growth | None = None) -> None:
        self._engine = engine
        self._growth = growth
        # Where a run's record is read (its extent with every committed unit's growth).
        self.read_from = "runs" if growth is None else growth.view
        if growth is not None:
            growth.on_missing = self._deleted_under
        self._runs: dict[tuple[int, str], RunRef] = {}
        self._series: dict[tuple[int, int, str], int] = {}
        # A run's (world size, last step) as stored at least: an extent no larger is not
        # written again.
        self._extent: dict[int, tuple[int, int]] = {}
        # Each (run, rank)'s last_seen as this process last wrote it: rewritten only when
        # older by SEEN_RESOLUTION (another writer's only make the stored one newer).
        self._seen: dict[tuple[int, int], float] = {}
        # Each (run, rank)'s node as this process last wrote it: written again when it moves.
        self._nodes: dict[tuple[int, int], str] = {}
        engine.join(self)

    def _staging(self) -> _Staged:
        staged: _Staged = self._engine.staged(self)
        return staged

    # ---- reads ----

    def get_run(self, org_id: int, run_id: str) -> RunRecord | None:
        if not self._engine.storable(run_id):
            return None
        rows = self._engine.read(
            f"SELECT {RUN_COLUMNS} FROM {self.read_from} WHERE org_id = %s AND run_id = %s",
            [org_id, run_id],
        )
        if not rows:
            return None
        record = run_record(rows[0])
        # Config written after creation (the public SDK's log_config) as config attributes.
        for path, value in self._engine.read(
            "SELECT a.path, a.value FROM attributes a JOIN runs r USING (run_seq)"
            " WHERE r.org_id = %s AND r.run_id = %s AND a.type = 'config'"
            " AND starts_with(a.path, 'config/') ORDER BY a.seq",
            [org_id, run_id],
        ):
            record.config[path.removeprefix("config/")] = orjson.loads(value)
        return record

    def list_runs(self, org_id: int, project: str | None, limit: int) -> list[RunRecord]:
        if not self._engine.storable(project):
            return []
        rows = self._engine.read(
            f"SELECT {RUN_COLUMNS} FROM {self.read_from} WHERE org_id = %s"
            " AND (CAST(%s AS TEXT) IS NULL OR project = %s)"
            " ORDER BY created_at DESC, run_seq DESC LIMIT %s",
            [org_id, project, project, limit],
        )
        return [run_record(row) for row in rows]

    def attributes_of(
        self, org_id: int, run_id: str, kinds: Sequence[str], prefix: str
    ) -> list[tuple[str, str, int | None, Any]]:
        if not self._engine.storable(run_id, prefix):
            return []
        rows = self._engine.read(
            "SELECT a.type, a.path, a.step, a.value FROM attributes a JOIN runs r USING (run_seq)"
            " WHERE r.org_id = %s AND r.run_id = %s AND a.type = ANY(%s::TEXT[])"
            " AND starts_with(a.path, %s) ORDER BY a.seq",
            [org_id, run_id, list(kinds), prefix],
        )
        return [(kind, path, step, orjson.loads(value)) for kind, path, step, value in rows]

    def rank_activity(self, org_id: int, run_id: str) -> dict[int, RankActivity]:
        if not self._engine.storable(run_id):
            return {}
        rows = self._engine.read(
            "SELECT k.rank, k.first_seen, k.last_seen, k.finished_at, k.node FROM run_ranks k"
            " JOIN runs r USING (run_seq) WHERE r.org_id = %s AND r.run_id = %s",
            [org_id, run_id],
        )
        return {int(r): RankActivity(float(a), float(b), c, n) for r, a, b, c, n in rows}

    def series(self, org_id: int, run_id: str) -> list[tuple[int, int, str]] | None:
        ref = self._ref(org_id, run_id)
        if ref is None:
            return None
        rows = self._engine.read(
            "SELECT series_id, kind, key FROM series WHERE run_seq = %s ORDER BY series_id",
            [ref.seq],
        )
        return [(int(sid), int(kind), key) for sid, kind, key in rows]

    def series_id(self, org_id: int, run_id: str, kind: int, key: str) -> int | None:
        ref = self._ref(org_id, run_id) if self._engine.storable(key) else None
        if ref is None:
            return None
        sid = self._series.get((ref.seq, kind, key))
        if sid is None:
            rows = self._engine.read(
                "SELECT series_id FROM series WHERE run_seq = %s AND kind = %s AND key = %s",
                [ref.seq, kind, key],
            )
            if not rows:
                return None
            sid = int(rows[0][0])
            if not self._engine.in_unit:
                _remember(self._series, {(ref.seq, kind, key): sid})
        return sid

    def _ref(self, org_id: int, run_id: str) -> RunRef | None:
        if not self._engine.storable(run_id):
            return None
        ref = self._runs.get((org_id, run_id))
        if ref is None:
            rows = self._engine.read(
                "SELECT run_seq, project FROM runs WHERE org_id = %s AND run_id = %s",
                [org_id, run_id],
            )
            if not rows:
                return None
            ref = RunRef(int(rows[0][0]), rows[0][1])
            if not self._engine.in_unit:  # a unit's own reads may not be committed yet
                _remember(self._runs, {(org_id, run_id): ref})
        return ref

    # ---- writes, in a unit ----

    def resolve(self, org_id: int, run_ids: Iterable[str]) -> dict[str, RunRef | None]:
        staged = self._staging().runs
        return {rid: staged.get((org_id, rid)) or self._ref(org_id, rid) for rid in run_ids}

    def create(self, spec: RunSpec) -> tuple[RunRecord, bool]:
        staged = self._staging()
        rows = self._engine.execute(
            "INSERT INTO runs (org_id, run_id, project, name, status, config, tags,"
            " metadata, created_at, updated_at) VALUES (%s, %s, %s, %s, 'running', %s, %s,"
            " %s, %s, %s) ON CONFLICT (org_id, run_id) DO NOTHING"
            f" RETURNING run_seq, {RUN_COLUMNS}",
            run_values(spec, time.time()),
        )
        created = bool(rows)
        if not created:
            self._flush_extents(staged, at_once=True)  # the record answered shows the unit's
            rows = self._engine.execute(
                f"SELECT run_seq, {RUN_COLUMNS} FROM {self.read_from}"
                " WHERE org_id = %s AND run_id = %s",
                [spec.org_id, spec.run_id],
            )
        record = run_record(rows[0][1:])
        if record.project != spec.project:
            raise RunConflict(spec.run_id, record.project)
        staged.runs[(spec.org_id, spec.run_id)] = RunRef(int(rows[0][0]), record.project)
        return record, created

    def set_status(self, run: RunRef, status: str) -> RunRecord:
        self._flush_extents(self._staging(), at_once=True)
        rows = self._engine.execute(
            f"UPDATE runs SET status = %s, updated_at = %s WHERE run_seq = %s"
            f" RETURNING {RUN_COLUMNS}",
            [status, time.time(), run.seq],
        )
        if not rows:
            self._deleted_under({run.seq})
        if self._growth is not None:  # with the growth not yet folded into the row
            rows = self._engine.execute(
                f"SELECT {RUN_COLUMNS} FROM {self.read_from} WHERE run_seq = %s", [run.seq]
            )
        return run_record(rows[0])

    def add_attributes(self, run: RunRef, attributes: list[dict[str, Any]], ts: float) -> None:
        staged = self._staging().attributes
        for attribute in attributes:
            step = attribute.get("step")
            staged.append(
                (
                    run.seq,
                    _text(attribute.get("path")),
                    _text(attribute.get("type")),
                    step if type(step) is int else None,
                    orjson.dumps(attribute.get("value")).decode(),
                    ts,
                )
            )

    def series_ids(self, run: RunRef, kind: int, keys: Sequence[str]) -> list[int]:
        staged = self._staging().series
        missing = [
            k for k in keys if (run.seq, kind, k) not in staged
            and (run.seq, kind, k) not in self._series
        ]  # fmt: skip
        if missing:
            self._engine.execute(
                "INSERT INTO series (run_seq, kind, key) SELECT %s, %s, unnest(%s::TEXT[])"
                " ON CONFLICT (run_seq, kind, key) DO NOTHING",
                [run.seq, kind, missing],
            )
            for sid, key in self._engine.execute(
                "SELECT series_id, key FROM series WHERE run_seq = %s AND kind = %s"
                " AND key = ANY(%s::TEXT[])",
                [run.seq, kind, missing],
            ):
                staged[(run.seq, kind, key)] = int(sid)
        return [staged.get((run.seq, kind, k)) or self._series[(run.seq, kind, k)] for k in keys]

    def extend(self, extents: Mapping[int, tuple[int, int]]) -> None:
        staged = self._staging().extents
        for seq, (size, last) in extents.items():
            old_size, old_last = staged.get(seq, (0, -1))
            staged[seq] = (max(old_size, size), max(old_last, last))

    def count_points(self, points: Mapping[int, int]) -> None:
        staged = self._staging().points
        for seq, n in points.items():
            staged[seq] = staged.get(seq, 0) + n

    def saw_ranks(
        self,
        ranks: Mapping[int, Iterable[int]],
        at: float,
        nodes: Mapping[int, Mapping[int, str]] | None = None,
    ) -> None:
        staging = self._staging()
        staged = staging.seen
        for seq, members in ranks.items():
            said = (nodes or {}).get(seq, {})
            for rank in members:
                slot = (seq, rank)
                node = said.get(rank)
                moved = False
                if node is not None and self._nodes.get(slot) != node:
                    staging.nodes[slot] = node
                    moved = True
                if moved or slot in staged or at - self._seen.get(slot, -1e18) >= SEEN_RESOLUTION:
                    staged[slot] = (at, staged.get(slot, (at, None))[1])

    def finish_rank(self, run: RunRef, rank: int, at: float) -> None:
        self._staging().seen[(run.seq, rank)] = (at, at)

    def forget(self, org_id: int, run_id: str, seq: int, series_ids: Sequence[int]) -> None:
        """A deleted run: nothing of it remembered (its id may name a new run)."""
        self._runs.pop((org_id, run_id), None)
        for key in [key for key in self._series if key[0] == seq]:
            del self._series[key]
        self._extent.pop(seq, None)
        for slot in [slot for slot in self._seen if slot[0] == seq]:
            del self._seen[slot]
        for slot in [slot for slot in self._nodes if slot[0] == seq]:
            del self._nodes[slot]

    def _deleted_under(self, seqs: set[int]) -> None:
        """Runs this process remembered were deleted (by another process, or just before
        this unit): the unit must not write for them. Every cache starts over, and the unit
        fails as a retryable storage error; its retry finds the run gone (404)."""
        self._runs.clear()
        self._series.clear()
        self._extent.clear()
        raise StorageError(f"run(s) {sorted(seqs)} were deleted while being written; retry")

    # ---- the unit ----

    def _flush_extents(self, staged: _Staged, at_once: bool = False) -> None:
        """The unit's extents and points so far: written (``at_once``: where a read in the unit
        sees them, as a growth is written only at the end of the unit otherwise)."""
        changed = {
            seq: extent
            for seq, extent in staged.extents.items()
            if _grows(self._extent.get(seq), extent)
        }
        counted = staged.points
        staged.extents.clear()
        staged.points = {}
        if not changed and not counted:
            return
        seqs = sorted(changed.keys() | counted.keys())
        if self._growth is not None:
            self._growth.grow({q: (*changed.get(q, (0, -1)), counted.get(q, 0)) for q in seqs})
            if at_once:
                self._growth.write()
            staged.written_extents.update(changed)
            return
        sizes, lasts = map(list, zip(*(changed.get(q, (0, -1)) for q in seqs), strict=True))
        points = [counted.get(q, 0) for q in seqs]
        if len(seqs) == 1:  # nearly every unit
            seq, size, last, now = seqs[0], sizes[0], lasts[0], time.time()
            known = self._extent.get(seq)
            if size <= (0 if known is None else known[0]):  # a world size no larger than one stored
                sql, params = EXTEND_ONE_SAME_SIZE, [last, last, points[0], now, seq]
            else:
                sql, params = EXTEND_ONE, [size, size, last, last, points[0], now, seq]
            if not self._engine.changed(sql, params):
                self._deleted_under(set(seqs))
        else:
            found = self._engine.execute(EXTEND, [time.time(), seqs, sizes, lasts, points])
            if len(found) < len(seqs):
                self._deleted_under(set(seqs) - {int(q) for (q,) in found})
        staged.written_extents.update(changed)

    def _flush_seen(self, staged: _Staged) -> None:
        if not staged.seen:
            return
        slots = list(staged.seen)
        self._engine.execute(
            SEE_RANKS,
            [
                [q for q, _ in slots],
                [k for _, k in slots],
                [staged.seen[s][0] for s in slots],
                [staged.seen[s][1] for s in slots],
                [staged.nodes.get(s) for s in slots],
            ],
        )

    def _flush_attributes(self, staged: _Staged) -> None:
        if not staged.attributes:
            return
        # One statement, its rows numbered by the sequence in the order logged.
        self._engine.execute(
            "INSERT INTO attributes (run_seq, path, type, step, value, ts)"
            " SELECT unnest(%s::BIGINT[]), unnest(%s::TEXT[]), unnest(%s::TEXT[]),"
            " unnest(%s::BIGINT[]), unnest(%s::TEXT[]), unnest(%s::DOUBLE PRECISION[])",
            [list(column) for column in zip(*staged.attributes)],
        )

    def begin(self) -> _Staged:
        return _Staged()

    def flush(self, staged: _Staged) -> None:
        self._flush_extents(staged)
        self._flush_seen(staged)
        self._flush_attributes(staged)

    def committed(self, staged: _Staged) -> None:
        _remember(self._runs, staged.runs)
        _remember(self._series, staged.series)
        _remember(self._seen, {slot: at for slot, (at, _) in staged.seen.items()})
        _remember(self._nodes, staged.nodes)
        grown = {}
        for seq, (size, last) in staged.written_extents.items():
            old_size, old_last = self._extent.get(seq, (0, -1))
            grown[seq] = (max(old_size, size), max(old_last, last))
        _remember(self._extent, grown)


def _grows(known: tuple[int, int] | None, extent: tuple[int, int]) -> bool:
    return known is None or extent[0] > known[0] or extent[1] > known[1]


def _remember(cache: dict[Any, Any], entries: Mapping[Any, Any]) -> None:
    if len(cache) + len(entries) > CACHE_ENTRIES:
        cache.clear()
    cache.update(entries)
