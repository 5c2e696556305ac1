"""Run health (docs/reference.md, "Run health"): a run's alerts, and the org's webhooks."""

from __future__ import annotations

import secrets
import time
from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Depends, Request, Response
from starlette.concurrency import run_in_threadpool

from ...health.detectors import KINDS, status
from ...storage.health_sql import new_id
from ...storage.records import ApiKeyRecord, WebhookRecord
from ..body import read_json_object
from ..context import require, services
from ..errors import ApiError
from ..responses import JSONResponse

router = APIRouter()
Admin = Annotated[ApiKeyRecord, Depends(require("admin"))]
Read = Annotated[ApiKeyRecord, Depends(require("read"))]


@router.get("/api/runs/{run_id}/health")
async def run_health(request: Request, run_id: str, key: Read) -> dict[str, Any]:
    """The run's status (from its open alerts) and every alert it had, oldest first."""
    stores = services(request).stores
    if await run_in_threadpool(stores.runs.get_run, key.org_id, run_id) is None:
        raise ApiError(404, f"run {run_id!r} not found")
    alerts = await run_in_threadpool(stores.health.alerts, key.org_id, run_id)
    return {
        "run_id": run_id,
        "status": status([a.kind for a in alerts if a.resolved_at is None]),
        "alerts": [alert.to_json() for alert in alerts],
    }


def _webhook(org_id: int, body: dict[str, Any]) -> WebhookRecord:
    """The webhook a POST asks for; ApiError names the field that is wrong."""
    unknown = set(body) - {"url", "kinds", "secret"}
    if unknown:
        raise ApiError(422, f"{sorted(unknown)[0]}: unknown field (known: url, kinds, secret)")
    url = body.get("url")
    if type(url) is not str or len(url) > 2048:
        raise ApiError(422, "url must be a string of at most 2048 characters")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ApiError(422, "url must be an http:// or https:// URL with a host")
    kinds = body.get("kinds", list(KINDS))
    if not isinstance(kinds, list) or not kinds or any(k not in KINDS for k in kinds):
        raise ApiError(422, f"kinds must be a non-empty list of: {', '.join(KINDS)}")
    secret = body.get("secret")
    if secret is None:
        secret = secrets.token_hex(32)
    elif type(secret) is not str or not 1 <= len(secret) <= 256:
        raise ApiError(422, "secret must be a string of 1-256 characters")
    return WebhookRecord(
        new_id("whk"), org_id, url, sorted(set(kinds), key=KINDS.index), secret, time.time()
    )


@router.post("/api/webhooks", status_code=201)
async def add_webhook(request: Request, key: Admin) -> JSONResponse:
    """A webhook of the caller's org: each alert of a kind it takes is posted to it once,
    signed with its secret (generated when none is given)."""
    hook = _webhook(key.org_id, await read_json_object(request))
    await run_in_threadpool(services(request).stores.health.add_webhook, hook)
    return JSONResponse(hook.to_json(), status_code=201)


@router.get("/api/webhooks")
async def list_webhooks(request: Request, key: Admin) -> dict[str, Any]:
    hooks = await run_in_threadpool(services(request).stores.health.webhooks, key.org_id)
    return {"webhooks": [{k: v for k, v in h.to_json().items() if k != "secret"} for h in hooks]}


@router.delete("/api/webhooks/{webhook_id}", status_code=204)
async def delete_webhook(request: Request, webhook_id: str, key: Admin) -> Response:
    health = services(request).stores.health
    if not await run_in_threadpool(health.delete_webhook, key.org_id, webhook_id):
        raise ApiError(404, f"webhook {webhook_id!r} not found")
    return Response(status_code=204)
