"""The single write routes, registered from the write path's one table
(``write/table.py``): each reads its JSON body, validates it into a command and applies it
with the request's Idempotency-Key. ``server/fastpath.py`` answers the same requests with
the same :func:`write` ahead of FastAPI's router; these routes are what the OpenAPI schema
documents."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import APIRouter, Depends, Request

from ...storage.records import ApiKeyRecord
from ..body import read_json_object
from ..context import require
from ..responses import JSONResponse
from ..schemas import request_body
from ..write.apply import apply_one
from ..write.table import ROUTES, RUN, WriteRoute

router = APIRouter()
Ingest = Annotated[ApiKeyRecord, Depends(require("ingest"))]


async def write(
    request: Request, route: WriteRoute, run_id: str, key: ApiKeyRecord
) -> JSONResponse:
    body = await read_json_object(request)
    command = route.build(key.org_id, run_id, body)
    return await apply_one(request, key.org_id, command, body)


def _endpoint(route: WriteRoute) -> Callable[..., Awaitable[JSONResponse]]:
    async def on_run(request: Request, run_id: str, key: Ingest) -> JSONResponse:
        return await write(request, route, run_id, key)

    async def create(request: Request, key: Ingest) -> JSONResponse:
        return await write(request, route, "", key)

    endpoint = on_run if RUN in route.path else create
    endpoint.__doc__ = route.doc
    return endpoint


for _route in ROUTES:
    router.add_api_route(
        _route.path,
        _endpoint(_route),
        methods=[_route.method],
        name=_route.name,
        status_code=_route.status_code,
        openapi_extra=request_body(_route.body),
    )
