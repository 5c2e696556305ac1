"""Orgs, API keys and monthly-limit overrides in DuckDB. Rare writes (start, admin routes),
each its own statement."""

from __future__ import annotations

import threading
import time
from typing import Any

from ..records import ApiKeyRecord, key_listing
from .engine import Engine, first

SCHEMA = """
CREATE TABLE IF NOT EXISTS orgs (
    org_id INTEGER PRIMARY KEY, name VARCHAR UNIQUE NOT NULL,
    monthly_limit BIGINT, created_at DOUBLE NOT NULL);
CREATE TABLE IF NOT EXISTS api_keys (
    key_id VARCHAR PRIMARY KEY, org_id INTEGER NOT NULL, key_hash VARCHAR NOT NULL,
    scopes VARCHAR NOT NULL, created_at DOUBLE NOT NULL, revoked_at DOUBLE);
"""


class DuckDBTenancy:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        engine.con.execute(SCHEMA)
        # Read by every metric write (the guardrail): kept here, set through this object.
        self._limits: dict[int, int | None] = dict(
            engine.con.execute("SELECT org_id, monthly_limit FROM orgs").fetchall()
        )
        self._lock = threading.Lock()  # org creation: check and insert as one

    def ensure_org(self, name: str) -> tuple[int, bool]:
        with self._lock:
            found = self.org_id(name)
            if found is not None:
                return found, False
            (org_id,) = first(
                self._engine.cursor().execute(
                    "INSERT INTO orgs SELECT coalesce(max(org_id), 0) + 1, ?, NULL, ? FROM orgs"
                    " RETURNING org_id",
                    [name, time.time()],
                )
            )
            self._limits[int(org_id)] = None
            return int(org_id), True

    def org_id(self, name: str) -> int | None:
        rows = self._engine.cursor().execute("SELECT org_id FROM orgs WHERE name = ?", [name])
        found = rows.fetchall()
        return int(found[0][0]) if found else None

    def org_name(self, org_id: int) -> str | None:
        rows = self._engine.cursor().execute("SELECT name FROM orgs WHERE org_id = ?", [org_id])
        found = rows.fetchall()
        return str(found[0][0]) if found else None

    def add_api_key(self, org_id: int, key_id: str, key_hash: str, scopes: frozenset[str]) -> None:
        self._engine.cursor().execute(
            "INSERT INTO api_keys VALUES (?, ?, ?, ?, ?, NULL)",
            [key_id, org_id, key_hash, ",".join(sorted(scopes)), time.time()],
        )

    def add_first_api_key(
        self, org_id: int, key_id: str, key_hash: str, scopes: frozenset[str]
    ) -> bool:
        with self._lock:  # one process owns the file: a lock of its own is enough
            if self.count_api_keys():
                return False
            self.add_api_key(org_id, key_id, key_hash, scopes)
            return True

    def find_api_key(self, key_id: str) -> ApiKeyRecord | None:
        rows = (
            self._engine.cursor()
            .execute(
                "SELECT key_id, org_id, scopes, key_hash, revoked_at IS NOT NULL FROM api_keys"
                " WHERE key_id = ?",
                [key_id],
            )
            .fetchall()
        )
        if not rows:
            return None
        kid, org, scopes, key_hash, revoked = rows[0]
        return ApiKeyRecord(kid, org, frozenset(scopes.split(",")), key_hash, bool(revoked))

    def count_api_keys(self) -> int:
        (n,) = first(self._engine.cursor().execute("SELECT count(*) FROM api_keys"))
        return int(n)

    def list_api_keys(self, org_id: int | None) -> list[dict[str, Any]]:
        rows = (
            self._engine.cursor()
            .execute(
                "SELECT k.key_id, o.name, k.scopes, k.created_at, k.revoked_at FROM api_keys k"
                " JOIN orgs o USING (org_id) WHERE ? IS NULL OR k.org_id = ? ORDER BY k.created_at",
                [org_id, org_id],
            )
            .fetchall()
        )
        return key_listing(rows)

    def revoke_api_key(self, key_id: str, org_id: int | None) -> bool:
        rows = (
            self._engine.cursor()
            .execute(
                "UPDATE api_keys SET revoked_at = ? WHERE key_id = ? AND revoked_at IS NULL"
                " AND (? IS NULL OR org_id = ?) RETURNING key_id",
                [time.time(), key_id, org_id, org_id],
            )
            .fetchall()
        )
        return bool(rows)

    def monthly_limit(self, org_id: int) -> int | None:
        return self._limits.get(org_id)

    def set_monthly_limit(self, org_id: int, limit: int | None) -> None:
        self._engine.cursor().execute(
            "UPDATE orgs SET monthly_limit = ? WHERE org_id = ?", [limit, org_id]
        )
        self._limits[org_id] = limit
