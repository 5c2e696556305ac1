"""Runs: create (idempotent by id), read, change status, list."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from starlette.concurrency import run_in_threadpool

from ...health.detectors import status
from ...storage.records import ApiKeyRecord
from .. import schemas, writes
from ..apply import apply_one
from ..body import read_json_object
from ..errors import ApiError
from ..responses import JSONResponse
from ..services import require, services

router = APIRouter()
Ingest = Annotated[ApiKeyRecord, Depends(require("ingest"))]
Read = Annotated[ApiKeyRecord, Depends(require("read"))]


@router.post("/runs", openapi_extra=schemas.CREATE_RUN, status_code=201)
async def create_run(request: Request, key: Ingest) -> JSONResponse:
    """Create a run, or attach to it (200) when its ``id`` exists in the same project."""
    body = await read_json_object(request)
    return await apply_one(request, key.org_id, writes.create_run(key.org_id, body), body)


@router.get("/runs/{run_id}")
async def get_run(request: Request, run_id: str, key: Read) -> dict[str, Any]:
    stores = services(request).stores
    record = await run_in_threadpool(stores.runs.get_run, key.org_id, run_id)
    if record is None:
        raise ApiError(404, f"run {run_id!r} not found")
    kinds = await run_in_threadpool(stores.health.open_kinds, key.org_id, [run_id])
    return {"run": {**record.to_json(), "health": status(kinds.get(run_id, []))}}


@router.patch("/runs/{run_id}", openapi_extra=schemas.PATCH_RUN)
async def patch_run(request: Request, run_id: str, key: Ingest) -> JSONResponse:
    body = await read_json_object(request)
    return await apply_one(request, key.org_id, writes.patch_run(key.org_id, run_id, body), body)


@router.get("/api/runs")
async def list_runs(
    request: Request,
    key: Read,
    project: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict[str, Any]:
    """The org's runs, newest first, optionally of one project."""
    stores = services(request).stores
    records = await run_in_threadpool(stores.runs.list_runs, key.org_id, project, limit)
    kinds = await run_in_threadpool(
        stores.health.open_kinds, key.org_id, [record.run_id for record in records]
    )
    return {
        "runs": [
            {**record.to_json(), "health": status(kinds.get(record.run_id, []))}
            for record in records
        ]
    }
