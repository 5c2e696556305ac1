"""What the routes work with, as one typed object built at startup (no untyped
``app.state`` attributes): the settings, the stores, the key ring, the write path."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, cast

from fastapi import Request

from ..health.monitor import HealthMonitor
from ..settings import ServerSettings
from ..storage.protocols import Stores
from ..storage.records import ApiKeyRecord
from .auth import KeyRing
from .errors import ApiError
from .ratelimit import RateLimiter
from .write.committer import GroupCommitter
from .write.decode_pool import BatchDecoder
from .write.service import WriteService
from .write.upload_order import UploadOrder


@dataclass(frozen=True)
class Services:
    settings: ServerSettings
    stores: Stores
    keys: KeyRing
    service: WriteService  # the rules of every write
    writer: GroupCommitter  # applies the service's writes in group-commit transactions
    upload_order: UploadOrder  # ordered pipelining of /api/ingest (marks in the ledger)
    decoder: BatchDecoder  # large /api/ingest batches, decoded in another process
    monitor: HealthMonitor  # run-health detectors, fed the runs each unit wrote to
    limiter: RateLimiter  # short-term requests per API key


def services(request: Request) -> Services:
    return cast(Services, request.app.state.services)


async def authorize(request: Request, scope: str) -> ApiKeyRecord:
    """The caller's key, which must carry ``scope``; one request taken from its rate."""
    found = services(request)
    record = await found.keys.authenticate(request)
    found.limiter.take(record.key_id)
    if scope not in record.scopes and "admin" not in record.scopes:
        raise ApiError(403, f"Authorization: this API key lacks the {scope!r} scope")
    return record


def require(scope: str) -> Callable[[Request], Coroutine[Any, Any, ApiKeyRecord]]:
    """A FastAPI dependency: the caller's key, which must carry ``scope``."""

    async def dependency(request: Request) -> ApiKeyRecord:
        return await authorize(request, scope)

    return dependency
