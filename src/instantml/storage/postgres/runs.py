"""Runs, series, extents and attributes in PostgreSQL.

Ids come from sequences; a run's creation and a series' are ``INSERT ... ON CONFLICT``, so
two processes creating the same one agree on it. What this process remembers are facts
that never change once committed (a run id's number and project, a series' id): a cache,
never consulted for what might not exist yet.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..records import (
    SEEN_RESOLUTION,
    RunConflict,
    RunRecord,
    RunRef,
    RunSpec,
    run_record,
    run_values,
)
from ..runs_sql import RUN_COLUMNS as _COLUMNS
from ..runs_sql import SqlRunReads
from .engine import PgEngine, storable


@dataclass
class _Staged:
    runs: dict[tuple[int, str], RunRef] = field(default_factory=dict)
    series: dict[tuple[int, int, str], int] = field(default_factory=dict)
    extents: dict[int, tuple[int, int]] = field(default_factory=dict)
    seen: dict[tuple[int, int], tuple[float, float | None]] = field(default_factory=dict)


# Run refs and series ids never change once committed, so a process may remember them
# for ever; this bounds how many (the caches start over when full).
CACHE_ENTRIES = 200_000


class PgRuns(SqlRunReads):
    ANY_OF = "{column} = ANY(%s)"

    def __init__(self, engine: PgEngine) -> None:
        self._engine = engine
        self._runs: dict[tuple[int, str], RunRef] = {}  # committed: never change
        self._series: dict[tuple[int, int, str], int] = {}
        # The last_seen this process last wrote per (run, rank): rewritten only when older
        # by SEEN_RESOLUTION (other processes' writes only make the stored one newer).
        self._seen: dict[tuple[int, int], float] = {}
        engine.join(self)

    # ---- reads (and runs_sql.py's) ----

    def read(self, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
        with self._engine.connection() as con:
            return con.execute(sql, params).fetchall()

    def storable(self, *texts: str | None) -> bool:
        return storable(*texts)

    def series(self, org_id: int, run_id: str) -> list[tuple[int, int, str]] | None:
        if not storable(run_id):
            return None
        with self._engine.connection() as con:
            run = con.execute(
                "SELECT run_seq FROM runs WHERE org_id = %s AND run_id = %s", [org_id, run_id]
            ).fetchone()
            if run is None:
                return None
            rows = con.execute(
                "SELECT series_id, kind, key FROM series WHERE run_seq = %s ORDER BY series_id",
                [run[0]],
            ).fetchall()
        return [(int(sid), int(kind), key) for sid, kind, key in rows]

    def series_id(self, org_id: int, run_id: str, kind: int, key: str) -> int | None:
        ref = self._ref(org_id, run_id) if storable(key) else None
        if ref is None:
            return None
        sid = self._series.get((ref.seq, kind, key))
        if sid is None:
            with self._engine.connection() as con:
                row = con.execute(
                    "SELECT series_id FROM series WHERE run_seq = %s AND kind = %s AND key = %s",
                    [ref.seq, kind, key],
                ).fetchone()
            if row is None:
                return None
            sid = int(row[0])
            _remember(self._series, {(ref.seq, kind, key): sid})
        return sid

    def _ref(self, org_id: int, run_id: str) -> RunRef | None:
        if not storable(run_id):
            return None
        ref = self._runs.get((org_id, run_id))
        if ref is None:
            with self._engine.connection() as con:
                row = con.execute(
                    "SELECT run_seq, project FROM runs WHERE org_id = %s AND run_id = %s",
                    [org_id, run_id],
                ).fetchone()
            if row is None:
                return None
            ref = RunRef(int(row[0]), row[1])
            if not self._engine.in_unit:  # a unit's own reads may not be committed yet
                _remember(self._runs, {(org_id, run_id): ref})
        return ref

    # ---- writes, in a unit ----

    def resolve(self, org_id: int, run_ids: Iterable[str]) -> dict[str, RunRef | None]:
        staged: _Staged = self._engine.staged(self)
        out: dict[str, RunRef | None] = {}
        for rid in run_ids:
            out[rid] = staged.runs.get((org_id, rid)) or self._runs.get((org_id, rid))
            if out[rid] is None:
                out[rid] = self._ref(org_id, rid)
        return out

    def create(self, spec: RunSpec) -> tuple[RunRecord, bool]:
        staged: _Staged = self._engine.staged(self)
        now = time.time()
        with self._engine.connection() as con:
            row = con.execute(
                "INSERT INTO runs (org_id, run_id, project, name, status, config, tags,"
                " metadata, created_at, updated_at) VALUES (%s, %s, %s, %s, 'running', %s, %s,"
                " %s, %s, %s) ON CONFLICT (org_id, run_id) DO NOTHING"
                f" RETURNING run_seq, {_COLUMNS}",
                run_values(spec, now),
            ).fetchone()
            created = row is not None
            if row is None:
                self._flush_extents(staged)
                row = con.execute(
                    f"SELECT run_seq, {_COLUMNS} FROM runs WHERE org_id = %s AND run_id = %s",
                    [spec.org_id, spec.run_id],
                ).fetchone()
                assert row is not None
        record = run_record(row[1:])
        if record.project != spec.project:
            raise RunConflict(spec.run_id, record.project)
        staged.runs[(spec.org_id, spec.run_id)] = RunRef(int(row[0]), record.project)
        return record, created

    def set_status(self, run: RunRef, status: str) -> RunRecord:
        self._flush_extents(self._engine.staged(self))
        with self._engine.connection() as con:
            row = con.execute(
                f"UPDATE runs SET status = %s, updated_at = %s WHERE run_seq = %s"
                f" RETURNING {_COLUMNS}",
                [status, time.time(), run.seq],
            ).fetchone()
        assert row is not None
        return run_record(row)

    def add_attributes(self, run: RunRef, attributes: list[dict[str, Any]], ts: float) -> None:
        rows = []
        for attribute in attributes:
            step = attribute.get("step")
            path, kind = attribute.get("path"), attribute.get("type")
            rows.append(
                (
                    run.seq,
                    path if isinstance(path, str) else None,
                    kind if isinstance(kind, str) else None,
                    step if type(step) is int else None,
                    orjson.dumps(attribute.get("value")).decode(),
                    ts,
                )
            )
        with self._engine.connection() as con, con.cursor() as cur:
            cur.executemany(
                "INSERT INTO attributes (run_seq, path, type, step, value, ts)"
                " VALUES (%s, %s, %s, %s, %s, %s)",
                rows,
            )

    def series_ids(self, run: RunRef, kind: int, keys: Sequence[str]) -> list[int]:
        staged: _Staged = self._engine.staged(self)
        missing = [
            k for k in keys if (run.seq, kind, k) not in staged.series
            and (run.seq, kind, k) not in self._series
        ]  # fmt: skip
        if missing:
            with self._engine.connection() as con:
                con.execute(
                    "INSERT INTO series (run_seq, kind, key) SELECT %s, %s, unnest(%s::TEXT[])"
                    " ON CONFLICT (run_seq, kind, key) DO NOTHING",
                    [run.seq, kind, missing],
                )
                for sid, key in con.execute(
                    "SELECT series_id, key FROM series WHERE run_seq = %s AND kind = %s"
                    " AND key = ANY(%s)",
                    [run.seq, kind, missing],
                ).fetchall():
                    staged.series[(run.seq, kind, key)] = int(sid)
        return [
            staged.series.get((run.seq, kind, k)) or self._series[(run.seq, kind, k)] for k in keys
        ]

    def extend(self, extents: Mapping[int, tuple[int, int]]) -> None:
        staged: _Staged = self._engine.staged(self)
        for seq, (size, last) in extents.items():
            old_size, old_last = staged.extents.get(seq, (0, -1))
            staged.extents[seq] = (max(old_size, size), max(old_last, last))

    def saw_ranks(self, ranks: Mapping[int, Iterable[int]], at: float) -> None:
        staged: _Staged = self._engine.staged(self)
        for seq, members in ranks.items():
            for rank in members:
                slot = (seq, rank)
                if slot in staged.seen or at - self._seen.get(slot, -1e18) >= SEEN_RESOLUTION:
                    staged.seen[slot] = (at, staged.seen.get(slot, (at, None))[1])

    def finish_rank(self, run: RunRef, rank: int, at: float) -> None:
        staged: _Staged = self._engine.staged(self)
        staged.seen[(run.seq, rank)] = (at, at)

    # ---- the unit ----

    def _flush_seen(self, staged: _Staged) -> None:
        if not staged.seen:
            return
        slots = list(staged.seen)
        with self._engine.connection() as con:
            con.execute(
                "INSERT INTO run_ranks (run_seq, rank, first_seen, last_seen, finished_at)"
                " SELECT s, k, a, a, f FROM unnest(%s::BIGINT[], %s::INTEGER[],"
                " %s::DOUBLE PRECISION[], %s::DOUBLE PRECISION[]) AS e(s, k, a, f)"
                " ON CONFLICT (run_seq, rank) DO UPDATE SET"
                " last_seen = greatest(run_ranks.last_seen, excluded.last_seen),"
                " finished_at = coalesce(excluded.finished_at, run_ranks.finished_at)",
                [
                    [q for q, _ in slots],
                    [k for _, k in slots],
                    [staged.seen[s][0] for s in slots],
                    [staged.seen[s][1] for s in slots],
                ],
            )

    def _flush_extents(self, staged: _Staged) -> None:
        if not staged.extents:
            return
        seqs = list(staged.extents)
        with self._engine.connection() as con:
            con.execute(
                "UPDATE runs SET world_size = CASE WHEN e.size > 0"
                " THEN greatest(coalesce(world_size, 0), e.size) ELSE world_size END,"
                " last_step = greatest(coalesce(last_step, -1), e.last), updated_at = %s"
                " FROM unnest(%s::BIGINT[], %s::INTEGER[], %s::BIGINT[]) AS e(seq, size, last)"
                " WHERE runs.run_seq = e.seq",
                [
                    time.time(),
                    seqs,
                    [staged.extents[q][0] for q in seqs],
                    [staged.extents[q][1] for q in seqs],
                ],
            )
        staged.extents.clear()

    def begin(self) -> _Staged:
        return _Staged()

    def flush(self, staged: _Staged) -> None:
        self._flush_extents(staged)
        self._flush_seen(staged)

    def committed(self, staged: _Staged) -> None:
        _remember(self._runs, staged.runs)
        _remember(self._series, staged.series)
        _remember(self._seen, {slot: at for slot, (at, _) in staged.seen.items()})


def _remember(cache: dict[Any, Any], entries: Mapping[Any, Any]) -> None:
    if len(cache) + len(entries) > CACHE_ENTRIES:
        cache.clear()
    cache.update(entries)
