"""Idempotency-Key claims and answers, and usage, in DuckDB.

Process-local, and safe only because one process owns the file (docs/architecture.md): the
in-flight claims (a set), what every stored key is known by in memory (so a new key, nearly
every key, needs no lookup: ranges of n for keys ``<prefix>-<n>``, a Bloom filter for any
other), and each org's count of this month's points (the usage table is append-only and
summed on a miss; a unit's charge is written with its run's growth, ``growth.py``). A
shared metadata store replaces all three with rows.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

import duckdb
import numpy as np

from ..records import Keys, Slot, StoredAnswer
from .engine import Engine
from .growth import RunGrowth
from .keyfilter import KeyFilter, hashes
from .keyranges import KeyRanges, idents
from .upload_marks import UploadMarks

# Idempotency-Key answers, in partitions: tables of at most PARTITION_KEYS keys each, filled
# in turn, each known in memory by the ranges of its keys ``<prefix>-<n>`` (keyranges.py:
# the SDK's and the spool's keys, a few hundred ranges a partition) and a Bloom filter of
# its other keys (keyfilter.py; made only for a partition that has some, or whose keys
# make more than RANGE_LIMIT ranges: it then takes those). Only the newest is written,
# and only it has an index (on key_hi). One table of every retained key, indexed, cost more
# at each checkpoint as keys accumulated (DuckDB rewrites a changed table's index, so a
# write's tail latency grew with the keys retained), and DuckDB keeps an
# index's pages in memory once read (the soak's server grew by the index's size until the
# cache cap refused queries). So a partition's index is dropped when the next one begins:
# a key its ranges or filter may hold (a retry's, nearly always in the newest) is looked for
# by a scan of its 2M keys. An expired partition is dropped whole. Partition 0 is the table
# ``idempotency`` (a store from before partitions has all its keys there; one from before
# ranges has no seq columns, its keys all go to the filters).
PARTITION_KEYS = 2_000_000
RANGE_LIMIT = 1 << 16
# The frozen partitions' ranges are merged into one set (one check whatever their number)
# up to this many ranges; beyond, a partition's are checked on their own (keys such as
# "<uuid>-1", each its own range, can fill RANGE_LIMIT in every partition).
FROZEN_LIMIT = 1 << 20
PARTITION_SCHEMA = """
CREATE TABLE IF NOT EXISTS {table} (
    org_id INTEGER NOT NULL, key_hi BIGINT NOT NULL, key_lo BIGINT NOT NULL,
    fingerprint BIGINT NOT NULL, status SMALLINT NOT NULL, body VARCHAR NOT NULL,
    created_at DOUBLE NOT NULL, seq BIGINT, seq_n BIGINT);
CREATE INDEX IF NOT EXISTS {table}_key_hi ON {table} (key_hi);
"""
# An org's month's usage: the folded charges, and those of units not yet folded (growth.py).
USED = (
    "SELECT (SELECT coalesce(sum(points), 0) FROM usage_log WHERE org_id = ? AND month = ?)"
    " + (SELECT coalesce(sum(charged), 0) FROM run_growth WHERE org_id = ? AND month = ?)"
)
SEQ_COLUMNS = """
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS seq BIGINT;
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS seq_n BIGINT;
"""


def partition_table(number: int) -> str:
    return "idempotency" if number == 0 else f"idempotency_{number}"


log = logging.getLogger(__name__)
_IDEMPOTENCY_COLUMNS = {
    "org_id": np.int32,
    "key_hi": np.int64,
    "key_lo": np.int64,
    "fingerprint": np.int64,
    "status": np.int16,
    "body": object,
    "created_at": np.float64,
    "seq": np.int64,
    "seq_n": np.int64,
}


class _Staged:
    def __init__(self) -> None:
        self.charges: dict[tuple[int, str], int] = {}
        self.answers: list[dict[str, np.ndarray]] = []
        self.partition: tuple[int, int] | None = None  # (newest partition, its keys) on commit


class DuckDBLedger:
    shared_claims = False  # one process holds the file: its claims are a set in memory

    def __init__(self, engine: Engine, growth: RunGrowth) -> None:
        self._engine = engine
        self._growth = growth
        self._partitions = self._find_partitions()
        for number in self._partitions:
            engine.run(SEQ_COLUMNS.format(table=partition_table(number)))
        for number in self._partitions[:-1]:  # a store from before: only the newest indexed
            engine.run(f"DROP INDEX IF EXISTS {partition_table(number)}_key_hi")
        self._newest_keys = engine.run(
            f"SELECT count(*) FROM {partition_table(self._partitions[-1])}"
        ).fetchall()[0][0]
        self._claims: set[Slot] = set()
        self._claims_lock = threading.Lock()
        self._owned: dict[int, set[Slot]] = {}  # each owner's claims
        self._uploads = UploadMarks()
        self._used: dict[tuple[int, str], int] = {}
        # What each partition's keys are known by (replaced, never changed in place, but for
        # a filter's bits: a lookup on another thread reads them as they were).
        self._ranges: dict[int, KeyRanges] = {}
        self._filters: dict[int, KeyFilter] = {}
        self._ranges_full: set[int] = set()  # its keys beyond RANGE_LIMIT ranges: to the filter
        for number in self._partitions:
            self._load(number)
        self._frozen, self._apart = self._merged(self._partitions[:-1])
        engine.join(self)

    @property
    def _staged(self) -> _Staged:
        """This thread's unit's staging (outside a unit: an empty one)."""
        staged: _Staged = self._engine.staged(self)
        return staged

    # ---- claims: keys whose first request is being applied ----

    def claim(self, slots: set[Slot], owner: int) -> set[Slot]:
        with self._claims_lock:
            busy = slots & self._claims
            taken = slots - busy if busy else slots
            if taken:  # an owner with nothing taken never releases: keep no entry for it
                self._claims.update(taken)
                self._owned.setdefault(owner, set()).update(taken)
        return busy

    def release(self, owner: int) -> None:
        with self._claims_lock:
            self._claims.difference_update(self._owned.pop(owner, ()))

    # ---- answers ----

    def lookup(self, keys: Keys) -> dict[Slot, StoredAnswer]:
        if not len(keys):
            return {}
        partitions, ranges, filters, apart = (
            self._partitions, self._ranges, self._filters, self._apart
        )  # fmt: skip
        org, hi, lo, n = keys.org, keys.hi, keys.lo, keys.n
        ident = idents(org, keys.seq)
        empty = KeyRanges()
        # Keys ``<prefix>-<n>`` stored anywhere: one check against the frozen partitions'
        # ranges (merged) and one against the newest's; none, for a batch of new keys.
        held = self._frozen.contains(ident, n) | ranges.get(partitions[-1], empty).contains(
            ident, n
        )
        for number in apart:
            held |= ranges.get(number, empty).contains(ident, n)
        maybe = np.flatnonzero((n >= 0) & held)
        h = hashes(org, hi, lo) if filters else None
        found: dict[Slot, StoredAnswer] = {}
        cur = self._engine.con if self._engine.in_unit else self._engine.cursor()
        # Newest partition first (a retry is most often of a recent key); only the keys its
        # ranges or filter may hold.
        for number in reversed(partitions):
            look = maybe[ranges.get(number, empty).contains(ident[maybe], n[maybe])]
            key_filter = filters.get(number)
            if key_filter is not None and h is not None:
                look = np.union1d(look, np.flatnonzero(key_filter.might_contain(*h)))
            if not len(look):
                continue
            wanted = set(zip(org[look].tolist(), hi[look].tolist(), lo[look].tolist()))
            keys_hi = sorted({slot[1] for slot in wanted if slot not in found})
            for start in range(0, len(keys_hi), 1000):
                chunk = keys_hi[start : start + 1000]
                try:
                    rows = cur.execute(
                        "SELECT org_id, key_hi, key_lo, fingerprint, status, body FROM"
                        f" {partition_table(number)}"
                        f" WHERE key_hi IN ({', '.join('?' * len(chunk))})",
                        chunk,
                    ).fetchall()
                except duckdb.CatalogException:  # expired and dropped since the list was read
                    break
                for o, h_, lw, fingerprint, status, body in rows:
                    if (o, h_, lw) in wanted:
                        found[(o, h_, lw)] = StoredAnswer(fingerprint, status, body)
        return found

    def record(
        self,
        keys: Keys,
        fingerprint: np.ndarray,
        status: np.ndarray,
        body: Sequence[str],
        created_at: float,
    ) -> None:
        stamps = np.full(len(body), created_at)
        columns = (keys.org, keys.hi, keys.lo, fingerprint, status, body, stamps, keys.seq, keys.n)
        self._staged.answers.append(
            {
                name: np.asarray(column, dtype=dtype)
                for (name, dtype), column in zip(_IDEMPOTENCY_COLUMNS.items(), columns, strict=True)
            }
        )

    def prune(self, before: float) -> None:
        """Forget keys older than ``before``: a partition whose keys all are is dropped
        whole (partitions are filled in time order, so only the one or two that span
        ``before`` have rows deleted, and their index rewritten)."""
        cur = self._engine.cursor()
        for number in list(self._partitions):
            table = partition_table(number)
            oldest, newest = cur.execute(
                f"SELECT min(created_at), max(created_at) FROM {table}"
            ).fetchall()[0]
            if oldest is None or oldest >= before:
                continue
            if newest < before and number != self._partitions[-1]:
                cur.execute(f"DROP TABLE {table}")
                self._partitions = [n for n in self._partitions if n != number]
                self._ranges = {n: r for n, r in self._ranges.items() if n != number}
                self._frozen, self._apart = self._merged(self._partitions[:-1])
                self._filters = {n: f for n, f in self._filters.items() if n != number}
                self._ranges_full.discard(number)
            else:
                cur.execute(f"DELETE FROM {table} WHERE created_at < ?", [before])

    def _find_partitions(self) -> list[int]:
        names = self._engine.run(
            "SELECT table_name FROM information_schema.tables WHERE table_name = 'idempotency'"
            " OR regexp_full_match(table_name, 'idempotency_[0-9]+')"
        ).fetchall()
        numbers = sorted(0 if name == "idempotency" else int(name[12:]) for (name,) in names)
        if not numbers:
            self._engine.run(PARTITION_SCHEMA.format(table=partition_table(0)))
            numbers = [0]
        return numbers

    # ---- ordered uploads: in memory, as the claims (one process sees every batch) ----

    def mark_batch(self, org_id: int, session: str, seq: int, clean: bool) -> None:
        self._uploads.mark(org_id, session, seq, clean)

    def batch_marks(self, org_id: int, session: str, seqs: Sequence[int]) -> dict[int, bool]:
        return self._uploads.marks(org_id, session, seqs)

    # ---- usage ----

    def _committed_used(self, org_id: int, month: str) -> int:
        slot = (org_id, month)
        used = self._used.get(slot)
        if used is not None:
            return used
        in_unit = self._engine.in_unit
        cur = self._engine.con if in_unit else self._engine.cursor()
        rows = cur.execute(USED, [org_id, month, org_id, month]).fetchall()
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
        self._growth.charge(org_id, month, points)  # written with the unit's run growth
        return True

    # ---- the unit ----

    def begin(self) -> _Staged:
        return _Staged()

    def flush(self, staged: _Staged) -> None:
        engine = self._engine
        if staged.answers:
            chunks = staged.answers
            frame = {
                name: np.concatenate([np.asarray(c[name], dtype=dtype) for c in chunks])
                if len(chunks) > 1
                else chunks[0][name]
                for name, dtype in _IDEMPOTENCY_COLUMNS.items()
            }
            staged.answers = [frame]
            newest, keys = self._partitions[-1], self._newest_keys
            if keys and keys + len(frame["key_hi"]) > PARTITION_KEYS:
                # Begun in this unit (gone with a rollback); the full one loses its index.
                engine.run(f"DROP INDEX IF EXISTS {partition_table(newest)}_key_hi")
                newest, keys = newest + 1, 0
                engine.run(PARTITION_SCHEMA.format(table=partition_table(newest)))
            staged.partition = (newest, keys + len(frame["key_hi"]))
            with engine.frame("idem_batch", frame) as (source, params):
                engine.run(
                    f"INSERT INTO {partition_table(newest)} SELECT org_id, key_hi, key_lo,"
                    f" fingerprint, status, body, created_at, seq, seq_n FROM {source}",
                    params,
                )

    def committed(self, staged: _Staged) -> None:
        for slot, points in staged.charges.items():
            if slot in self._used:  # charge() read it first; else the next read sums the log
                self._used[slot] += points
        if staged.partition is not None:
            newest, self._newest_keys = staged.partition
            if newest != self._partitions[-1]:  # the newest before is full: frozen
                self._frozen, self._apart = self._merged(
                    [self._partitions[-1]], self._frozen, self._apart
                )
            self._know(newest, staged.answers[0])
            if newest != self._partitions[-1]:
                self._partitions = [*self._partitions, newest]

    def _know(self, number: int, keys: dict[str, np.ndarray]) -> None:
        """Add stored keys (columns of the partition) to what their partition is known by:
        keys ``<prefix>-<n>`` to its ranges while they stay within RANGE_LIMIT, the rest to
        its filter."""
        n = keys["seq_n"]
        ranged = n >= 0
        if ranged.any() and number not in self._ranges_full:
            ident = idents(keys["org_id"][ranged], keys["seq"][ranged])
            try:
                ranges = self._ranges.get(number, KeyRanges()).union(KeyRanges.of(ident, n[ranged]))
            except OverflowError:  # more prefixes than one set can hold: far past the limit
                ranges = None
            if ranges is not None and len(ranges) <= RANGE_LIMIT:
                self._ranges = {**self._ranges, number: ranges}
            else:  # not sequences after all (random n, say): a filter holds them better
                self._ranges_full.add(number)
                ranged = np.zeros(len(n), dtype=bool)
        else:
            ranged = np.zeros(len(n), dtype=bool)
        if number not in self._ranges:
            self._ranges = {**self._ranges, number: KeyRanges()}
        rest = ~ranged
        if rest.any():
            key_filter = self._filters.get(number)
            if key_filter is None:  # a store from before partitions may hold more
                key_filter = KeyFilter(max(PARTITION_KEYS, len(n)))
            key_filter.add(
                *hashes(keys["org_id"][rest], keys["key_hi"][rest], keys["key_lo"][rest])
            )
            self._filters = {**self._filters, number: key_filter}

    def _merged(
        self, frozen: list[int], into: KeyRanges | None = None, apart: tuple[int, ...] = ()
    ) -> tuple[KeyRanges, tuple[int, ...]]:
        """These frozen partitions' ranges merged into ``into`` (the set merged so far)
        while within FROZEN_LIMIT, and ``apart`` with the partitions left apart (checked
        one by one): at start, after a prune, and when a partition fills."""
        merged = [into or KeyRanges()]
        total = len(merged[0])
        left = list(apart)
        for number in frozen:
            ranges = self._ranges.get(number, KeyRanges())
            if total + len(ranges) <= FROZEN_LIMIT:
                merged.append(ranges)
                total += len(ranges)
            else:
                left.append(number)
        return KeyRanges().union(*merged), tuple(left)

    def _load(self, number: int) -> None:
        keys = self._engine.run(
            "SELECT org_id, key_hi, key_lo, coalesce(seq, 0) AS seq, coalesce(seq_n, -1) AS seq_n"
            f" FROM {partition_table(number)}"
        ).fetchnumpy()
        self._know(number, {name: np.asarray(column) for name, column in keys.items()})
