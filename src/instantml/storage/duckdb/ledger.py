"""Idempotency-Key claims and answers, and usage, in DuckDB.

Process-local, and safe only because one process owns the file (docs/decisions.md): the
in-flight claims (a set), a Bloom filter of every stored key (so a new key, nearly every
key, needs no lookup), and each org's count of this month's points (the usage table is
append-only and summed on a miss). A shared metadata store replaces all three with rows.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

import numpy as np

from ..records import Keys, Slot, StoredAnswer
from .engine import Engine
from .keyfilter import GrowingKeyFilter

SCHEMA = """
-- Append-only (one row per unit that charged points; read as a SUM): a plain insert
-- costs a third of an upsert, and every write group pays it.
CREATE TABLE IF NOT EXISTS usage_log (
    org_id INTEGER NOT NULL, month VARCHAR NOT NULL, points BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS idempotency (
    org_id INTEGER NOT NULL, key_hi BIGINT NOT NULL, key_lo BIGINT NOT NULL,
    fingerprint BIGINT NOT NULL, status SMALLINT NOT NULL, body VARCHAR NOT NULL,
    created_at DOUBLE NOT NULL);
CREATE INDEX IF NOT EXISTS idempotency_key_hi ON idempotency (key_hi);
"""
log = logging.getLogger(__name__)
_IDEMPOTENCY_COLUMNS = {
    "org_id": np.int32,
    "key_hi": np.int64,
    "key_lo": np.int64,
    "fingerprint": np.int64,
    "status": np.int16,
    "body": object,
    "created_at": np.float64,
}


class _Marks:
    """One ordered upload's completed batches (the newest ``_KEPT_MARKS`` of them)."""

    __slots__ = ("floor", "marks", "used")

    def __init__(self) -> None:
        self.floor = 0  # every batch below it completed cleanly (its mark was let go)
        self.marks: dict[int, bool] = {}
        self.used = time.monotonic()


_KEPT_MARKS = 1024  # an uploader keeps 2 batches in flight: older marks are never asked for
_IDLE_SESSION = 3600.0  # an ordered upload unused this long is forgotten


class _Staged:
    def __init__(self) -> None:
        self.charges: dict[tuple[int, str], int] = {}
        self.answers: list[dict[str, np.ndarray]] = []


class DuckDBLedger:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        engine.con.execute(SCHEMA)
        self._claims: set[Slot] = set()
        self._claims_lock = threading.Lock()
        self._uploads: dict[tuple[int, str], _Marks] = {}  # guarded by the claims' lock
        self._used: dict[tuple[int, str], int] = {}
        self._filter = self._load_filter()
        self._staged = _Staged()
        engine.join(self)

    # ---- claims: keys whose first request is being applied ----

    def claim(self, slots: set[Slot]) -> set[Slot]:
        with self._claims_lock:
            busy = slots & self._claims
            self._claims.update(slots - busy if busy else slots)
        return busy

    def release(self, slots: set[Slot]) -> None:
        with self._claims_lock:
            self._claims.difference_update(slots)

    # ---- answers ----

    def lookup(self, keys: Keys) -> dict[Slot, StoredAnswer]:
        if not len(keys):
            return {}
        org, hi, lo = keys.org, keys.hi, keys.lo
        maybe = np.flatnonzero(self._filter.might_contain(org, hi, lo))
        if not len(maybe):
            return {}  # every key is new: the usual case, and no lookup at all
        wanted = set(zip(org[maybe].tolist(), hi[maybe].tolist(), lo[maybe].tolist()))
        found: dict[Slot, StoredAnswer] = {}
        keys_hi = sorted({slot[1] for slot in wanted})
        cur = self._engine.con if self._engine.in_unit else self._engine.cursor()
        for start in range(0, len(keys_hi), 1000):  # key_hi IN (...) is answered by its index
            chunk = keys_hi[start : start + 1000]
            rows = cur.execute(
                "SELECT org_id, key_hi, key_lo, fingerprint, status, body FROM idempotency"
                f" WHERE key_hi IN ({', '.join('?' * len(chunk))})",
                chunk,
            ).fetchall()
            for o, h, lw, fingerprint, status, body in rows:
                if (o, h, lw) in wanted:
                    found[(o, h, lw)] = StoredAnswer(fingerprint, status, body)
        return found

    def record(
        self,
        org: np.ndarray,
        key_hi: np.ndarray,
        key_lo: np.ndarray,
        fingerprint: np.ndarray,
        status: np.ndarray,
        body: Sequence[str],
        created_at: float,
    ) -> None:
        columns = (org, key_hi, key_lo, fingerprint, status, body, np.full(len(body), created_at))
        self._staged.answers.append(
            {
                name: np.asarray(column, dtype=dtype)
                for (name, dtype), column in zip(_IDEMPOTENCY_COLUMNS.items(), columns, strict=True)
            }
        )

    def prune(self, before: float) -> None:
        self._engine.cursor().execute("DELETE FROM idempotency WHERE created_at < ?", [before])

    # ---- ordered uploads: in memory, as the claims (one process sees every batch) ----

    def mark_batch(self, org_id: int, session: str, seq: int, clean: bool) -> None:
        with self._claims_lock:
            upload = self._uploads.get((org_id, session))
            if upload is None:
                now = time.monotonic()
                for idle in [k for k, v in self._uploads.items() if v.used < now - _IDLE_SESSION]:
                    del self._uploads[idle]
                upload = self._uploads[(org_id, session)] = _Marks()
            upload.used = time.monotonic()
            if seq < upload.floor or seq in upload.marks:
                return
            upload.marks[seq] = clean
            if len(upload.marks) > 2 * _KEPT_MARKS:
                newest = max(upload.marks)
                upload.floor = newest - _KEPT_MARKS
                upload.marks = {q: c for q, c in upload.marks.items() if q >= upload.floor}

    def batch_marks(self, org_id: int, session: str, seqs: Sequence[int]) -> dict[int, bool]:
        with self._claims_lock:
            upload = self._uploads.get((org_id, session))
            if upload is None:
                return {}
            upload.used = time.monotonic()
            return {
                q: True if q < upload.floor else upload.marks[q]
                for q in seqs
                if q < upload.floor or q in upload.marks
            }

    # ---- usage ----

    def _committed_used(self, org_id: int, month: str) -> int:
        slot = (org_id, month)
        used = self._used.get(slot)
        if used is not None:
            return used
        in_unit = self._engine.in_unit
        cur = self._engine.con if in_unit else self._engine.cursor()
        rows = cur.execute(
            "SELECT coalesce(sum(points), 0) FROM usage_log WHERE org_id = ? AND month = ?",
            [org_id, month],
        ).fetchall()
        used = int(rows[0][0])
        if in_unit:
            # Only the writing thread fills the count: a read on another thread may race a
            # commit, and a count that missed a charge would let the limit be overshot.
            self._used[slot] = used
        return used

    def used(self, org_id: int, month: str) -> int:
        used = self._committed_used(org_id, month)
        if self._engine.in_unit:  # the unit's own charges; other threads see committed ones
            used += self._staged.charges.get((org_id, month), 0)
        return used

    def charge(self, org_id: int, month: str, points: int, limit: int | None) -> bool:
        used = self.used(org_id, month)
        if limit is not None and used + points > limit:
            return False
        slot = (org_id, month)
        self._staged.charges[slot] = self._staged.charges.get(slot, 0) + points
        return True

    # ---- the unit ----

    def begin(self) -> None:
        self._staged = _Staged()

    def flush(self) -> None:
        engine, staged = self._engine, self._staged
        charges = {slot: n for slot, n in staged.charges.items() if n}
        if charges:
            slots = list(charges)
            with engine.rows(
                "usage_batch",
                {
                    "org_id": ([o for o, _ in slots], np.int32),
                    "month": ([m for _, m in slots], object),
                    "points": ([charges[s] for s in slots], np.int64),
                },
            ) as (source, params):
                engine.con.execute(
                    f"INSERT INTO usage_log SELECT org_id, month, points FROM {source}", params
                )
        if staged.answers:
            chunks = staged.answers
            frame = {
                name: np.concatenate([np.asarray(c[name], dtype=dtype) for c in chunks])
                if len(chunks) > 1
                else chunks[0][name]
                for name, dtype in _IDEMPOTENCY_COLUMNS.items()
            }
            staged.answers = [frame]
            with engine.frame("idem_batch", frame) as (source, params):
                engine.con.execute(
                    "INSERT INTO idempotency SELECT org_id, key_hi, key_lo, fingerprint, status,"
                    f" body, created_at FROM {source}",
                    params,
                )

    def committed(self) -> None:
        staged = self._staged
        for slot, points in staged.charges.items():
            if slot in self._used:  # charge() read it first; else the next read sums the log
                self._used[slot] += points
        if staged.answers:
            frame = staged.answers[0]
            self._filter.add(frame["org_id"].astype(np.int64), frame["key_hi"], frame["key_lo"])
        self._staged = _Staged()

    def rolled_back(self) -> None:
        self._staged = _Staged()

    def _load_filter(self, minimum: int = 1 << 20) -> GrowingKeyFilter:
        keys = self._engine.con.execute(
            "SELECT org_id, key_hi, key_lo FROM idempotency"
        ).fetchnumpy()
        key_filter = GrowingKeyFilter(max(minimum, 2 * len(keys["key_hi"])))
        key_filter.add(keys["org_id"].astype(np.int64), keys["key_hi"], keys["key_lo"])
        return key_filter
