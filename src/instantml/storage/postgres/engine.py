"""A PostgreSQL database for the metadata stores: a connection pool, the schema (brought
to the newest version on start under an advisory lock, so processes starting together are
safe),
and units of work: one transaction per unit, on a connection the unit's thread holds.

Concurrency is the database's: unique indexes and ``INSERT ... ON CONFLICT`` for ids and
claims, one conditional ``UPDATE`` for the guardrail, sequences for ids. Nothing that
processes must agree on is decided in process memory.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from .. import safe_url
from ..migrations import migrate
from ..records import StorageError
from ..sql import Execute
from ..unit import Participant, Units
from .schema import MIGRATIONS

_MIGRATION_LOCK = 0x1A57A7E  # pg_advisory_lock key: one migrating process at a time


class PgEngine:
    """``postgresql://user:pass@host:port/db``."""

    def __init__(self, url: str, max_connections: int = 16) -> None:
        self.url = url
        try:
            # One connection first: its error says why (refused, a wrong password), where
            # the pool would only retry until its timeout.
            psycopg.connect(url, connect_timeout=10).close()
            self.pool = ConnectionPool(
                url, min_size=1, max_size=max_connections, open=True, timeout=10.0,
                kwargs={"autocommit": True}, name="instantml",
            )  # fmt: skip
            self.pool.wait(timeout=10.0)
        except Exception as exc:  # a clear message at start: where, and why
            reason = " ".join(str(exc).split())  # one line
            raise StorageError(
                f"cannot connect to PostgreSQL at {safe_url(url)}: {reason}"
            ) from None
        self._local = threading.local()
        self._units = Units(self._transaction)
        self.migrate()

    def migrate(self) -> None:
        """Bring the schema to the newest version (``schema.py``), under an advisory lock:
        of several processes starting together one migrates and the others wait."""
        with self.pool.connection() as con:
            con.execute("SELECT pg_advisory_lock(%s)", [_MIGRATION_LOCK])
            try:

                @contextmanager
                def transaction() -> Iterator[Execute]:
                    with con.transaction():
                        yield _execute_on(con)

                migrate(transaction, MIGRATIONS, "PostgreSQL")
            finally:
                con.execute("SELECT pg_advisory_unlock(%s)", [_MIGRATION_LOCK])

    def join(self, participant: Participant) -> None:
        self._units.join(participant)

    @property
    def in_unit(self) -> bool:
        return self._units.in_unit

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """The unit's connection (inside one), else an autocommit one from the pool."""
        con = getattr(self._local, "con", None)
        if con is not None:
            yield con
            return
        with unavailable_is_storage_error(), self.pool.connection() as con:
            yield con

    def read(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        """Rows of a statement: inside this thread's unit, on its connection (seeing its
        writes), else committed data."""
        with self.connection() as con:
            return _execute_on(con)(sql, params)

    execute = read  # a unit's statements run on the unit's connection

    def changed(self, sql: str, params: Sequence[Any]) -> int:
        """A row-changing statement of this thread's unit: how many rows it changed."""
        with self.connection() as con:
            return con.execute(sql, list(params)).rowcount

    @contextmanager
    def statements(self) -> Iterator[Execute]:
        """A transaction of its own (not a unit), yielding how to run a statement in it."""
        with self.connection() as con, con.transaction():
            yield _execute_on(con)

    def storable(self, *texts: str | None) -> bool:
        return storable(*texts)

    def unit(self) -> AbstractContextManager[None]:
        """One transaction for the block (on this thread); a unit in a unit joins it."""
        return self._units.unit()

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        with unavailable_is_storage_error(), self.pool.connection() as con:
            self._local.con = con
            try:
                with con.transaction():
                    yield
            finally:
                self._local.con = None

    def staged(self, participant: Participant) -> Any:
        """What ``participant`` staged in this thread's unit (outside one: nothing, so
        reads see committed data only)."""
        return self._units.staged(participant)

    def close(self) -> None:
        self.pool.close()


@contextmanager
def unavailable_is_storage_error() -> Iterator[None]:
    """A lost connection, or none to be had in time (the pool's PoolTimeout is one), is a
    StorageError: the server answers it 503, retryable."""
    try:
        yield
    except psycopg.OperationalError as exc:
        raise StorageError(f"PostgreSQL: {' '.join(str(exc).split())}") from exc


def _execute_on(con: psycopg.Connection[Any]) -> Execute:
    def execute(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        cur = con.execute(sql, list(params))
        return cur.fetchall() if cur.description else []

    return execute


def storable(*names: str | None) -> bool:
    """Whether PostgreSQL can hold these names (its text has no NUL character): a lookup
    by a name that cannot be stored finds nothing, without asking."""
    return not any(name is not None and "\x00" in name for name in names)
