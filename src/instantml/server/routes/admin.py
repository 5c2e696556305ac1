"""Orgs, API keys and usage. An ``admin`` key of the server's first org (``default``) is the
server admin: it manages every org. An ``admin`` key of another org manages that org's keys
and reads its usage; only the server admin sets limits."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from fastapi import APIRouter, Depends, Query, Request
from starlette.concurrency import run_in_threadpool

from ...storage.records import ApiKeyRecord
from ..auth import ALL_SCOPES, new_api_key
from ..body import read_json_object
from ..bootstrap import DEFAULT_ORG
from ..context import require, services
from ..errors import ApiError
from ..responses import JSONResponse
from ..schemas import request_body
from ..write import guardrail

router = APIRouter()
Admin = Annotated[ApiKeyRecord, Depends(require("admin"))]
Read = Annotated[ApiKeyRecord, Depends(require("read"))]
OrgName = Annotated[str | None, Query(min_length=1, max_length=256, pattern="^[^\x00]+$")]


class KeyBody(msgspec.Struct):
    """``POST /api/keys``: a key for an org (default: the caller's), with these scopes."""

    org: Annotated[str, msgspec.Meta(min_length=1, max_length=256, pattern="^[^\x00]+$")] | None = (
        None
    )
    scopes: Annotated[list[Literal["admin", "ingest", "read"]], msgspec.Meta(min_length=1)] = (
        msgspec.field(default_factory=lambda: ["ingest", "read"])
    )


class LimitBody(msgspec.Struct):
    """``PUT /api/usage/limit``: an org's monthly metric points (null: the server default)."""

    limit: Annotated[int, msgspec.Meta(ge=0)] | None
    org: Annotated[str, msgspec.Meta(pattern="^[^\x00]*$")] | None = None


async def _is_server_admin(request: Request, key: ApiKeyRecord) -> bool:
    if "admin" not in key.scopes:
        return False
    name = await run_in_threadpool(services(request).stores.tenancy.org_name, key.org_id)
    return bool(name == DEFAULT_ORG)


async def _target_org(
    request: Request, key: ApiKeyRecord, org: str | None, create: bool = False
) -> tuple[int, bool]:
    """The org a request names (default: the caller's), and whether it was created now.
    Another org's name is visible to the server admin only; to anyone else it does not
    exist (404)."""
    tenancy = services(request).stores.tenancy
    if org is None:
        return key.org_id, False
    org_id = await run_in_threadpool(tenancy.org_id, org)
    if org_id == key.org_id:
        return org_id, False
    if not await _is_server_admin(request, key):
        raise ApiError(404, f"org: no org named {org!r}")
    if org_id is not None:
        return int(org_id), False
    if not create:
        raise ApiError(404, f"org: no org named {org!r}")
    return await run_in_threadpool(tenancy.ensure_org, org)


@router.post("/api/keys", status_code=201, openapi_extra=request_body(KeyBody))
async def create_key(request: Request, key: Admin) -> JSONResponse:
    """Mint an API key for an org (created if new; server admin only for another org)."""
    body = await read_json_object(request)
    org = body.get("org")
    if org is not None and (type(org) is not str or not 1 <= len(org) <= 256 or "\x00" in org):
        raise ApiError(422, "org must be a name of 1-256 characters, without NUL")
    scopes = body.get("scopes", ["ingest", "read"])
    if (
        not isinstance(scopes, list)
        or not scopes
        or not all(type(s) is str for s in scopes)
        or not set(scopes) <= ALL_SCOPES
    ):
        raise ApiError(422, f"scopes must be a non-empty list drawn from {sorted(ALL_SCOPES)}")
    org_id, org_created = await _target_org(request, key, org, create=True)
    token, key_id, key_hash = new_api_key()
    tenancy = services(request).stores.tenancy
    await run_in_threadpool(tenancy.add_api_key, org_id, key_id, key_hash, frozenset(scopes))
    name = await run_in_threadpool(tenancy.org_name, org_id)
    return JSONResponse(
        {
            "key": token,
            "key_id": key_id,
            "org": name,
            "org_created": org_created,
            "scopes": sorted(set(scopes)),
        },
        status_code=201,
    )


@router.get("/api/keys")
async def list_keys(request: Request, key: Admin, org: OrgName = None) -> JSONResponse:
    """Keys of an org (never their secrets); the server admin may ask for ``org=*``."""
    tenancy = services(request).stores.tenancy
    if org == "*":
        if not await _is_server_admin(request, key):
            raise ApiError(403, "org: only the server admin can list every org's keys")
        return JSONResponse({"keys": await run_in_threadpool(tenancy.list_api_keys, None)})
    org_id, _ = await _target_org(request, key, org)
    return JSONResponse({"keys": await run_in_threadpool(tenancy.list_api_keys, org_id)})


@router.delete("/api/keys/{key_id}")
async def revoke_key(request: Request, key_id: str, key: Admin) -> JSONResponse:
    """Revoke a key; it is refused from the next request on."""
    scope = None if await _is_server_admin(request, key) else key.org_id
    found = services(request)
    revoked = await run_in_threadpool(found.stores.tenancy.revoke_api_key, key_id, scope)
    if not revoked:
        raise ApiError(404, f"key {key_id!r} not found")
    found.keys.forget(key_id)
    return JSONResponse({"key_id": key_id, "revoked": True})


@router.get("/api/usage")
async def usage(request: Request, key: Read, org: OrgName = None) -> JSONResponse:
    """This UTC month's metric points against the org's limit (null: unlimited)."""
    org_id, _ = await _target_org(request, key, org)
    found = services(request)
    body = await run_in_threadpool(guardrail.usage, found.stores, found.service.policy, org_id)
    name = await run_in_threadpool(found.stores.tenancy.org_name, org_id)
    return JSONResponse({"org": name, **body})


@router.put("/api/usage/limit", openapi_extra=request_body(LimitBody))
async def set_limit(request: Request, key: Admin) -> JSONResponse:
    """Override an org's monthly limit (null: back to the server default). Server admin only."""
    if not await _is_server_admin(request, key):
        raise ApiError(403, "only the server admin can set monthly limits")
    body = await read_json_object(request)
    limit = body.get("limit")
    if limit is not None and (type(limit) is not int or limit < 0):
        raise ApiError(422, "limit must be an integer >= 0, or null")
    org = body.get("org")
    if org is not None and (type(org) is not str or "\x00" in org):
        raise ApiError(422, "org must be a string without NUL characters")
    org_id, _ = await _target_org(request, key, org)
    tenancy = services(request).stores.tenancy
    await run_in_threadpool(tenancy.set_monthly_limit, org_id, limit)
    return JSONResponse({"org": await run_in_threadpool(tenancy.org_name, org_id), "limit": limit})
