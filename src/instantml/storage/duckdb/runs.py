"""Runs, their series, extents and attributes in DuckDB.

Process-local, and safe only because one process owns the file (docs/decisions.md): the
maps from (org, run id) to run and from (run, kind, key) to series, and the next ids to
hand out (max + 1), all loaded at start and taught only by committed units.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
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
from .engine import Engine, first

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_seq INTEGER PRIMARY KEY, org_id INTEGER NOT NULL, run_id VARCHAR NOT NULL,
    project VARCHAR NOT NULL, name VARCHAR, status VARCHAR NOT NULL,
    config VARCHAR NOT NULL, tags VARCHAR NOT NULL, metadata VARCHAR NOT NULL,
    created_at DOUBLE NOT NULL, updated_at DOUBLE NOT NULL,
    world_size INTEGER, last_step BIGINT, UNIQUE (org_id, run_id));
CREATE TABLE IF NOT EXISTS series (
    series_id INTEGER PRIMARY KEY, run_seq INTEGER NOT NULL, kind TINYINT NOT NULL,
    key VARCHAR NOT NULL, UNIQUE (run_seq, kind, key));
CREATE TABLE IF NOT EXISTS attributes (
    run_seq INTEGER NOT NULL, seq BIGINT NOT NULL, path VARCHAR, type VARCHAR,
    step BIGINT, value VARCHAR, ts DOUBLE NOT NULL);
CREATE TABLE IF NOT EXISTS run_ranks (
    run_seq INTEGER NOT NULL, rank INTEGER NOT NULL, first_seen DOUBLE NOT NULL,
    last_seen DOUBLE NOT NULL, finished_at DOUBLE, PRIMARY KEY (run_seq, rank));
"""


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


class _Staged:
    def __init__(self) -> None:
        self.runs: dict[tuple[int, str], RunRef] = {}
        self.series: dict[tuple[int, int, str], int] = {}
        self.extents: dict[int, tuple[int, int]] = {}
        self.attributes: list[tuple[int, str | None, str | None, int | None, str, float]] = []
        self.seen: dict[tuple[int, int], tuple[float, float | None]] = {}  # -> (at, finished)
        self.written_extents: dict[int, tuple[int, int]] = {}  # run -> extent, as written


class DuckDBRuns(SqlRunReads):
    ANY_OF = "list_contains(%s, {column})"

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        con = engine.con
        con.execute(SCHEMA)
        self._runs: dict[tuple[int, str], RunRef] = {
            (org, rid): RunRef(seq, project)
            for seq, org, rid, project in con.execute(
                "SELECT run_seq, org_id, run_id, project FROM runs"
            ).fetchall()
        }
        self._series: dict[tuple[int, int, str], int] = {
            (run, kind, key): sid
            for sid, run, kind, key in con.execute(
                "SELECT series_id, run_seq, kind, key FROM series"
            ).fetchall()
        }
        self._extent: dict[int, tuple[int, int]] = {
            seq: (size or 0, last if last is not None else -1)
            for seq, size, last in con.execute(
                "SELECT run_seq, world_size, last_step FROM runs"
            ).fetchall()
        }
        self._next_run = 1 + max((ref.seq for ref in self._runs.values()), default=0)
        self._next_series = 1 + max(self._series.values(), default=0)
        (self._next_attr,) = first(con.execute("SELECT coalesce(max(seq), 0) + 1 FROM attributes"))
        # Each (run, rank)'s last_seen as stored: rewritten only when older by SEEN_RESOLUTION.
        self._seen: dict[tuple[int, int], float] = {
            (seq, rank): last
            for seq, rank, last in con.execute(
                "SELECT run_seq, rank, last_seen FROM run_ranks"
            ).fetchall()
        }
        engine.join(self)

    @property
    def _staged(self) -> _Staged:
        """This thread's unit's staging (outside a unit: an empty one)."""
        staged: _Staged = self._engine.staged(self)
        return staged

    # ---- reads (and runs_sql.py's) ----

    def read(self, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
        return self._engine.read(sql, params)

    def series(self, org_id: int, run_id: str) -> list[tuple[int, int, str]] | None:
        ref = self._runs.get((org_id, run_id))
        if ref is None:
            return None
        return sorted(
            (sid, kind, key)
            for (run, kind, key), sid in list(self._series.items())
            if run == ref.seq
        )

    def series_id(self, org_id: int, run_id: str, kind: int, key: str) -> int | None:
        ref = self._runs.get((org_id, run_id))
        return None if ref is None else self._series.get((ref.seq, kind, key))

    # ---- writes, in a unit ----

    def resolve(self, org_id: int, run_ids: Iterable[str]) -> dict[str, RunRef | None]:
        staged = self._staged.runs
        return {rid: staged.get((org_id, rid)) or self._runs.get((org_id, rid)) for rid in run_ids}

    def create(self, spec: RunSpec) -> tuple[RunRecord, bool]:
        slot = (spec.org_id, spec.run_id)
        ref = self._staged.runs.get(slot) or self._runs.get(slot)
        if ref is not None:
            if ref.project != spec.project:
                raise RunConflict(spec.run_id, ref.project)
            self._flush_extents()
            row = first(
                self._engine.con.execute(
                    f"SELECT {_COLUMNS} FROM runs WHERE run_seq = ?", [ref.seq]
                )
            )
            return run_record(row), False
        seq = self._next_run + len(self._staged.runs)
        now = time.time()
        row = first(
            self._engine.con.execute(
                f"INSERT INTO runs VALUES (?, ?, ?, ?, ?, 'running', ?, ?, ?, ?, ?, NULL, NULL)"
                f" RETURNING {_COLUMNS}",
                [seq, *run_values(spec, now)],
            )
        )
        self._staged.runs[slot] = RunRef(seq, spec.project)
        return run_record(row), True

    def set_status(self, run: RunRef, status: str) -> RunRecord:
        self._flush_extents()
        row = first(
            self._engine.con.execute(
                f"UPDATE runs SET status = ?, updated_at = ? WHERE run_seq = ? RETURNING {_COLUMNS}",
                [status, time.time(), run.seq],
            )
        )
        return run_record(row)

    def add_attributes(self, run: RunRef, attributes: list[dict[str, Any]], ts: float) -> None:
        for attribute in attributes:
            step = attribute.get("step")
            self._staged.attributes.append(
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
        staged = self._staged.series
        out = []
        for key in keys:
            slot = (run.seq, kind, key)
            sid = staged.get(slot) or self._series.get(slot)
            if sid is None:
                sid = staged[slot] = self._next_series + len(staged)
            out.append(sid)
        return out

    def extend(self, extents: Mapping[int, tuple[int, int]]) -> None:
        staged = self._staged.extents
        for seq, (size, last) in extents.items():
            old_size, old_last = staged.get(seq, (0, -1))
            staged[seq] = (max(old_size, size), max(old_last, last))

    def saw_ranks(self, ranks: Mapping[int, Iterable[int]], at: float) -> None:
        staged = self._staged.seen
        for seq, members in ranks.items():
            for rank in members:
                slot = (seq, rank)
                if slot in staged or at - self._seen.get(slot, -np.inf) >= SEEN_RESOLUTION:
                    staged[slot] = (at, staged.get(slot, (at, None))[1])

    def finish_rank(self, run: RunRef, rank: int, at: float) -> None:
        self._staged.seen[(run.seq, rank)] = (at, at)

    # ---- the unit ----

    def _flush_seen(self) -> None:
        seen = self._staged.seen
        if not seen:
            return
        slots = list(seen)
        columns: dict[str, tuple[list[Any], Any]] = {
            "seq": ([q for q, _ in slots], np.int32),
            "rank": ([r for _, r in slots], np.int32),
            "seen_at": ([seen[s][0] for s in slots], np.float64),
            "done_at": ([np.nan if seen[s][1] is None else seen[s][1] for s in slots], np.float64),
        }
        with self._engine.rows("seen", columns) as (source, params):
            self._engine.con.execute(
                "INSERT INTO run_ranks SELECT seq, rank, seen_at, seen_at,"
                f" CASE WHEN isnan(done_at) THEN NULL ELSE done_at END FROM {source}"
                " ON CONFLICT (run_seq, rank) DO UPDATE SET"
                " last_seen = greatest(run_ranks.last_seen, excluded.last_seen),"
                " finished_at = coalesce(excluded.finished_at, run_ranks.finished_at)",
                params,
            )

    def _flush_extents(self) -> None:
        staged = self._staged.extents
        changed = {seq: ext for seq, ext in staged.items() if _grows(self._extent.get(seq), ext)}
        staged.clear()
        if not changed:
            return
        seqs = list(changed)
        columns = {
            "seq": ([q for q in seqs], np.int32),
            "size": ([changed[q][0] for q in seqs], np.int32),
            "last": ([changed[q][1] for q in seqs], np.int64),
        }
        with self._engine.rows("ext", columns) as (source, params):
            self._engine.con.execute(
                "UPDATE runs SET world_size = CASE WHEN ext.size > 0"
                " THEN greatest(coalesce(world_size, 0), ext.size) ELSE world_size END,"
                " last_step = greatest(coalesce(last_step, -1), ext.last), updated_at = ?"
                f" FROM {source} WHERE runs.run_seq = ext.seq",
                [time.time(), *params],
            )
        self._staged.written_extents.update(changed)

    def begin(self) -> _Staged:
        return _Staged()

    def flush(self, staged: _Staged) -> None:
        con = self._engine.con
        self._flush_extents()
        self._flush_seen()
        if staged.series:
            con.executemany(
                "INSERT INTO series VALUES (?, ?, ?, ?)",
                [[sid, run, kind, key] for (run, kind, key), sid in staged.series.items()],
            )
        if staged.attributes:
            first_seq = self._next_attr
            con.executemany(
                "INSERT INTO attributes VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    [run, first_seq + i, path, kind, step, value, ts]
                    for i, (run, path, kind, step, value, ts) in enumerate(staged.attributes)
                ],
            )

    def committed(self, staged: _Staged) -> None:
        self._runs.update(staged.runs)
        self._series.update(staged.series)
        self._next_run += len(staged.runs)
        self._next_series += len(staged.series)
        self._next_attr += len(staged.attributes)
        for slot, (at, _) in staged.seen.items():
            self._seen[slot] = max(at, self._seen.get(slot, at))
        for seq, (size, last) in staged.written_extents.items():
            old_size, old_last = self._extent.get(seq, (0, -1))
            self._extent[seq] = (max(old_size, size), max(old_last, last))


def _grows(known: tuple[int, int] | None, extent: tuple[int, int]) -> bool:
    return known is None or extent[0] > known[0] or extent[1] > known[1]
