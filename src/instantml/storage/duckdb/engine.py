"""One DuckDB database: its connection, read cursors per thread, and the unit of work.

A unit of work (``storage/unit.py``) is one transaction on the writing connection. The
stores built on the engine take part in it: each stages its writes in memory while the
unit runs, writes them in a few bulk statements just before COMMIT (``flush``), and
teaches its caches what was committed only after COMMIT succeeded (``committed``); a
unit cut short drops its staging. Units are serialised by a lock: one writer, as DuckDB
wants, and a guardrail charge can never race another.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from ..records import StorageError
from ..unit import Participant, Units

_LISTS_MAX_ROWS = 128
_LIST_TYPES = {"b": "BOOLEAN", "f": "DOUBLE", "O": "VARCHAR", "U": "VARCHAR"}
_INT_TYPES = {1: "TINYINT", 2: "SMALLINT", 4: "INTEGER", 8: "BIGINT"}
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
        self._columns: dict[str, list[str]] = {}  # each table's, for append()
        # What the stores do before the file is closed (each runs its own units).
        self.closing: list[Callable[[], None]] = []
        # A unit's statements are a few texts, the same in every unit (a frame's as well:
        # its placeholders do not depend on its rows).
        self._parsed = functools.lru_cache(maxsize=1024)(self._parse)
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
        return self.cursor().execute(self._parsed(sql.replace("%s", "?")), list(params)).fetchall()

    def execute(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        """A ``%s`` statement of this thread's unit, on the writing connection."""
        assert self.in_unit, "the writing connection is a unit's"
        result = self.run(sql.replace("%s", "?"), list(params))
        return result.fetchall() if result.description else []

    def changed(self, sql: str, params: Sequence[Any]) -> int:
        """A row-changing ``%s`` statement of this thread's unit: how many rows it changed
        (DuckDB answers an UPDATE or DELETE with that count)."""
        assert self.in_unit, "the writing connection is a unit's"
        (count,) = self.run(sql.replace("%s", "?"), list(params)).fetchone() or (0,)
        return int(count)

    def run(self, sql: str, params: Any = None) -> duckdb.DuckDBPyConnection:
        """A statement on the writing connection (``?`` or ``$name`` placeholders), its text
        parsed once: DuckDB parses the text on every execute, a large share of a small
        statement's time, and a unit's statements are small and the same in every unit."""
        return self.con.execute(self._parsed(sql), params)

    def _parse(self, sql: str) -> duckdb.Statement | str:
        # On this thread's cursor: the writing connection may be busy with a unit.
        statements = self.cursor().extract_statements(sql)
        return statements[0] if len(statements) == 1 else sql  # a script: run as text

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
            self.run("BEGIN TRANSACTION")
            try:
                yield
            except BaseException:
                self.run("ROLLBACK")
                raise
            self.run("COMMIT")

    @contextmanager
    def frame(self, name: str, frame: dict[str, np.ndarray]) -> Iterator[tuple[str, list[Any]]]:
        """A table expression over numpy columns, for ``INSERT ... SELECT ... FROM <it>``.

        A registered table has a fixed cost whatever its size (a view in the catalog), far
        more than a statement's list parameters unnested for a few rows (one request), and
        far less for many (an ingest batch, whose lists the parameters would build
        element by element): small frames go as lists, large ones as a registered Arrow
        table (which, unlike a registered numpy array, keeps a NaN a NaN).
        """
        names = list(frame)
        if len(frame[names[0]]) <= _LISTS_MAX_ROWS:
            listed = ", ".join(f"unnest(?::{_sql_type(c)}[]) AS {n}" for n, c in frame.items())
            yield f"(SELECT {listed}) AS {name}", [c.tolist() for c in frame.values()]
            return
        self.con.register(name, pa.table(frame))
        try:
            yield name, []
        finally:
            self.con.unregister(name)

    def append(self, table: str, columns: dict[str, np.ndarray | pa.Array]) -> None:
        """Append rows to ``table``, one statement of this thread's unit: a column for each
        of the table's, in its order (an Arrow array's masked values are NULL). Cheaper
        than ``INSERT ... SELECT`` from a frame, with no view to register."""
        assert self.in_unit, "the writing connection is a unit's"
        wanted = self._columns.get(table)
        if wanted is None:
            described = self.con.execute(f"SELECT * FROM {table} LIMIT 0").description
            wanted = self._columns[table] = [d[0] for d in described]
        if list(columns) != wanted:
            raise ValueError(f"{table} has columns {wanted}, not {list(columns)}")
        self.con.from_arrow(pa.table(columns)).insert_into(table)

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
            for last_unit in self.closing:
                last_unit()
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


def _sql_type(column: np.ndarray) -> str:
    """The DuckDB type of a numpy column's values as a list parameter."""
    kind = column.dtype.kind
    if kind in "iu":
        return ("U" if kind == "u" else "") + _INT_TYPES[column.dtype.itemsize]
    return _LIST_TYPES[kind]
