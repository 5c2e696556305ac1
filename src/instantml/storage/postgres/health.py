"""Run-health alerts, webhooks and their outbox in PostgreSQL (``health_sql.py``), shared by
every server process: a partial unique index keeps one open alert per (run, kind, rank,
key) whichever process opens it, and ``FOR UPDATE SKIP LOCKED`` gives each due delivery
to one process at a time."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ..health_sql import SqlHealth
from ..sql import Execute
from .engine import PgEngine, unavailable_is_storage_error


class PgHealth(SqlHealth):
    INSERT_ALERT = (
        "INSERT INTO alerts (alert_id, org_id, run_id, kind, rank, key, since_step,"
        " since_time, message, opened_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
        " ON CONFLICT (org_id, run_id, kind, rank, key) WHERE resolved_at IS NULL"
        " DO NOTHING RETURNING alert_id"
    )
    CLAIM = " FOR UPDATE OF d SKIP LOCKED"

    def __init__(self, engine: PgEngine) -> None:
        self._engine = engine

    def read(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        with unavailable_is_storage_error(), self._engine.pool.connection() as con:
            return con.execute(sql, list(params)).fetchall()

    @contextmanager
    def transaction(self) -> Iterator[Execute]:
        with (
            unavailable_is_storage_error(),
            self._engine.pool.connection() as con,
            con.transaction(),
        ):

            def execute(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
                cur = con.execute(sql, list(params))
                return cur.fetchall() if cur.description else []

            yield execute
