"""API keys: ``iml_<key id>_<secret>``, stored as a SHA-256 of the secret, checked in constant time."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from ..storage.protocols import Tenancy
from ..storage.records import ApiKeyRecord
from .errors import ApiError

ALL_SCOPES = frozenset({"admin", "ingest", "read"})
# How long a verified key is trusted without asking the store again: the bound on how
# long a key revoked through another server process still works here (the contract: 5 s).
VERIFIED_SECONDS = 2.0


def new_api_key() -> tuple[str, str, str]:
    """A fresh key: (the key to hand out, its id, the hash to store)."""
    key_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(24)
    return f"iml_{key_id}_{secret}", key_id, _hash(secret)


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class KeyRing:
    """Verifies bearer keys against the store, remembering the ones verified in the last
    ``VERIFIED_SECONDS`` (a cache with a bound on staleness: another process may revoke)."""

    def __init__(self, tenancy: Tenancy, verified_seconds: float = VERIFIED_SECONDS) -> None:
        self._tenancy = tenancy
        self._ttl = verified_seconds
        self._verified: dict[str, tuple[float, ApiKeyRecord]] = {}

    def forget(self, key_id: str) -> None:
        """Drop a key from the cache (after a revocation) so the next request re-checks it."""
        self._verified = {k: v for k, v in self._verified.items() if v[1].key_id != key_id}

    def _verify(self, token: str) -> ApiKeyRecord | None:
        """The key's record when the secret matches (revoked or not); None otherwise."""
        parts = token.split("_", 2)
        if len(parts) != 3 or parts[0] != "iml":
            return None
        record = self._tenancy.find_api_key(parts[1])
        if record is None or not hmac.compare_digest(record.key_hash, _hash(parts[2])):
            return None
        if not record.revoked:
            now = time.monotonic()
            if len(self._verified) >= 10_000:  # keys seen once (rotated, probed) go
                self._verified = {k: v for k, v in self._verified.items() if v[0] > now}
            self._verified[token] = (now + self._ttl, record)
        return record

    async def authenticate(self, request: Request) -> ApiKeyRecord:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise ApiError(
                401,
                "Authorization: missing API key (send 'Authorization: Bearer <key>')",
                {"WWW-Authenticate": "Bearer"},
            )
        cached = self._verified.get(token)
        if cached is not None and cached[0] > time.monotonic():
            record: ApiKeyRecord | None = cached[1]
        else:
            record = await run_in_threadpool(self._verify, token)
        if record is None:
            raise ApiError(401, "Authorization: invalid API key", {"WWW-Authenticate": "Bearer"})
        if record.revoked:  # only its holder, who knows the secret, learns this
            raise ApiError(401, "Authorization: API key revoked", {"WWW-Authenticate": "Bearer"})
        return record
