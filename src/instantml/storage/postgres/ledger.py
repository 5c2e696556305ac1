"""Idempotency-Key claims and answers, and usage, in PostgreSQL: shared by every server
process.

- A claim is a row with a lease (``expires``) and its request's token (``owner``):
  ``INSERT ... ON CONFLICT DO UPDATE ... WHERE the lease ran out``, so a key is in flight in
  one process at a time, and a process that died mid-request frees its keys when their
  lease runs out. A request releases by its token (``DELETE ... WHERE owner = ...``): one
  index range, whatever its size, and never a key that lapsed and was claimed since.
- The claims table's rows come and go by the thousand, so its statistics, taken whenever
  autovacuum comes by, say little about what it holds when the next statement runs. A
  generic plan cached from small statements (a prepared statement's, from its sixth run
  on) met a batch's 10,000 keys with a nested loop over both sides, every key against
  every row, while its request waited. Claims and releases are planned each time
  (``prepare=False``), for the table and the arrays as they are.
- A charge is one conditional ``UPDATE ... SET used = used + n WHERE used + n <= limit``:
  its row lock serialises concurrent charges of an org, so the month's limit is never
  overshot, whichever processes charge.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..records import Keys, Slot, StoredAnswer
from .engine import PgEngine

# A claim outlives a request's wait for its unit (well under a second, seconds under a
# storage stall); a killed process's claims expire with it, and until then its keys answer
# 409 in flight (found by the chaos campaign: at 300 s, an uploader re-sending after a
# crash waited five minutes). Were a claim to lapse under a live request, the answers
# table's primary key would still let only one of two units with the key commit.
CLAIM_LEASE = 30.0


def int_array(values: Iterable[int]) -> str:
    """An integer column as PostgreSQL's array text, for a ``%s::BIGINT[]`` parameter:
    psycopg dumps a Python list element by element, about three times slower for a
    batch's keys than PostgreSQL parsing the text."""
    return "{" + ",".join(map(str, values)) + "}"


# PostgreSQL's binary COPY: a signature, flags and header extension length; each row its
# field count, then each field's byte length and big-endian value; -1 fields at the end.
_COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + np.array([0, 0], dtype=">i4").tobytes()
_COPY_TRAILER = np.array([-1], dtype=">i2").tobytes()
_ANSWER_FIELDS = [("org_id", ">i8"), ("key_hi", ">i8"), ("key_lo", ">i8"),
                  ("fingerprint", ">i8"), ("status", ">i2")]  # fmt: skip


def copy_binary(
    org: np.ndarray, hi: np.ndarray, lo: np.ndarray, fingerprint: np.ndarray,
    status: np.ndarray, body: Sequence[str], created_at: np.ndarray,
) -> bytes:  # fmt: skip
    """The answers as one block of binary COPY, built as numpy records, one record type
    per body length (a batch's bodies have one or a few): no Python work per row but the
    body's lookup, where text COPY formatted every number of every row."""
    encoded = {text: text.encode() for text in set(body)}
    if len(encoded) == 1:  # one answer for every row (a batch's usual case)
        blobs: Sequence[bytes] = [*encoded.values()] * len(body)
        sizes = np.full(len(body), len(blobs[0]) if blobs else 0)
    else:
        blobs = [encoded[text] for text in body]
        sizes = np.fromiter(map(len, blobs), dtype=np.int64, count=len(blobs))
    values = dict(zip([n for n, _ in _ANSWER_FIELDS], (org, hi, lo, fingerprint, status)))
    parts = [_COPY_HEADER]
    for size in np.unique(sizes).tolist():
        rows = np.flatnonzero(sizes == size)
        fields = [("count", ">i2")]
        for name, kind in _ANSWER_FIELDS:
            fields += [(f"{name}_size", ">i4"), (name, kind)]
        fields.append(("body_size", ">i4"))
        if size:  # an empty body is its length alone
            fields.append(("body", f"S{size}"))
        fields += [("created_at_size", ">i4"), ("created_at", ">f8")]
        record = np.empty(len(rows), dtype=np.dtype(fields))
        record["count"] = 7
        for name, kind in _ANSWER_FIELDS:
            record[f"{name}_size"] = np.dtype(kind).itemsize
            record[name] = values[name][rows]
        record["body_size"] = size
        if size:
            record["body"] = blobs[0] if len(encoded) == 1 else [blobs[i] for i in rows.tolist()]
        record["created_at_size"] = 8
        record["created_at"] = created_at[rows]
        parts.append(record.tobytes())
    parts.append(_COPY_TRAILER)
    return b"".join(parts)


@dataclass
class _Staged:
    # Chunks of answers as columns: keys, fingerprints, statuses, bodies, created_at.
    answers: list[tuple[Keys, np.ndarray, np.ndarray, Sequence[str], float]] = field(
        default_factory=list
    )


class PgLedger:
    shared_claims = True

    def __init__(self, engine: PgEngine) -> None:
        self._engine = engine
        engine.join(self)

    # ---- claims ----

    def claim(self, slots: set[Slot], owner: int) -> set[Slot]:
        if not slots:
            return set()
        org, hi, lo = (int_array(c) for c in zip(*slots))
        now = time.time()
        # The slots not claimed come back, found here rather than by returning every
        # claimed one (a batch's thousands of rows, read and made a set in Python).
        with self._engine.connection() as con:
            rows = con.execute(
                "WITH wanted AS (SELECT * FROM unnest(%s::BIGINT[], %s::BIGINT[], %s::BIGINT[])"
                " AS w(o, h, l)), taken AS (INSERT INTO claims"
                " (org_id, key_hi, key_lo, expires, owner) SELECT o, h, l, %s, %s FROM wanted"
                " ON CONFLICT (org_id, key_hi, key_lo) DO UPDATE"
                " SET expires = EXCLUDED.expires, owner = EXCLUDED.owner"
                " WHERE claims.expires < %s RETURNING org_id, key_hi, key_lo)"
                " SELECT o, h, l FROM wanted EXCEPT SELECT org_id, key_hi, key_lo FROM taken",
                [org, hi, lo, now + CLAIM_LEASE, owner, now],
                prepare=False,
            ).fetchall()
        return {(int(o), int(h), int(w)) for o, h, w in rows}

    def release(self, owner: int) -> None:
        with self._engine.connection() as con:
            con.execute("DELETE FROM claims WHERE owner = %s", [owner], prepare=False)

    # ---- answers ----

    def lookup(self, keys: Keys) -> dict[Slot, StoredAnswer]:
        if not len(keys):
            return {}
        org, hi, lo = (int_array(c.tolist()) for c in (keys.org, keys.hi, keys.lo))
        with self._engine.connection() as con:
            rows = con.execute(
                "SELECT a.org_id, a.key_hi, a.key_lo, a.fingerprint, a.status, a.body"
                " FROM answers a JOIN unnest(%s::BIGINT[], %s::BIGINT[], %s::BIGINT[])"
                " AS r(o, h, l) ON a.org_id = r.o AND a.key_hi = r.h AND a.key_lo = r.l",
                [org, hi, lo],
            ).fetchall()
        return {
            (int(o), int(h), int(w)): StoredAnswer(int(f), int(s), b) for o, h, w, f, s, b in rows
        }

    def record(
        self,
        keys: Keys,
        fingerprint: np.ndarray,
        status: np.ndarray,
        body: Sequence[str],
        created_at: float,
    ) -> None:
        staged: _Staged = self._engine.staged(self)
        staged.answers.append((keys, fingerprint, status, body, created_at))

    def prune(self, before: float) -> None:
        with self._engine.connection() as con:
            con.execute("DELETE FROM answers WHERE created_at < %s", [before])
            con.execute("DELETE FROM upload_batches WHERE created_at < %s", [before])

    # ---- ordered uploads ----

    def mark_batch(self, org_id: int, session: str, seq: int, clean: bool) -> None:
        with self._engine.pool.connection() as con:  # never a unit's: seen at once
            con.execute(
                "INSERT INTO upload_batches VALUES (%s, %s, %s, %s, %s)"
                " ON CONFLICT (org_id, session, seq) DO NOTHING",
                [org_id, session, seq, clean, time.time()],
            )

    def batch_marks(self, org_id: int, session: str, seqs: Sequence[int]) -> dict[int, bool]:
        with self._engine.connection() as con:
            rows = con.execute(
                "SELECT seq, clean FROM upload_batches WHERE org_id = %s AND session = %s"
                " AND seq = ANY(%s)",
                [org_id, session, list(seqs)],
            ).fetchall()
        return {int(seq): bool(clean) for seq, clean in rows}

    # ---- usage ----

    def used(self, org_id: int, month: str) -> int:
        with self._engine.connection() as con:
            row = con.execute(
                "SELECT used FROM usage WHERE org_id = %s AND month = %s", [org_id, month]
            ).fetchone()
        return 0 if row is None else int(row[0])

    def charge(self, org_id: int, month: str, points: int, limit: int | None) -> bool:
        with self._engine.connection() as con:
            con.execute(
                "INSERT INTO usage VALUES (%s, %s, 0) ON CONFLICT (org_id, month) DO NOTHING",
                [org_id, month],
            )
            row = con.execute(
                "UPDATE usage SET used = used + %s WHERE org_id = %s AND month = %s"
                " AND (%s::BIGINT IS NULL OR used + %s <= %s) RETURNING used",
                [points, org_id, month, limit, points, limit],
            ).fetchone()
        return row is not None

    # ---- the unit ----

    def begin(self) -> _Staged:
        return _Staged()

    def flush(self, staged: _Staged) -> None:
        if not staged.answers:
            return
        keys = Keys.concat([chunk[0] for chunk in staged.answers])
        block = copy_binary(
            keys.org, keys.hi, keys.lo,
            np.concatenate([chunk[1] for chunk in staged.answers]),
            np.concatenate([chunk[2] for chunk in staged.answers]),
            [text for chunk in staged.answers for text in chunk[3]],
            np.concatenate([np.full(len(c[3]), c[4], dtype=np.float64) for c in staged.answers]),
        )  # fmt: skip
        with (
            self._engine.connection() as con,
            con.cursor() as cur,
            cur.copy(
                "COPY answers (org_id, key_hi, key_lo, fingerprint, status, body, created_at)"
                " FROM STDIN (FORMAT BINARY)"
            ) as copy,
        ):
            copy.write(block)

    def committed(self, staged: _Staged) -> None:
        pass
