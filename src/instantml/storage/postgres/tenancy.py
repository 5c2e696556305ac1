"""Orgs, API keys and monthly-limit overrides in PostgreSQL."""

from __future__ import annotations

import time
from typing import Any

from ..records import ApiKeyRecord, key_listing
from .engine import PgEngine, storable

_LIMIT_TTL = 5.0  # seconds another process's limit change may take to be seen here
_FIRST_KEY_LOCK = 0x1A57A7F  # pg_advisory_xact_lock key: one bootstrap at a time


class PgTenancy:
    def __init__(self, engine: PgEngine) -> None:
        self._engine = engine
        self._limits: dict[int, tuple[float, int | None]] = {}

    def ensure_org(self, name: str) -> tuple[int, bool]:
        with self._engine.connection() as con:
            row = con.execute(
                "INSERT INTO orgs (name, created_at) VALUES (%s, %s)"
                " ON CONFLICT (name) DO NOTHING RETURNING org_id",
                [name, time.time()],
            ).fetchone()
            if row is not None:
                return int(row[0]), True
            found = con.execute("SELECT org_id FROM orgs WHERE name = %s", [name]).fetchone()
            assert found is not None
            return int(found[0]), False

    def org_id(self, name: str) -> int | None:
        if not storable(name):
            return None
        with self._engine.connection() as con:
            row = con.execute("SELECT org_id FROM orgs WHERE name = %s", [name]).fetchone()
        return None if row is None else int(row[0])

    def org_name(self, org_id: int) -> str | None:
        with self._engine.connection() as con:
            row = con.execute("SELECT name FROM orgs WHERE org_id = %s", [org_id]).fetchone()
        return None if row is None else str(row[0])

    def add_api_key(self, org_id: int, key_id: str, key_hash: str, scopes: frozenset[str]) -> None:
        with self._engine.connection() as con:
            con.execute(
                "INSERT INTO api_keys VALUES (%s, %s, %s, %s, %s, NULL)",
                [key_id, org_id, key_hash, ",".join(sorted(scopes)), time.time()],
            )

    def add_first_api_key(
        self, org_id: int, key_id: str, key_hash: str, scopes: frozenset[str]
    ) -> bool:
        with self._engine.connection() as con, con.transaction():
            con.execute("SELECT pg_advisory_xact_lock(%s)", [_FIRST_KEY_LOCK])
            if con.execute("SELECT 1 FROM api_keys LIMIT 1").fetchone() is not None:
                return False
            con.execute(
                "INSERT INTO api_keys VALUES (%s, %s, %s, %s, %s, NULL)",
                [key_id, org_id, key_hash, ",".join(sorted(scopes)), time.time()],
            )
            return True

    def find_api_key(self, key_id: str) -> ApiKeyRecord | None:
        if not storable(key_id):
            return None
        with self._engine.connection() as con:
            row = con.execute(
                "SELECT key_id, org_id, scopes, key_hash, revoked_at IS NOT NULL FROM api_keys"
                " WHERE key_id = %s",
                [key_id],
            ).fetchone()
        if row is None:
            return None
        kid, org, scopes, key_hash, revoked = row
        return ApiKeyRecord(kid, int(org), frozenset(scopes.split(",")), key_hash, bool(revoked))

    def count_api_keys(self) -> int:
        with self._engine.connection() as con:
            row = con.execute("SELECT count(*) FROM api_keys").fetchone()
        return int(row[0]) if row else 0

    def list_api_keys(self, org_id: int | None) -> list[dict[str, Any]]:
        with self._engine.connection() as con:
            rows = con.execute(
                "SELECT k.key_id, o.name, k.scopes, k.created_at, k.revoked_at FROM api_keys k"
                " JOIN orgs o USING (org_id) WHERE %s::BIGINT IS NULL OR k.org_id = %s"
                " ORDER BY k.created_at",
                [org_id, org_id],
            ).fetchall()
        return key_listing(rows)

    def revoke_api_key(self, key_id: str, org_id: int | None) -> bool:
        if not storable(key_id):
            return False
        with self._engine.connection() as con:
            row = con.execute(
                "UPDATE api_keys SET revoked_at = %s WHERE key_id = %s AND revoked_at IS NULL"
                " AND (%s::BIGINT IS NULL OR org_id = %s) RETURNING key_id",
                [time.time(), key_id, org_id, org_id],
            ).fetchone()
        return row is not None

    def monthly_limit(self, org_id: int) -> int | None:
        """The org's override, read at most every 5 s (a change by another process is seen
        within that)."""
        now = time.monotonic()
        cached = self._limits.get(org_id)
        if cached is not None and now - cached[0] < _LIMIT_TTL:
            return cached[1]
        with self._engine.connection() as con:
            row = con.execute(
                "SELECT monthly_limit FROM orgs WHERE org_id = %s", [org_id]
            ).fetchone()
        limit = None if row is None or row[0] is None else int(row[0])
        self._limits[org_id] = (now, limit)
        return limit

    def set_monthly_limit(self, org_id: int, limit: int | None) -> None:
        with self._engine.connection() as con:
            con.execute("UPDATE orgs SET monthly_limit = %s WHERE org_id = %s", [limit, org_id])
        self._limits[org_id] = (time.monotonic(), limit)
