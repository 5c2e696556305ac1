"""Orgs, API keys and monthly-limit overrides in SQL: one implementation over DuckDB and
PostgreSQL, which differ only in how a statement is run, how a new org gets its id, how the
first key is kept the only first one, and how long a cached limit is trusted.

Rare writes (start, the admin routes and CLI), each in a transaction of its own. The
monthly limit is read by every metric write (the guardrail), so it is cached: for as
long as nobody else can change it (one process owns a DuckDB file: for ever, kept by
this object), or a few seconds where other processes can (PostgreSQL).
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from typing import Any

from .records import ApiKeyRecord, key_listing
from .sql import Execute


class SqlTenancy:
    """Subclasses say how to run a statement (``read``: committed data) and open a
    transaction (``transaction``, yielding an ``Execute``); statements are written with
    ``%s`` placeholders."""

    # Inserts an org (name, created_at) unless its name exists; RETURNs its id if inserted.
    INSERT_ORG: str
    # Run first in the transaction that adds the first API key, so that two at once add
    # one ("" where the transaction itself is exclusive).
    FIRST_KEY_LOCK: str
    LIMIT_TTL: float  # seconds a cached monthly limit is trusted

    def __init__(self) -> None:
        self._limits: dict[int, tuple[float, int | None]] = {}

    def read(self, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def transaction(self) -> AbstractContextManager[Execute]:
        raise NotImplementedError

    def storable(self, text: str) -> bool:
        """Whether the engine can hold this text at all (else no row has it)."""
        return True

    # ---- orgs ----

    def ensure_org(self, name: str) -> tuple[int, bool]:
        with self.transaction() as execute:
            inserted = execute(self.INSERT_ORG, [name, time.time()])
            if inserted:
                return int(inserted[0][0]), True
            (found,) = execute("SELECT org_id FROM orgs WHERE name = %s", [name])
            return int(found[0]), False

    def org_id(self, name: str) -> int | None:
        if not self.storable(name):
            return None
        rows = self.read("SELECT org_id FROM orgs WHERE name = %s", [name])
        return int(rows[0][0]) if rows else None

    def org_name(self, org_id: int) -> str | None:
        rows = self.read("SELECT name FROM orgs WHERE org_id = %s", [org_id])
        return str(rows[0][0]) if rows else None

    def monthly_limit(self, org_id: int) -> int | None:
        now = time.monotonic()
        cached = self._limits.get(org_id)
        if cached is not None and now - cached[0] < self.LIMIT_TTL:
            return cached[1]
        rows = self.read("SELECT monthly_limit FROM orgs WHERE org_id = %s", [org_id])
        limit = None if not rows or rows[0][0] is None else int(rows[0][0])
        self._limits[org_id] = (now, limit)
        return limit

    def set_monthly_limit(self, org_id: int, limit: int | None) -> None:
        with self.transaction() as execute:
            execute("UPDATE orgs SET monthly_limit = %s WHERE org_id = %s", [limit, org_id])
        self._limits[org_id] = (time.monotonic(), limit)

    # ---- API keys ----

    def add_api_key(self, org_id: int, key_id: str, key_hash: str, scopes: frozenset[str]) -> None:
        with self.transaction() as execute:
            self._insert_key(execute, org_id, key_id, key_hash, scopes)

    def add_first_api_key(
        self, org_id: int, key_id: str, key_hash: str, scopes: frozenset[str]
    ) -> bool:
        with self.transaction() as execute:
            if self.FIRST_KEY_LOCK:
                execute(self.FIRST_KEY_LOCK, [])
            if execute("SELECT 1 FROM api_keys LIMIT 1", []):
                return False
            self._insert_key(execute, org_id, key_id, key_hash, scopes)
            return True

    def find_api_key(self, key_id: str) -> ApiKeyRecord | None:
        if not self.storable(key_id):
            return None
        rows = self.read(
            "SELECT key_id, org_id, scopes, key_hash, revoked_at IS NOT NULL FROM api_keys"
            " WHERE key_id = %s",
            [key_id],
        )
        if not rows:
            return None
        kid, org, scopes, key_hash, revoked = rows[0]
        return ApiKeyRecord(kid, int(org), frozenset(scopes.split(",")), key_hash, bool(revoked))

    def count_api_keys(self) -> int:
        rows = self.read("SELECT count(*) FROM api_keys", [])
        return int(rows[0][0]) if rows else 0

    def list_api_keys(self, org_id: int | None) -> list[dict[str, Any]]:
        rows = self.read(
            "SELECT k.key_id, o.name, k.scopes, k.created_at, k.revoked_at FROM api_keys k"
            " JOIN orgs o USING (org_id) WHERE CAST(%s AS BIGINT) IS NULL OR k.org_id = %s"
            " ORDER BY k.created_at",
            [org_id, org_id],
        )
        return key_listing(rows)

    def revoke_api_key(self, key_id: str, org_id: int | None) -> bool:
        if not self.storable(key_id):
            return False
        with self.transaction() as execute:
            revoked = execute(
                "UPDATE api_keys SET revoked_at = %s WHERE key_id = %s AND revoked_at IS NULL"
                " AND (CAST(%s AS BIGINT) IS NULL OR org_id = %s) RETURNING key_id",
                [time.time(), key_id, org_id, org_id],
            )
        return bool(revoked)

    @staticmethod
    def _insert_key(
        execute: Execute, org_id: int, key_id: str, key_hash: str, scopes: frozenset[str]
    ) -> None:
        execute(
            "INSERT INTO api_keys VALUES (%s, %s, %s, %s, %s, NULL)",
            [key_id, org_id, key_hash, ",".join(sorted(scopes)), time.time()],
        )
