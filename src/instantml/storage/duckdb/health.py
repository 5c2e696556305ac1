"""Run-health alerts, webhooks and their outbox in the DuckDB file (``health_sql.py``), on
a connection of their own: the monitor and the delivery thread never take the write
path's unit, and touch none of its tables."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from ..health_sql import SqlHealth
from ..sql import Execute
from .engine import Engine


class DuckDBHealth(SqlHealth):
    # One process owns the file, and only its monitor thread opens alerts: a check
    # before the insert keeps an open alert unique.
    INSERT_ALERT = (
        "INSERT INTO alerts SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, NULL WHERE NOT EXISTS"
        " (SELECT 1 FROM alerts WHERE org_id = $2 AND run_id = $3 AND kind = $4"
        " AND rank = $5 AND key = $6 AND resolved_at IS NULL) RETURNING alert_id"
    )
    CLAIM = ""  # one delivery thread per file

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def read(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        return self._engine.read(sql, params)

    def transaction(self) -> AbstractContextManager[Execute]:
        return self._engine.statements()
