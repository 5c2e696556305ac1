"""Orgs, API keys and monthly-limit overrides in DuckDB (``tenancy_sql.py``), on this
thread's read connection: one process owns the file, so a lock of its own makes each of
these transactions exclusive, and the limits it keeps never go stale."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..sql import Execute
from ..tenancy_sql import SqlTenancy
from .engine import Engine


class DuckDBTenancy(SqlTenancy):
    INSERT_ORG = (
        "INSERT INTO orgs SELECT coalesce(max(org_id), 0) + 1, %s, NULL, %s FROM orgs"
        " ON CONFLICT (name) DO NOTHING RETURNING org_id"
    )
    FIRST_KEY_LOCK = ""  # the transaction holds the process's lock
    LIMIT_TTL = math.inf  # only this object changes them

    def __init__(self, engine: Engine) -> None:
        super().__init__()
        self._engine = engine
        self._lock = threading.Lock()

    def read(self, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
        return self._engine.read(sql, params)

    @contextmanager
    def transaction(self) -> Iterator[Execute]:
        with self._lock, self._engine.statements() as execute:
            yield execute
