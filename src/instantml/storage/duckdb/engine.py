"""One DuckDB database: its connection, read cursors per thread, and the unit of work.

A unit of work (``storage/unit.py``) is one transaction on the writing connection. The
stores built on the engine take part in it: each stages its writes in memory while the
unit runs, writes them in a few bulk statements just before COMMIT (``flush``), and
teaches its caches what was committed only after COMMIT succeeded (``committed``); a
unit cut short drops its staging. Units are serialised by a lock: one writer, as DuckDB
wants, and a guardrail charge can never race another.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import duckdb
import numpy as np

from ..records import StorageError
from ..unit import Participant, Units

_VALUES_MAX_ROWS = 64
# DuckDB's buffer cache (table pages, the newest Idempotency-Key partition's index) is
# capped here rather than at DuckDB's default of 80% of RAM: a server that runs for weeks
# next to training jobs should not grow with the data it has written. Queries past it
# spill to disk. ``INSTANTML_DUCKDB_MEMORY_LIMIT`` (e.g. ``4GB``) sets another.
MEMORY_LIMIT_ENV = "INSTANTML_DUCKDB_MEMORY_LIMIT"
DEFAULT_MEMORY_LIMIT = "1GB"
# DuckDB checkpoints (moves the write-ahead log's changes into the database file) inside
# the COMMIT that takes the log past its threshold, so the write that happens to cross it
# waits for the whole checkpoint, and a checkpoint's cost grows with the database. The
# server's writer checkpoints in its idle moments instead, once the log passes
# IDLE_CHECKPOINT_BYTES (DuckDB's own default threshold); DuckDB's threshold is raised to
# CHECKPOINT_BACKSTOP, for a writer that is never idle.
IDLE_CHECKPOINT_BYTES = 16 * 2**20
CHECKPOINT_BACKSTOP = "64MiB"


class Engine:
    """A DuckDB file (``:memory:`` for a throwaway one)."""

    def __init__(self, path: str) -> None:
        if path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        try:
            self.con = duckdb.connect(path)
        except duckdb.Error as exc:
            if "replaying WAL" not in str(exc):
                raise
            raise StorageError(damaged_wal(path, exc)) from None
        limit = os.environ.get(MEMORY_LIMIT_ENV, "").strip() or DEFAULT_MEMORY_LIMIT
        try:
            self.con.execute(f"SET memory_limit = '{limit.replace(chr(39), '')}'")
        except duckdb.Error as exc:
            self.con.close()
            raise ValueError(
                f"{MEMORY_LIMIT_ENV}: {limit!r} is not a memory size ({exc})"
            ) from None
        if path != ":memory:":
            self.con.execute(f"SET checkpoint_threshold = '{CHECKPOINT_BACKSTOP}'")
        self._local = threading.local()
        # One unit at a time, process wide (the one writing connection); a checkpoint
        # takes it too, so it runs between units.
        self._lock = threading.RLock()
        self._units = Units(self._transaction)
        self.closed = False

    def join(self, participant: Participant) -> None:
        """Take part in every unit from now on (flushed in the order joined)."""
        self._units.join(participant)

    def staged(self, participant: Participant) -> Any:
        return self._units.staged(participant)

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """This thread's read cursor (its own connection to the same database)."""
        cur = getattr(self._local, "cur", None)
        if cur is None:
            cur = self._local.cur = self.con.cursor()
        return cur

    def read(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        """Rows of a statement written with ``%s`` placeholders (as the SQL shared with
        PostgreSQL is), on this thread's read cursor: committed data."""
        return self.cursor().execute(sql.replace("%s", "?"), list(params)).fetchall()

    def execute(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        """A ``%s`` statement of this thread's unit, on the writing connection."""
        assert self.in_unit, "the writing connection is a unit's"
        result = self.con.execute(sql.replace("%s", "?"), list(params))
        return result.fetchall() if result.description else []

    def storable(self, *texts: str | None) -> bool:
        """Whether these texts can be stored (in DuckDB, any text)."""
        return True

    @contextmanager
    def statements(self) -> Iterator[Callable[[str, Sequence[Any]], list[tuple[Any, ...]]]]:
        """A transaction of its own on this thread's cursor (not a unit), yielding how to
        run a ``%s`` statement in it; rolled back if the block raises."""
        cur = self.cursor()

        def execute(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
            result = cur.execute(sql.replace("%s", "?"), list(params))
            return result.fetchall() if result.description else []

        cur.execute("BEGIN TRANSACTION")
        try:
            yield execute
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        cur.execute("COMMIT")

    @property
    def in_unit(self) -> bool:
        """Whether this thread is inside a unit (so may use the writing connection, and
        sees the unit's staged writes); other threads read committed data only."""
        return self._units.in_unit

    def unit(self) -> AbstractContextManager[None]:
        """One transaction around whatever the block writes; a unit inside a unit joins
        the outer one."""
        return self._units.unit()

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        with self._lock:
            self.con.execute("BEGIN TRANSACTION")
            try:
                yield
            except BaseException:
                self.con.execute("ROLLBACK")
                raise
            self.con.execute("COMMIT")

    @contextmanager
    def frame(self, name: str, frame: dict[str, np.ndarray]) -> Iterator[tuple[str, list[Any]]]:
        """A table expression over numpy columns, for ``INSERT ... SELECT ... FROM <it>``.

        Scanning a registered numpy frame has a fixed cost whatever its size, far more than
        a parameterised VALUES list of a few rows: small frames (one request) go as VALUES,
        large ones (an ingest batch) as the registered frame.
        """
        names = list(frame)
        size = len(frame[names[0]])
        if size <= _VALUES_MAX_ROWS:
            row = "(" + ", ".join("?" * len(names)) + ")"
            params = [v for values in zip(*(c.tolist() for c in frame.values())) for v in values]
            yield f"(VALUES {', '.join([row] * size)}) AS {name}({', '.join(names)})", params
            return
        self.con.register(name, frame)
        # DuckDB reads a NaN in a registered float array as NULL; numpy has no NULL, so
        # every NULL there was a NaN (a non-finite mark, a step with no finite value).
        floats = {n for n, column in frame.items() if column.dtype.kind == "f"}
        source = name
        if floats:
            listed = ", ".join(
                f"coalesce({n}, 'nan'::DOUBLE) AS {n}" if n in floats else n for n in names
            )
            source = f"(SELECT {listed} FROM {name}) AS {name}"
        try:
            yield source, []
        finally:
            self.con.unregister(name)

    @contextmanager
    def rows(
        self, name: str, columns: dict[str, tuple[list[Any], Any]]
    ) -> Iterator[tuple[str, list[Any]]]:
        """:meth:`frame` over Python lists, each with its numpy dtype."""
        frame = {n: np.array(values, dtype=dtype) for n, (values, dtype) in columns.items()}
        with self.frame(name, frame) as source:
            yield source

    def checkpoint_due(self) -> bool:
        """Whether the write-ahead log has grown past IDLE_CHECKPOINT_BYTES."""
        if self.path == ":memory:" or self.closed:
            return False
        try:
            return os.path.getsize(f"{self.path}.wal") >= IDLE_CHECKPOINT_BYTES
        except OSError:  # no log: nothing written since the last checkpoint
            return False

    def checkpoint(self) -> None:
        """Move the write-ahead log into the database file (between units; readers in
        their snapshots go on)."""
        with self._lock:
            try:
                self.con.execute("CHECKPOINT")
            except duckdb.Error as exc:
                raise StorageError(f"checkpoint: {exc}") from None

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.con.close()


def first(result: duckdb.DuckDBPyConnection) -> tuple[Any, ...]:
    """The first row (fetchall, not fetchone: DuckDB keeps a half-read result open)."""
    rows = result.fetchall()
    if not rows:
        raise LookupError("query returned no row")
    return tuple(rows[0])


def damaged_wal(path: str, exc: Exception) -> str:
    """What to do when DuckDB cannot replay the write-ahead log: one line. (A torn tail, as
    a crash mid-write leaves, is replayed up to the tear without this; a damaged entry in
    the middle stops DuckDB.)"""
    wal = f"{path}.wal"
    why = " ".join(str(exc).split())
    return (
        f"the write-ahead log {wal} is damaged and cannot be replayed ({why}). To start"
        f" from the last checkpoint, move it aside: mv {wal} {wal}.damaged (the writes it"
        " held since that checkpoint are then missing; keep the file to recover them),"
        " then start the server again"
    )
