"""The embedded backend: one DuckDB file holds metadata, idempotency records and points.

One engine means one transaction covers a write, its Idempotency-Key record and (later)
its usage count, so a crash can never keep one without the other. Only the server's
writer thread calls :meth:`DuckDBStore.apply`; reads use one cursor per thread.

Points are keyed by integer series ids (run, kind, key). Rank points have no primary
key: its index cost a quarter of every ingest and most of the memory. A point is unique
by construction instead: the store knows each (series, rank)'s newest committed step, so
a point beyond it is new (nearly all of them), and one at or before it may rewrite an
existing point, which is deleted in the same transaction before the new one goes in.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from itertools import chain, repeat
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import orjson

from ..protocol import RUN_CONFLICT
from ..summary import SummaryParams
from ..summary.step_stats import step_stats
from . import duckdb_summary
from .base import (
    ApiKeyRecord,
    CreateRun,
    Envelope,
    Idempotency,
    Outcome,
    PatchRun,
    RankEvents,
    Refresh,
    RunRecord,
    SeriesKey,
    WriteAttributes,
    WriteRankPoints,
    WriteScalars,
)
from .keyfilter import KeyFilter
from .usage import UsagePolicy, month_of, refusal, reset_at

RANK, SCALAR = 1, 0
_VALUES_MAX_ROWS = 64
_REFRESH_CHUNK = 4096
# Idempotency-Keys are remembered at least 7 days (the contract); a day's margin on top.
IDEMPOTENCY_RETENTION = 8 * 86400.0
_PRUNE_EVERY = 3600.0
log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS orgs (
    org_id INTEGER PRIMARY KEY, name VARCHAR UNIQUE NOT NULL,
    monthly_limit BIGINT, created_at DOUBLE NOT NULL);
CREATE TABLE IF NOT EXISTS api_keys (
    key_id VARCHAR PRIMARY KEY, org_id INTEGER NOT NULL, key_hash VARCHAR NOT NULL,
    scopes VARCHAR NOT NULL, created_at DOUBLE NOT NULL, revoked_at DOUBLE);
CREATE TABLE IF NOT EXISTS runs (
    run_seq INTEGER PRIMARY KEY, org_id INTEGER NOT NULL, run_id VARCHAR NOT NULL,
    project VARCHAR NOT NULL, name VARCHAR, status VARCHAR NOT NULL,
    config VARCHAR NOT NULL, tags VARCHAR NOT NULL, metadata VARCHAR NOT NULL,
    created_at DOUBLE NOT NULL, updated_at DOUBLE NOT NULL,
    world_size INTEGER, last_step BIGINT, UNIQUE (org_id, run_id));
CREATE TABLE IF NOT EXISTS series (
    series_id INTEGER PRIMARY KEY, run_seq INTEGER NOT NULL, kind TINYINT NOT NULL,
    key VARCHAR NOT NULL, UNIQUE (run_seq, kind, key));
CREATE TABLE IF NOT EXISTS rank_points (
    series_id INTEGER NOT NULL, step BIGINT NOT NULL, rank SMALLINT NOT NULL,
    world_size SMALLINT NOT NULL, local_rank SMALLINT, value DOUBLE NOT NULL,
    weight DOUBLE NOT NULL, ts DOUBLE NOT NULL,
    delta DOUBLE, z DOUBLE, robust_z DOUBLE  -- kept by duckdb_summary.refresh
    );  -- one row per (series_id, step, rank): see the module docstring
CREATE TABLE IF NOT EXISTS scalar_points (
    series_id INTEGER NOT NULL, step BIGINT NOT NULL, value DOUBLE NOT NULL,
    ts DOUBLE NOT NULL, preview BOOLEAN NOT NULL, PRIMARY KEY (series_id, step));
CREATE TABLE IF NOT EXISTS attributes (
    run_seq INTEGER NOT NULL, seq BIGINT NOT NULL, path VARCHAR, type VARCHAR,
    step BIGINT, value VARCHAR, ts DOUBLE NOT NULL);
-- Append-only (one row per commit that accepted points; read as a SUM): a plain insert
-- costs a third of an upsert, and every write group pays it.
CREATE TABLE IF NOT EXISTS usage_log (
    org_id INTEGER NOT NULL, month VARCHAR NOT NULL, points BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS idempotency (
    org_id INTEGER NOT NULL, key_hi BIGINT NOT NULL, key_lo BIGINT NOT NULL,
    fingerprint BIGINT NOT NULL, status SMALLINT NOT NULL, body VARCHAR NOT NULL,
    created_at DOUBLE NOT NULL);
CREATE INDEX IF NOT EXISTS idempotency_key_hi ON idempotency (key_hi);
"""

_RUN_COLUMNS = (
    "org_id, run_id, project, name, status, config, tags, metadata, created_at, updated_at,"
    " world_size, last_step"
)


def _run_record(row: tuple[Any, ...]) -> RunRecord:
    return RunRecord(
        org_id=row[0],
        run_id=row[1],
        project=row[2],
        name=row[3],
        status=row[4],
        config=orjson.loads(row[5]),
        tags=orjson.loads(row[6]),
        metadata=orjson.loads(row[7]),
        created_at=row[8],
        updated_at=row[9],
        world_size=row[10],
        last_step=row[11],
    )


_RANK_COLUMNS = {
    "series_id": np.int32,
    "step": np.int64,
    "rank": np.int16,
    "world_size": np.int16,
    "local_rank": np.int16,  # -1: none
    "value": np.float64,
    "weight": np.float64,
    "ts": np.float64,
    "delta": np.float64,  # NaN: not computed yet (the step is stale)
    "z": np.float64,
    "robust_z": np.float64,
    "seq": np.int64,  # staging order (not stored): the later write of a point wins
}
_IDEMPOTENCY_COLUMNS = {
    "org_id": np.int32,
    "key_hi": np.int64,
    "key_lo": np.int64,
    "fingerprint": np.int64,
    "status": np.int16,
    "body": object,
}


class _Batch:
    """Rows staged by one group commit, flushed as a few bulk inserts before COMMIT.

    Rank points and Idempotency-Key records come two ways: row by row from single writes
    (``rank``, ``idempotency``) and as whole columns from RankEvents writes (``*_chunks``).
    Order matters for points (a later write of a point wins), so the rows staged so far are
    sealed into a chunk before a RankEvents chunk is added.
    """

    def __init__(self) -> None:
        self.rank: dict[tuple[int, int, int], tuple[int, int, float, float, float]] = {}
        self.rank_chunks: list[dict[str, np.ndarray]] = []
        self.stats_chunks: list[dict[str, np.ndarray]] = []  # steps computed while staging
        self.last_step: dict[int, int] = {}  # series -> newest step staged or committed
        self.rewrites: list[tuple[int, int, int]] = []  # points that may exist already
        self.points_frame: dict[str, np.ndarray] | None = None
        self.seq = 0  # staging order of points: the later write of a point wins
        self.idem_chunks: list[dict[str, Any]] = []
        # The idem_chunks' keys as slot -> row, built when a later write of the same group
        # first needs to look one up (rare: the group's other writes carry other keys).
        self._chunk_index: list[dict[tuple[int, int, int], int]] = []
        self.stored_keys: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self.scalar: dict[tuple[int, int], tuple[float, float, bool]] = {}
        self.attributes: list[tuple[int, str | None, str | None, int | None, str, float]] = []
        self.idempotency: dict[tuple[int, int, int], tuple[int, int, str]] = {}
        self.run_extent: dict[int, tuple[int, int]] = {}  # run_seq -> (max world_size, max step)
        self.new_runs: dict[tuple[int, str], int] = {}
        self.new_series: dict[tuple[int, int, str], int] = {}
        self.extent_written: dict[int, tuple[int, int]] = {}
        self.refresh: set[int] = set()  # series to bring up to date before COMMIT
        self.stale: dict[int, set[int]] = {}  # series -> steps this batch made stale
        self.refreshed: dict[int, set[int]] = {}
        self.points: dict[int, int] = {}  # org -> metric points this batch accepted
        self.month = ""

    def seal_rank_rows(self) -> None:
        if not self.rank:
            return
        sids, steps, ranks = zip(*self.rank)
        sizes, locals_, values, weights, stamps = zip(*self.rank.values())
        unknown = [math.nan] * len(sids)
        order = list(range(self.seq, self.seq + len(sids)))
        self.seq += len(sids)
        self.rank_chunks.append(
            {
                name: np.array(column, dtype=dtype)
                for (name, dtype), column in zip(
                    _RANK_COLUMNS.items(),
                    (sids, steps, ranks, sizes, locals_, values, weights, stamps)
                    + (unknown,) * 3
                    + (order,),
                    strict=True,
                )
            }
        )
        self.rank = {}

    def chunk_index(self, number: int) -> dict[tuple[int, int, int], int]:
        while len(self._chunk_index) <= number:
            chunk = self.idem_chunks[len(self._chunk_index)]
            slots = zip(
                chunk["org_id"].tolist(), chunk["key_hi"].tolist(), chunk["key_lo"].tolist()
            )
            self._chunk_index.append(dict(zip(slots, range(len(chunk["key_hi"])))))
        return self._chunk_index[number]

    def chunk_key(self, slot: tuple[int, int, int]) -> tuple[int, int, str] | None:
        """The answer a RankEvents write of this group staged for an Idempotency-Key, if
        any (single writes' answers are in ``idempotency``)."""
        for number, chunk in enumerate(self.idem_chunks):
            i = self.chunk_index(number).get(slot)
            if i is not None:
                return (
                    int(chunk["fingerprint"][i]),
                    int(chunk["status"][i]),
                    chunk["body"][i],
                )
        return None


class DuckDBStore:
    """Embedded store in ``<path>`` (a DuckDB file); ``:memory:`` for throwaway use."""

    def __init__(self, path: str, usage: UsagePolicy | None = None) -> None:
        self._policy = usage or UsagePolicy()
        if path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._con = duckdb.connect(path)
        self._con.execute(_SCHEMA)
        self._con.execute(duckdb_summary.SCHEMA)
        self._local = threading.local()
        self._runs: dict[tuple[int, str], int] = {
            (org, rid): seq
            for seq, org, rid in self._con.execute(
                "SELECT run_seq, org_id, run_id FROM runs"
            ).fetchall()
        }
        self._series: dict[tuple[int, int, str], int] = {
            (run, kind, key): sid
            for sid, run, kind, key in self._con.execute(
                "SELECT series_id, run_seq, kind, key FROM series"
            ).fetchall()
        }
        self._extent: dict[int, tuple[int, int]] = {
            seq: (size or 0, last if last is not None else -1)
            for seq, size, last in self._con.execute(
                "SELECT run_seq, world_size, last_step FROM runs"
            ).fetchall()
        }
        # The guardrail: each org's override, and this month's points per org (the writer
        # thread keeps them; a refusal never needs a query).
        self._limits: dict[int, int | None] = dict(
            self._con.execute("SELECT org_id, monthly_limit FROM orgs").fetchall()
        )
        self._used: dict[tuple[int, str], int] = {}
        self._last_prune = float("-inf")
        # Every Idempotency-Key ever stored, as a Bloom filter: new keys skip the lookup.
        self._key_filter = self._load_key_filter()
        # Steps whose summary aggregates are behind their points (see duckdb_summary).
        self._stale: dict[int, set[int]] = {}
        for sid, step in self._con.execute(
            "SELECT DISTINCT series_id, step FROM stale_steps"
        ).fetchall():
            self._stale.setdefault(sid, set()).add(step)
        # Each rank series' newest step (a write beyond it brings whole new steps), and
        # each of its ranks' (a point beyond it is new, not a rewrite).
        self._rank_last: dict[int, np.ndarray] = {}
        newest = self._con.execute(
            "SELECT series_id, rank, max(step) AS step FROM rank_points GROUP BY series_id, rank"
        ).fetchnumpy()
        _raise_rank_last(self._rank_last, newest["series_id"], newest["rank"], newest["step"])
        self._last_step: dict[int, int] = {
            sid: int(steps.max()) for sid, steps in self._rank_last.items()
        }
        self._next_run = 1 + max(self._runs.values(), default=0)
        self._next_series = 1 + max(self._series.values(), default=0)
        (self._next_attr,) = _first(
            self._con.execute("SELECT coalesce(max(seq), 0) + 1 FROM attributes")
        )

    # ---- reads (any thread) ----

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        cur = getattr(self._local, "cur", None)
        if cur is None:
            cur = self._local.cur = self._con.cursor()
        return cur

    def get_run(self, org_id: int, run_id: str) -> RunRecord | None:
        rows = (
            self._cursor()
            .execute(
                f"SELECT {_RUN_COLUMNS} FROM runs WHERE org_id = ? AND run_id = ?", [org_id, run_id]
            )
            .fetchall()
        )
        if not rows:
            return None
        record = _run_record(rows[0])
        # Config written after creation (the public SDK's log_config) as config attributes.
        for path, value in (
            self._cursor()
            .execute(
                "SELECT a.path, a.value FROM attributes a JOIN runs r USING (run_seq)"
                " WHERE r.org_id = ? AND r.run_id = ? AND a.type = 'config'"
                " AND starts_with(a.path, 'config/') ORDER BY a.seq",
                [org_id, run_id],
            )
            .fetchall()
        ):
            record.config[path.removeprefix("config/")] = orjson.loads(value)
        return record

    def list_runs(self, org_id: int, project: str | None, limit: int) -> list[RunRecord]:
        rows = (
            self._cursor()
            .execute(
                f"SELECT {_RUN_COLUMNS} FROM runs WHERE org_id = ? AND (? IS NULL OR project = ?)"
                " ORDER BY created_at DESC, run_seq DESC LIMIT ?",
                [org_id, project, project, limit],
            )
            .fetchall()
        )
        return [_run_record(row) for row in rows]

    def _run_seq(self, org_id: int, run_id: str) -> int | None:
        return self._runs.get((org_id, run_id))

    def list_series(self, org_id: int, run_id: str) -> list[SeriesKey] | None:
        seq = self._run_seq(org_id, run_id)
        if seq is None:
            return None
        rows = (
            self._cursor()
            .execute(
                """
            SELECT s.key, s.kind, count(*), max(p.step) FROM series s
              JOIN rank_points p USING (series_id) WHERE s.run_seq = ? AND s.kind = 1
              GROUP BY s.key, s.kind
            UNION ALL
            SELECT s.key, s.kind, count(*), max(p.step) FROM series s
              JOIN scalar_points p USING (series_id) WHERE s.run_seq = ? AND s.kind = 0
              GROUP BY s.key, s.kind
            ORDER BY 1, 2
            """,
                [seq, seq],
            )
            .fetchall()
        )
        return [
            SeriesKey(key=key, kind="rank" if kind == RANK else "scalar", points=n, last_step=last)
            for key, kind, n, last in rows
        ]

    def scalar_points(self, org_id: int, run_id: str, key: str) -> list[tuple[int, float]] | None:
        seq = self._run_seq(org_id, run_id)
        sid = None if seq is None else self._series.get((seq, SCALAR, key))
        if sid is None:
            return None
        return [
            (int(s), float(v))
            for s, v in self._cursor()
            .execute(
                "SELECT step, value FROM scalar_points WHERE series_id = ? ORDER BY step", [sid]
            )
            .fetchall()
        ]

    def rank_points(
        self, org_id: int, run_id: str, key: str
    ) -> list[tuple[int, int, float, float, int | None, int]] | None:
        seq = self._run_seq(org_id, run_id)
        sid = None if seq is None else self._series.get((seq, RANK, key))
        if sid is None:
            return None
        rows = (
            self._cursor()
            .execute(
                "SELECT step, rank, value, weight, local_rank, world_size FROM rank_points"
                " WHERE series_id = ? ORDER BY step, rank",
                [sid],
            )
            .fetchall()
        )
        return [tuple(row) for row in rows]

    def find_api_key(self, key_id: str) -> ApiKeyRecord | None:
        rows = (
            self._cursor()
            .execute(
                "SELECT key_id, org_id, scopes, key_hash, revoked_at IS NOT NULL FROM api_keys"
                " WHERE key_id = ?",
                [key_id],
            )
            .fetchall()
        )
        if not rows:
            return None
        row = rows[0]
        return ApiKeyRecord(
            key_id=row[0],
            org_id=row[1],
            scopes=frozenset(row[2].split(",")),
            key_hash=row[3],
            revoked=bool(row[4]),
        )

    def count_api_keys(self) -> int:
        (n,) = _first(self._cursor().execute("SELECT count(*) FROM api_keys"))
        return int(n)

    # ---- administrative writes (rare; startup and admin routes) ----

    def ensure_org(self, name: str) -> int:
        cur = self._cursor()
        rows = cur.execute("SELECT org_id FROM orgs WHERE name = ?", [name]).fetchall()
        if rows:
            return int(rows[0][0])
        (org_id,) = _first(
            cur.execute(
                "INSERT INTO orgs SELECT coalesce(max(org_id), 0) + 1, ?, NULL, ? FROM orgs"
                " RETURNING org_id",
                [name, time.time()],
            )
        )
        return int(org_id)

    def add_api_key(self, org_id: int, key_id: str, key_hash: str, scopes: frozenset[str]) -> None:
        self._cursor().execute(
            "INSERT INTO api_keys VALUES (?, ?, ?, ?, ?, NULL)",
            [key_id, org_id, key_hash, ",".join(sorted(scopes)), time.time()],
        )

    # ---- the write path (the writer thread only) ----

    def apply(self, envelopes: list[Envelope], replace: bool = False) -> list[Outcome]:
        """Apply a group in one transaction. Scalar points are first written with a plain
        INSERT (half the cost of an upsert); a point written before makes that fail, and
        the group is applied again with INSERT OR REPLACE, so the latest write still wins."""
        con = self._con
        batch = _Batch()
        con.execute("BEGIN TRANSACTION")
        try:
            outcomes = self._apply_in_transaction(envelopes, batch)
            self._flush(batch, replace)
            for sid in batch.refresh:
                steps = self._stale.get(sid, set()) | batch.stale.get(sid, set())
                if steps:
                    duckdb_summary.refresh(con, sid, sorted(steps))
                    batch.refreshed[sid] = steps
            con.execute("COMMIT")
        except duckdb.ConstraintException:
            con.execute("ROLLBACK")
            if not replace:
                return self.apply(envelopes, replace=True)
            if len(envelopes) == 1:
                raise
            return [self._apply_alone(envelope) for envelope in envelopes]
        except Exception:
            con.execute("ROLLBACK")
            if len(envelopes) == 1:
                raise
            # Isolate whatever failed: each write on its own, so the others still land.
            return [self._apply_alone(envelope) for envelope in envelopes]
        # Only a committed transaction may teach the caches new ids.
        self._runs.update(batch.new_runs)
        self._series.update(batch.new_series)
        for org_id, points in batch.points.items():
            slot = (org_id, batch.month)
            self._used[slot] = self._used.get(slot, 0) + points
        if batch.stored_keys is not None:
            self._key_filter.add(*batch.stored_keys)
            if self._key_filter.full:
                self._key_filter = self._load_key_filter(2 * self._key_filter.capacity)
        for sid, steps in batch.stale.items():
            self._stale.setdefault(sid, set()).update(steps)
        self._last_step.update(batch.last_step)  # each only ever grows
        if batch.points_frame is not None:
            frame = batch.points_frame
            _raise_rank_last(self._rank_last, frame["series_id"], frame["rank"], frame["step"])
        for sid, steps in batch.refreshed.items():
            remaining = self._stale.get(sid, set()) - steps
            if remaining:
                self._stale[sid] = remaining
            else:
                self._stale.pop(sid, None)
        for seq, (size, last) in batch.extent_written.items():
            old_size, old_last = self._extent.get(seq, (0, -1))
            self._extent[seq] = (max(old_size, size), max(old_last, last))
        self._prune_idempotency()
        return outcomes

    def _prune_idempotency(self) -> None:
        """At most hourly, forget Idempotency-Keys older than the retention. (The Bloom
        filter keeps them: a pruned key costs a lookup that finds nothing.)"""
        now = self._policy.clock()
        if now - self._last_prune < _PRUNE_EVERY:
            return
        self._last_prune = now
        try:
            self._con.execute(
                "DELETE FROM idempotency WHERE created_at < ?", [now - IDEMPOTENCY_RETENTION]
            )
        except Exception:  # housekeeping: never fails a write
            log.exception("pruning expired Idempotency-Keys")

    def _apply_alone(self, envelope: Envelope) -> Outcome:
        try:
            return self.apply([envelope])[0]
        except Exception as exc:  # a storage failure, not bad input: the client may retry
            log.exception("storage error applying %s", type(envelope.write).__name__)
            return Outcome(503, {"error": f"storage error: {type(exc).__name__}"})

    def _apply_in_transaction(self, envelopes: list[Envelope], batch: _Batch) -> list[Outcome]:
        known = self._known_idempotency(envelopes)
        now = self._policy.clock()
        batch.month = month_of(now)
        outcomes: list[Outcome] = []
        for envelope in envelopes:
            if isinstance(envelope.write, RankEvents):
                each = self._apply_rank_events(envelope.write, batch, known, now)
                outcomes.append(Outcome(200, {}, each=each))
            else:
                outcomes.append(self._apply_envelope(envelope, batch, known, now))
        return outcomes

    def _apply_envelope(
        self,
        envelope: Envelope,
        batch: _Batch,
        known: dict[tuple[int, int, int], tuple[int, int, str]],
        now: float,
    ) -> Outcome:
        idem = envelope.idempotency
        write = envelope.write
        if idem is not None:
            slot = (write.org_id, idem.key_hi, idem.key_lo)
            seen = batch.idempotency.get(slot)
            if seen is None and batch.idem_chunks:
                seen = batch.chunk_key(slot)
            if seen is None and known:
                seen = known.get(slot)
            if seen is not None:
                return _replay(seen, idem)
        if isinstance(write, (WriteRankPoints, WriteScalars)):
            # Every accepted value counts, a rewrite too; a replay (above) counts nothing.
            points = len(write.metrics)
            limit = self._limit(write.org_id)
            used = self._month_points(write.org_id, batch.month) + batch.points.get(write.org_id, 0)
            if limit is not None and used + points > limit:
                return refusal(limit, used, points, now)
            outcome = self._apply_write(write, batch)
            if outcome.status < 300:
                batch.points[write.org_id] = batch.points.get(write.org_id, 0) + points
        else:
            outcome = self._apply_write(write, batch)
        if idem is not None and 200 <= outcome.status < 300:
            accepted = outcome.body.get("accepted")
            batch.idempotency[slot] = (
                idem.fingerprint,
                outcome.status,
                _accepted_text(accepted)
                if len(outcome.body) == 1 and type(accepted) is int
                else orjson.dumps(outcome.body).decode(),
            )
        return outcome

    def _apply_rank_events(
        self,
        write: RankEvents,
        batch: _Batch,
        known: dict[tuple[int, int, int], tuple[int, int, str]],
        now: float,
    ) -> list[Outcome]:
        """Stage many rank events as columns when nothing needs deciding event by event:
        every run exists, no key was seen before or repeats, the monthly limit is out of
        reach. Otherwise each event goes through :meth:`_apply_envelope`, in order."""
        org = write.org_id
        n = len(write)
        key_hi = np.array(write.key_hi, dtype=np.int64)
        key_lo = np.array(write.key_lo, dtype=np.int64)
        names = set(map(tuple, write.metrics))  # each event's metric names, in order
        counts = [len(next(iter(names)))] * n if len(names) == 1 else list(map(len, write.metrics))
        total = sum(counts)
        limit = self._limit(org)
        used = self._month_points(org, batch.month) + batch.points.get(org, 0)
        runs = {run_id: self._lookup_run(org, run_id, batch) for run_id in set(write.run_ids)}
        plain = (
            None not in runs.values()
            and (limit is None or used + total <= limit)
            and _distinct_keys(key_hi, key_lo)
            and self._all_new(org, write, known, batch)
        )
        if not plain:
            return [self._apply_envelope(e, batch, known, now) for e in write.envelopes()]
        # Group events by (run, metric names): each group is a matrix of values.
        groups: dict[tuple[str, tuple[str, ...]], list[int]] = {}
        if len(runs) == 1 and len(names) == 1:
            groups[(write.run_ids[0], next(iter(names)))] = list(range(n))
        else:
            for i, (run_id, metrics) in enumerate(zip(write.run_ids, write.metrics)):
                groups.setdefault((run_id, tuple(metrics)), []).append(i)
        batch.seal_rank_rows()
        columns: dict[str, np.ndarray] = {
            "step": np.array(write.steps, dtype=np.int64),
            "rank": np.array(write.ranks, dtype=np.int16),
            "world_size": np.array(write.world_sizes, dtype=np.int16),
            "local_rank": np.array(write.local_ranks, dtype=np.int16),
            "weight": np.array(write.weights, dtype=np.float64),
            "ts": np.array(write.timestamps, dtype=np.float64),
            "seq": batch.seq + np.arange(n, dtype=np.int64),
        }
        batch.seq += n
        by_series: dict[int, list[dict[str, np.ndarray]]] = {}
        for (run_id, keys), members in groups.items():
            seq = runs[run_id]
            assert seq is not None
            rows: Any = np.array(members, dtype=np.int64) if len(groups) > 1 else slice(None)
            group_metrics = (
                write.metrics if len(groups) == 1 else [write.metrics[i] for i in members]
            )
            values = np.fromiter(
                chain.from_iterable(map(dict.values, group_metrics)),
                dtype=np.float64,
                count=len(members) * len(keys),
            ).reshape(len(members), len(keys))
            picked = {name: column[rows] for name, column in columns.items()}
            for j, key in enumerate(keys):
                sid = self._series_id(seq, RANK, key, batch)
                sids = np.full(len(members), sid, dtype=np.int32)
                by_series.setdefault(sid, []).append(
                    dict(picked, series_id=sids, value=values[:, j])
                )
            size, last = batch.run_extent.get(seq, (0, -1))
            batch.run_extent[seq] = (
                max(size, int(picked["world_size"].max())),
                max(last, int(picked["step"].max())),
            )
        for sid, chunks in by_series.items():
            self._stage_points(sid, _latest_points(chunks) if len(chunks) > 1 else chunks[0], batch)
        batch.points[org] = batch.points.get(org, 0) + total
        uniform = len(names) == 1
        batch.idem_chunks.append(
            {
                "org_id": np.full(n, org, dtype=np.int32),
                "key_hi": key_hi,
                "key_lo": key_lo,
                "fingerprint": np.array(write.fingerprints, dtype=np.int64),
                "status": np.full(n, 200, dtype=np.int16),
                "body": [_accepted_text(counts[0])] * n
                if uniform
                else [_accepted_text(c) for c in counts],
            }
        )
        return [_accepted(counts[0])] * n if uniform else [_accepted(c) for c in counts]

    def _all_new(
        self,
        org: int,
        write: RankEvents,
        known: dict[tuple[int, int, int], tuple[int, int, str]],
        batch: _Batch,
    ) -> bool:
        """No key of ``write`` was stored before or staged earlier in this group."""
        if not known and not batch.idempotency and not batch.idem_chunks:
            return True  # the usual case: nothing to compare with
        slots = set(zip(repeat(org), write.key_hi, write.key_lo))
        return (
            slots.isdisjoint(known)
            and slots.isdisjoint(batch.idempotency)
            and all(slots.isdisjoint(batch.chunk_index(i)) for i in range(len(batch.idem_chunks)))
        )

    def _stage_points(self, sid: int, points: dict[str, np.ndarray], batch: _Batch) -> None:
        """Stage one key's points of a RankEvents write. Steps newer than any the key has
        (the usual case: an uploader's batch holds the same new steps of every rank) get
        their reducers and scores computed here, from the last write of each rank; older
        steps are marked stale for the refresh, which recomputes them from every point the
        step has."""
        if not _one_point_per_rank(points["step"], points["rank"]):
            points = _latest_points([points])
        steps, ranks = points["step"], points["rank"]
        last = self._last_step_of(sid, batch)
        fresh = steps > last
        scores = np.full((3, len(steps)), np.nan)
        if fresh.any():
            stats, delta, z, robust = step_stats(
                steps[fresh],
                points["value"][fresh],
                points["weight"][fresh],
                points["world_size"][fresh],
            )
            scores[:, fresh] = delta, z, robust
            stats["series_id"] = np.full(len(stats["step"]), sid, dtype=np.int32)
            batch.stats_chunks.append(stats)
        points = dict(points)
        points["delta"], points["z"], points["robust_z"] = scores
        batch.rank_chunks.append(points)
        if not fresh.all():
            batch.stale.setdefault(sid, set()).update(np.unique(steps[~fresh]).tolist())
        batch.last_step[sid] = max(last, int(steps.max()))
        known = self._rank_last.get(sid)
        if known is not None:  # the key has points: any of these may rewrite one
            wide = ranks.astype(np.int64)
            missing = int(wide.max()) + 1 - len(known)
            newest = np.r_[known, np.full(missing, -1)] if missing > 0 else known
            old = np.flatnonzero(steps <= newest[wide])
            batch.rewrites.extend(zip(repeat(sid), steps[old].tolist(), wide[old].tolist()))

    def _rank_last_of(self, sid: int, rank: int) -> int:
        """The newest committed step of (series, rank); -1 if none."""
        known = self._rank_last.get(sid)
        return int(known[rank]) if known is not None and rank < len(known) else -1

    def _last_step_of(self, sid: int, batch: _Batch) -> int:
        last = batch.last_step.get(sid)
        return self._last_step.get(sid, -1) if last is None else last

    def _known_idempotency(
        self, envelopes: list[Envelope]
    ) -> dict[tuple[int, int, int], tuple[int, int, str]]:
        """Stored answers of the keys these envelopes carry, for those that have one."""
        orgs: list[np.ndarray] = []
        his: list[np.ndarray] = []
        los: list[np.ndarray] = []
        single = [
            (e.write.org_id, e.idempotency.key_hi, e.idempotency.key_lo)
            for e in envelopes
            if e.idempotency is not None
        ]
        if single:
            o, h, lw = zip(*single)
            orgs.append(np.array(o, dtype=np.int64))
            his.append(np.array(h, dtype=np.int64))
            los.append(np.array(lw, dtype=np.int64))
        for e in envelopes:
            if isinstance(e.write, RankEvents):
                orgs.append(np.full(len(e.write), e.write.org_id, dtype=np.int64))
                his.append(np.array(e.write.key_hi, dtype=np.int64))
                los.append(np.array(e.write.key_lo, dtype=np.int64))
        if not his:
            return {}
        org, hi, lo = np.concatenate(orgs), np.concatenate(his), np.concatenate(los)
        maybe = np.flatnonzero(self._key_filter.might_contain(org, hi, lo))
        if not len(maybe):
            return {}  # every key is new: the usual case, and no lookup at all
        wanted = set(zip(org[maybe].tolist(), hi[maybe].tolist(), lo[maybe].tolist()))
        found: dict[tuple[int, int, int], tuple[int, int, str]] = {}
        keys_hi = sorted({slot[1] for slot in wanted})
        for start in range(0, len(keys_hi), 1000):  # key_hi IN (...) is answered by its index
            chunk = keys_hi[start : start + 1000]
            rows = self._con.execute(
                "SELECT org_id, key_hi, key_lo, fingerprint, status, body FROM idempotency"
                f" WHERE key_hi IN ({', '.join('?' * len(chunk))})",
                chunk,
            ).fetchall()
            for o, h, lw, f, st, b in rows:
                if (o, h, lw) in wanted:
                    found[(o, h, lw)] = (f, st, b)
        return found

    def _load_key_filter(self, minimum: int = 1 << 20) -> KeyFilter:
        keys = self._con.execute("SELECT org_id, key_hi, key_lo FROM idempotency").fetchnumpy()
        key_filter = KeyFilter(max(minimum, 2 * len(keys["key_hi"])))
        key_filter.add(keys["org_id"].astype(np.int64), keys["key_hi"], keys["key_lo"])
        return key_filter

    def _delete_points(self, points: list[tuple[int, int, int]]) -> None:
        """Delete these (series, step, rank) points where they exist: a rewrite's old row."""
        sids, steps, ranks = (np.array(c, dtype=np.int64) for c in zip(*points))
        frame: dict[str, np.ndarray] = {
            "series_id": sids.astype(np.int32),
            "step": steps,
            "rank": ranks.astype(np.int16),
        }
        with self._frame("rewrites", frame) as (source, params):
            # The ranges let zone maps skip the row groups no rewrite can be in.
            self._con.execute(
                f"DELETE FROM rank_points USING {source} WHERE"
                " rank_points.series_id = rewrites.series_id AND rank_points.step = rewrites.step"
                " AND rank_points.rank = rewrites.rank"
                " AND rank_points.series_id BETWEEN ? AND ? AND rank_points.step BETWEEN ? AND ?",
                [*params, int(sids.min()), int(sids.max()), int(steps.min()), int(steps.max())],
            )

    @contextmanager
    def _rows(
        self, name: str, columns: dict[str, tuple[list[Any], Any]]
    ) -> Iterator[tuple[str, list[Any]]]:
        """A table expression over column lists, for ``INSERT ... SELECT ... FROM <it>``.

        DuckDB pays ~2 ms to scan a registered numpy frame whatever its size, and far less
        for a parameterised VALUES list of a few rows: small groups (one request) use VALUES,
        large ones (an ingest batch) the frame.
        """
        frame = {n: np.array(values, dtype=dtype) for n, (values, dtype) in columns.items()}
        with self._frame(name, frame) as source:
            yield source

    @contextmanager
    def _frame(self, name: str, frame: dict[str, np.ndarray]) -> Iterator[tuple[str, list[Any]]]:
        """:meth:`_rows` over numpy columns."""
        names = list(frame)
        size = len(frame[names[0]])
        if size <= _VALUES_MAX_ROWS:
            row = "(" + ", ".join("?" * len(names)) + ")"
            params = [v for values in zip(*(c.tolist() for c in frame.values())) for v in values]
            yield f"(VALUES {', '.join([row] * size)}) AS {name}({', '.join(names)})", params
            return
        self._con.register(name, frame)
        try:
            yield name, []
        finally:
            self._con.unregister(name)

    def _apply_write(self, write: Any, batch: _Batch) -> Outcome:
        if isinstance(write, WriteRankPoints):
            seq = self._lookup_run(write.org_id, write.run_id, batch)
            if seq is None:
                return _no_run(write.run_id)
            for key, value in write.metrics.items():
                sid = self._series_id(seq, RANK, key, batch)
                batch.stale.setdefault(sid, set()).add(write.step)
                batch.last_step[sid] = max(self._last_step_of(sid, batch), write.step)
                if write.step <= self._rank_last_of(sid, write.rank):
                    batch.rewrites.append((sid, write.step, write.rank))
                batch.rank[(sid, write.step, write.rank)] = (
                    write.world_size,
                    -1 if write.local_rank is None else write.local_rank,
                    value,
                    write.weight,
                    write.timestamp,
                )
            size, last = batch.run_extent.get(seq, (0, -1))
            batch.run_extent[seq] = (max(size, write.world_size), max(last, write.step))
            return Outcome(200, {"accepted": len(write.metrics)})
        if isinstance(write, WriteScalars):
            seq = self._lookup_run(write.org_id, write.run_id, batch)
            if seq is None:
                return _no_run(write.run_id)
            for key, value in write.metrics.items():
                sid = self._series_id(seq, SCALAR, key, batch)
                batch.scalar[(sid, write.step)] = (value, write.timestamp, write.preview)
            size, last = batch.run_extent.get(seq, (0, -1))
            batch.run_extent[seq] = (size, max(last, write.step))
            return Outcome(200, {"accepted": len(write.metrics)})
        if isinstance(write, CreateRun):
            return self._create_run(write, batch)
        if isinstance(write, Refresh):
            series = self._rank_series(write.org_id, write.run_id, write.key)
            if series is not None:
                batch.refresh.add(series)
            return Outcome(200, {})
        if isinstance(write, PatchRun):
            seq = self._lookup_run(write.org_id, write.run_id, batch)
            if seq is None:
                return _no_run(write.run_id)
            self._flush_extent(batch)
            row = _first(
                self._con.execute(
                    f"UPDATE runs SET status = ?, updated_at = ? WHERE run_seq = ?"
                    f" RETURNING {_RUN_COLUMNS}",
                    [write.status, time.time(), seq],
                )
            )
            return Outcome(200, {"run": _run_record(row).to_json()})
        if isinstance(write, WriteAttributes):
            seq = self._lookup_run(write.org_id, write.run_id, batch)
            if seq is None:
                return _no_run(write.run_id)
            for attribute in write.attributes:
                step = attribute.get("step")
                batch.attributes.append(
                    (
                        seq,
                        _text_or_none(attribute.get("path")),
                        _text_or_none(attribute.get("type")),
                        step if type(step) is int else None,
                        orjson.dumps(attribute.get("value")).decode(),
                        write.timestamp,
                    )
                )
            return Outcome(200, {"accepted": len(write.attributes)})
        raise TypeError(f"unknown write {type(write).__name__}")

    def _lookup_run(self, org_id: int, run_id: str, batch: _Batch) -> int | None:
        key = (org_id, run_id)
        return batch.new_runs.get(key) or self._runs.get(key)

    def _series_id(self, run_seq: int, kind: int, key: str, batch: _Batch) -> int:
        slot = (run_seq, kind, key)
        sid = batch.new_series.get(slot) or self._series.get(slot)
        if sid is None:
            sid = self._next_series + len(batch.new_series)
            batch.new_series[slot] = sid
        return sid

    def _create_run(self, write: CreateRun, batch: _Batch) -> Outcome:
        seq = self._lookup_run(write.org_id, write.run_id, batch)
        if seq is not None:
            self._flush_extent(batch)
            row = _first(
                self._con.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_seq = ?", [seq])
            )
            record = _run_record(row)
            if record.project != write.project:
                return Outcome(
                    409,
                    {
                        "error": f"id: run {write.run_id!r} already exists in another project"
                        f" ({record.project!r})",
                        "code": RUN_CONFLICT,
                    },
                )
            return Outcome(200, {"run": record.to_json()})
        seq = self._next_run + len(batch.new_runs)
        now = time.time()
        inserted = self._con.execute(
            f"INSERT INTO runs VALUES (?, ?, ?, ?, ?, 'running', ?, ?, ?, ?, ?, NULL, NULL)"
            f" RETURNING {_RUN_COLUMNS}",
            [
                seq,
                write.org_id,
                write.run_id,
                write.project,
                write.name,
                orjson.dumps(write.config).decode(),
                orjson.dumps(write.tags).decode(),
                orjson.dumps(write.metadata).decode(),
                now,
                now,
            ],
        )
        row = _first(inserted)
        batch.new_runs[(write.org_id, write.run_id)] = seq
        return Outcome(201, {"run": _run_record(row).to_json()})

    def _flush_extent(self, batch: _Batch) -> None:
        changed = {
            seq: extent
            for seq, extent in batch.run_extent.items()
            if _grows(self._extent.get(seq), extent)
        }
        batch.run_extent.clear()
        if not changed:
            return
        seqs = list(changed)
        sizes = [changed[q][0] for q in seqs]
        lasts = [changed[q][1] for q in seqs]
        with self._rows(
            "ext", {"seq": (seqs, np.int32), "size": (sizes, np.int32), "last": (lasts, np.int64)}
        ) as (source, params):
            self._con.execute(
                "UPDATE runs SET world_size = CASE WHEN ext.size > 0"
                " THEN greatest(coalesce(world_size, 0), ext.size) ELSE world_size END,"
                " last_step = greatest(coalesce(last_step, -1), ext.last), updated_at = ?"
                f" FROM {source} WHERE runs.run_seq = ext.seq",
                [time.time(), *params],
            )
        batch.extent_written.update(changed)

    def _flush(self, batch: _Batch, replace: bool) -> None:
        con = self._con
        self._flush_extent(batch)
        if batch.new_series:
            con.executemany(
                "INSERT INTO series VALUES (?, ?, ?, ?)",
                [[sid, run, kind, key] for (run, kind, key), sid in batch.new_series.items()],
            )
            self._next_series += len(batch.new_series)
        self._next_run += len(batch.new_runs)
        batch.seal_rank_rows()
        if batch.rank_chunks:
            if batch.rewrites:
                self._delete_points(batch.rewrites)
            batch.points_frame = _latest_points(batch.rank_chunks)
            with self._frame("rank_batch", batch.points_frame) as (source, params):
                con.execute(
                    "INSERT INTO rank_points"
                    " (series_id, step, rank, world_size, local_rank, value, weight, ts,"
                    " delta, z, robust_z)"
                    " SELECT series_id, step, rank, world_size, nullif(local_rank, -1), value,"
                    " weight, ts, CASE WHEN isnan(delta) THEN NULL ELSE delta END,"
                    " CASE WHEN isnan(z) THEN NULL ELSE z END,"
                    f" CASE WHEN isnan(robust_z) THEN NULL ELSE robust_z END FROM {source}",
                    params,
                )
            if batch.stats_chunks:
                names = ("series_id", *duckdb_summary.STATS_COLUMNS)
                stats = {n: np.concatenate([c[n] for c in batch.stats_chunks]) for n in names}
                with self._frame("stats_batch", stats) as (source, params):
                    listed = ", ".join(names)
                    con.execute(
                        f"INSERT INTO step_stats ({listed}) SELECT {listed} FROM {source}",
                        params,
                    )
        if batch.stale:
            stale = {
                "series_id": np.concatenate(
                    [np.full(len(steps), sid, dtype=np.int32) for sid, steps in batch.stale.items()]
                ),
                "step": np.concatenate(
                    [
                        np.fromiter(steps, dtype=np.int64, count=len(steps))
                        for steps in batch.stale.values()
                    ]
                ),
            }
            with self._frame("stale_batch", stale) as (source, params):
                con.execute(f"INSERT INTO stale_steps SELECT series_id, step FROM {source}", params)
        if batch.scalar:
            keys2 = list(batch.scalar)
            rest2 = list(batch.scalar.values())
            columns: dict[str, tuple[list[Any], Any]] = {
                "series_id": ([k[0] for k in keys2], np.int32),
                "step": ([k[1] for k in keys2], np.int64),
                "value": ([r[0] for r in rest2], np.float64),
                "ts": ([r[1] for r in rest2], np.float64),
                "preview": ([r[2] for r in rest2], np.bool_),
            }
            with self._rows("scalar_batch", columns) as (source, params):
                con.execute(
                    f"INSERT {'OR REPLACE ' if replace else ''}INTO scalar_points"
                    f" SELECT series_id, step, value, ts, preview FROM {source}",
                    params,
                )
        if batch.attributes:
            first = self._next_attr
            con.executemany(
                "INSERT INTO attributes VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    [run, first + i, path, kind, step, value, ts]
                    for i, (run, path, kind, step, value, ts) in enumerate(batch.attributes)
                ],
            )
            self._next_attr += len(batch.attributes)
        if batch.points:
            orgs = list(batch.points)
            with self._rows(
                "usage_batch",
                {
                    "org_id": (orgs, np.int32),
                    "month": ([batch.month] * len(orgs), object),
                    "points": ([batch.points[o] for o in orgs], np.int64),
                },
            ) as (source, params):
                con.execute(
                    f"INSERT INTO usage_log SELECT org_id, month, points FROM {source}", params
                )
        chunks = list(batch.idem_chunks)
        if batch.idempotency:
            key_orgs, his, los = zip(*batch.idempotency)
            prints, codes, bodies = zip(*batch.idempotency.values())
            chunks.append(
                {
                    name: np.array(column, dtype=dtype)
                    for (name, dtype), column in zip(
                        _IDEMPOTENCY_COLUMNS.items(),
                        (key_orgs, his, los, prints, codes, bodies),
                        strict=True,
                    )
                }
            )
        if chunks:
            frame = {
                name: np.concatenate([np.asarray(c[name], dtype=dtype) for c in chunks])
                for name, dtype in _IDEMPOTENCY_COLUMNS.items()
            }
            batch.stored_keys = (frame["org_id"], frame["key_hi"], frame["key_lo"])
            with self._frame("idem_batch", frame) as (source, params):
                con.execute(
                    "INSERT INTO idempotency SELECT org_id, key_hi, key_lo, fingerprint, status,"
                    f" body, ? FROM {source}",
                    [self._policy.clock(), *params],
                )

    # ---- tenancy ----

    def _limit(self, org_id: int) -> int | None:
        override = self._limits.get(org_id)
        return override if override is not None else self._policy.default_limit

    def _month_points(self, org_id: int, month: str) -> int:
        slot = (org_id, month)
        used = self._used.get(slot)
        if used is None:
            rows = self._con.execute(
                "SELECT coalesce(sum(points), 0) FROM usage_log WHERE org_id = ? AND month = ?",
                [org_id, month],
            ).fetchall()
            used = self._used[slot] = int(rows[0][0])
        return used

    def org_id(self, name: str) -> int | None:
        rows = self._cursor().execute("SELECT org_id FROM orgs WHERE name = ?", [name]).fetchall()
        return int(rows[0][0]) if rows else None

    def org_name(self, org_id: int) -> str | None:
        rows = self._cursor().execute("SELECT name FROM orgs WHERE org_id = ?", [org_id]).fetchall()
        return str(rows[0][0]) if rows else None

    def list_api_keys(self, org_id: int | None) -> list[dict[str, Any]]:
        rows = (
            self._cursor()
            .execute(
                "SELECT k.key_id, o.name, k.scopes, k.created_at, k.revoked_at FROM api_keys k"
                " JOIN orgs o USING (org_id) WHERE ? IS NULL OR k.org_id = ? ORDER BY k.created_at",
                [org_id, org_id],
            )
            .fetchall()
        )
        return [
            {
                "key_id": kid,
                "org": org,
                "scopes": sorted(scopes.split(",")),
                "created_at": created,
                "revoked_at": revoked,
            }
            for kid, org, scopes, created, revoked in rows
        ]

    def revoke_api_key(self, key_id: str, org_id: int | None) -> bool:
        rows = (
            self._cursor()
            .execute(
                "UPDATE api_keys SET revoked_at = ? WHERE key_id = ? AND revoked_at IS NULL"
                " AND (? IS NULL OR org_id = ?) RETURNING key_id",
                [time.time(), key_id, org_id, org_id],
            )
            .fetchall()
        )
        return bool(rows)

    def usage(self, org_id: int) -> dict[str, Any]:
        now = self._policy.clock()
        month = month_of(now)
        rows = (
            self._cursor()
            .execute(
                "SELECT coalesce(sum(points), 0) FROM usage_log WHERE org_id = ? AND month = ?",
                [org_id, month],
            )
            .fetchall()
        )
        return {
            "month": month,
            "used": int(rows[0][0]) if rows else 0,
            "limit": self._limit(org_id),
            "reset_at": reset_at(now),
        }

    def set_monthly_limit(self, org_id: int, limit: int | None) -> None:
        self._cursor().execute(
            "UPDATE orgs SET monthly_limit = ? WHERE org_id = ?", [limit, org_id]
        )
        self._limits[org_id] = limit

    # ---- the Distributed summary ----

    def rank_keys(self, org_id: int, run_id: str) -> list[str] | None:
        seq = self._run_seq(org_id, run_id)
        if seq is None:
            return None
        return sorted(key for (run, kind, key) in list(self._series) if run == seq and kind == RANK)

    def _rank_series(self, org_id: int, run_id: str, key: str) -> int | None:
        seq = self._run_seq(org_id, run_id)
        return None if seq is None else self._series.get((seq, RANK, key))

    def needs_refresh(self, org_id: int, run_id: str, key: str) -> bool:
        sid = self._rank_series(org_id, run_id, key)
        return sid is not None and bool(self._stale.get(sid))

    def distributed_summary(
        self, org_id: int, run_id: str, key: str, params: SummaryParams
    ) -> dict[str, Any]:
        sid = self._rank_series(org_id, run_id, key)
        if sid is None:
            raise LookupError(key)
        return duckdb_summary.summary(self._cursor(), sid, params)

    def backlog(self) -> int:
        return sum(len(steps) for steps in self._stale.values())

    def maintain(self) -> bool:
        """Refresh up to a few thousand stale steps of one series in one transaction."""
        if not self._stale:
            return False
        sid, steps = next(iter(self._stale.items()))
        chunk = sorted(steps)[:_REFRESH_CHUNK]
        con = self._con
        con.execute("BEGIN TRANSACTION")
        try:
            duckdb_summary.refresh(con, sid, chunk)
            con.execute("COMMIT")
        except Exception:
            con.execute("ROLLBACK")
            log.exception("refreshing summary aggregates of series %s", sid)
            return False
        steps.difference_update(chunk)
        if not steps:
            self._stale.pop(sid, None)
        return bool(self._stale)

    def close(self) -> None:
        self._con.close()


@lru_cache(maxsize=1024)
def _accepted_text(accepted: int) -> str:
    # The stored answer of nearly every metric write: serialise each count once.
    return orjson.dumps({"accepted": accepted}).decode()


@lru_cache(maxsize=1024)
def _accepted(accepted: int) -> Outcome:
    # Shared: nothing changes an Outcome once the store has answered with it.
    return Outcome(200, {"accepted": accepted})


def _latest_points(chunks: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Staged points as one frame, keeping only the latest write (highest ``seq``) of each
    (series, step, rank): one INSERT may not carry a point twice."""
    names = chunks[0].keys()
    frame = {name: np.concatenate([c[name] for c in chunks]) for name in names}
    sid, step, rank = frame["series_id"], frame["step"], frame["rank"]
    order = np.lexsort((frame["seq"], rank, step, sid))
    s_sid, s_step, s_rank = sid[order], step[order], rank[order]
    last = np.ones(len(order), dtype=bool)
    last[:-1] = (
        (s_sid[1:] != s_sid[:-1]) | (s_step[1:] != s_step[:-1]) | (s_rank[1:] != s_rank[:-1])
    )
    if last.all():
        return frame
    keep = np.sort(order[last])
    return {name: column[keep] for name, column in frame.items()}


def _raise_rank_last(
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


def _distinct_keys(key_hi: np.ndarray, key_lo: np.ndarray) -> bool:
    """No Idempotency-Key twice (a repeat within one batch is answered as a replay)."""
    if len(np.unique(key_hi)) == len(key_hi):
        return True
    return len(set(zip(key_hi.tolist(), key_lo.tolist()))) == len(key_hi)


def _one_point_per_rank(steps: np.ndarray, ranks: np.ndarray) -> bool:
    order = np.lexsort((ranks, steps))
    s, r = steps[order], ranks[order]
    return not bool(((s[1:] == s[:-1]) & (r[1:] == r[:-1])).any())


def _grows(known: tuple[int, int] | None, extent: tuple[int, int]) -> bool:
    return known is None or extent[0] > known[0] or extent[1] > known[1]


def _first(result: duckdb.DuckDBPyConnection) -> tuple[Any, ...]:
    # fetchall, not fetchone: DuckDB keeps a half-read result open on the connection.
    rows = result.fetchall()
    if not rows:
        raise LookupError("query returned no row")
    return rows[0]


def _replay(seen: tuple[int, int, str], idem: Idempotency) -> Outcome:
    fingerprint, status, body = seen
    if fingerprint != idem.fingerprint:
        return Outcome(
            422,
            {"error": "Idempotency-Key: this key was already used with a different request body"},
        )
    return Outcome(status, orjson.loads(body), replayed=True)


def _no_run(run_id: str) -> Outcome:
    return Outcome(404, {"error": f"run {run_id!r} not found"})


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None
