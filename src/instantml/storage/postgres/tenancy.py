"""Orgs, API keys and monthly-limit overrides in PostgreSQL (``tenancy_sql.py``), shared by
every server process: org ids come from a sequence, a transaction-scoped advisory lock
keeps the first API key one, and a limit changed by another process is seen within
``LIMIT_TTL`` seconds."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from ..sql import Execute
from ..tenancy_sql import SqlTenancy
from .engine import PgEngine, storable

_FIRST_KEY_LOCK = 0x1A57A7F  # pg_advisory_xact_lock key: one bootstrap at a time


class PgTenancy(SqlTenancy):
    INSERT_ORG = (
        "INSERT INTO orgs (name, created_at) VALUES (%s, %s)"
        " ON CONFLICT (name) DO NOTHING RETURNING org_id"
    )
    FIRST_KEY_LOCK = f"SELECT pg_advisory_xact_lock({_FIRST_KEY_LOCK})"
    LIMIT_TTL = 5.0

    def __init__(self, engine: PgEngine) -> None:
        super().__init__()
        self._engine = engine

    def storable(self, text: str) -> bool:
        return storable(text)

    def read(self, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
        return self._engine.read(sql, params)

    def transaction(self) -> AbstractContextManager[Execute]:
        return self._engine.statements()
