"""A PostgreSQL database for the metadata stores: a connection pool, the schema (created
and migrated on start under an advisory lock, so processes starting together are safe),
and units of work: one transaction per unit, on a connection the unit's thread holds.

Concurrency is the database's: unique indexes and ``INSERT ... ON CONFLICT`` for ids and
claims, one conditional ``UPDATE`` for the guardrail, sequences for ids. Nothing that
processes must agree on is decided in process memory.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from .. import safe_url
from ..records import StorageError
from ..unit import Participant, Units

_MIGRATION_LOCK = 0x1A57A7E  # pg_advisory_lock key: one migrating process at a time

SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS orgs (
    org_id BIGSERIAL PRIMARY KEY, name TEXT UNIQUE NOT NULL, monthly_limit BIGINT,
    created_at DOUBLE PRECISION NOT NULL);
CREATE TABLE IF NOT EXISTS api_keys (
    key_id TEXT PRIMARY KEY, org_id BIGINT NOT NULL, key_hash TEXT NOT NULL,
    scopes TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL, revoked_at DOUBLE PRECISION);
CREATE TABLE IF NOT EXISTS runs (
    run_seq BIGSERIAL PRIMARY KEY, org_id BIGINT NOT NULL, run_id TEXT NOT NULL,
    project TEXT NOT NULL, name TEXT, status TEXT NOT NULL, config TEXT NOT NULL,
    tags TEXT NOT NULL, metadata TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL, world_size INTEGER, last_step BIGINT,
    UNIQUE (org_id, run_id));
CREATE TABLE IF NOT EXISTS series (
    series_id BIGSERIAL PRIMARY KEY, run_seq BIGINT NOT NULL, kind SMALLINT NOT NULL,
    key TEXT NOT NULL, UNIQUE (run_seq, kind, key));
CREATE TABLE IF NOT EXISTS attributes (
    seq BIGSERIAL PRIMARY KEY, run_seq BIGINT NOT NULL, path TEXT, type TEXT, step BIGINT,
    value TEXT, ts DOUBLE PRECISION NOT NULL);
CREATE INDEX IF NOT EXISTS attributes_run ON attributes (run_seq);
CREATE TABLE IF NOT EXISTS usage (
    org_id BIGINT NOT NULL, month TEXT NOT NULL, used BIGINT NOT NULL,
    PRIMARY KEY (org_id, month));
CREATE TABLE IF NOT EXISTS answers (
    org_id BIGINT NOT NULL, key_hi BIGINT NOT NULL, key_lo BIGINT NOT NULL,
    fingerprint BIGINT NOT NULL, status SMALLINT NOT NULL, body TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (org_id, key_hi, key_lo));
CREATE INDEX IF NOT EXISTS answers_created ON answers (created_at);
CREATE TABLE IF NOT EXISTS claims (
    org_id BIGINT NOT NULL, key_hi BIGINT NOT NULL, key_lo BIGINT NOT NULL,
    expires DOUBLE PRECISION NOT NULL, PRIMARY KEY (org_id, key_hi, key_lo));
"""
# Schema changes after the first, by the version they bring the database to: a database
# is brought up to date on start, one version at a time, each in its own transaction.
MIGRATIONS: dict[int, str] = {
    2: """
CREATE TABLE upload_batches (
    org_id BIGINT NOT NULL, session TEXT NOT NULL, seq BIGINT NOT NULL,
    clean BOOLEAN NOT NULL, created_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (org_id, session, seq));
CREATE INDEX upload_batches_created ON upload_batches (created_at);
""",
    3: """
CREATE TABLE alerts (
    alert_id TEXT PRIMARY KEY, org_id BIGINT NOT NULL, run_id TEXT NOT NULL,
    kind TEXT NOT NULL, rank INTEGER NOT NULL, key TEXT NOT NULL,
    since_step BIGINT NOT NULL, since_time DOUBLE PRECISION NOT NULL, message TEXT NOT NULL,
    opened_at DOUBLE PRECISION NOT NULL, resolved_at DOUBLE PRECISION);
CREATE UNIQUE INDEX alerts_open ON alerts (org_id, run_id, kind, rank, key)
    WHERE resolved_at IS NULL;
CREATE INDEX alerts_run ON alerts (org_id, run_id);
CREATE TABLE webhooks (
    webhook_id TEXT PRIMARY KEY, org_id BIGINT NOT NULL, url TEXT NOT NULL,
    kinds TEXT NOT NULL, secret TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL);
CREATE TABLE deliveries (
    delivery_id TEXT PRIMARY KEY, webhook_id TEXT NOT NULL, alert_id TEXT NOT NULL,
    body TEXT NOT NULL, attempts INTEGER NOT NULL, next_at DOUBLE PRECISION NOT NULL,
    delivered_at DOUBLE PRECISION, failed_at DOUBLE PRECISION, last_error TEXT);
CREATE INDEX deliveries_due ON deliveries (next_at) WHERE delivered_at IS NULL;
""",
    4: """
CREATE TABLE run_ranks (
    run_seq BIGINT NOT NULL, rank INTEGER NOT NULL, first_seen DOUBLE PRECISION NOT NULL,
    last_seen DOUBLE PRECISION NOT NULL, finished_at DOUBLE PRECISION,
    PRIMARY KEY (run_seq, rank));
""",
}
SCHEMA_VERSION = max(MIGRATIONS, default=1)


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
        """Create the schema, or bring it up to ``SCHEMA_VERSION``; under an advisory lock,
        so of several processes starting together one migrates and the others wait."""
        with self.pool.connection() as con:
            con.execute("SELECT pg_advisory_lock(%s)", [_MIGRATION_LOCK])
            try:
                with con.transaction():
                    con.execute(SCHEMA)
                    row = con.execute("SELECT max(version) FROM schema_version").fetchone()
                    version = 0 if row is None or row[0] is None else int(row[0])
                    if version == 0:
                        con.execute("INSERT INTO schema_version VALUES (1)")
                        version = 1
                if version > SCHEMA_VERSION:
                    raise StorageError(
                        f"the PostgreSQL schema is at version {version}, newer than this"
                        f" server's {SCHEMA_VERSION}: upgrade instantml"
                    )
                for target in range(version + 1, SCHEMA_VERSION + 1):
                    with con.transaction():
                        con.execute(MIGRATIONS[target])
                        con.execute("UPDATE schema_version SET version = %s", [target])
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


def storable(*names: str | None) -> bool:
    """Whether PostgreSQL can hold these names (its text has no NUL character): a lookup
    by a name that cannot be stored finds nothing, without asking."""
    return not any(name is not None and "\x00" in name for name in names)
