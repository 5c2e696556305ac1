"""Runs: read one, list (their writes are write routes: ``routes/writes.py``)."""

from __future__ import annotations

import time
from typing import Annotated, Any

import msgspec
from fastapi import APIRouter, Depends, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from ...health.detectors import ranks_lost, status
from ...storage.records import RANK, ApiKeyRecord, RunRecord
from ..body import read_json_object
from ..context import Services, require, services
from ..errors import ApiError
from ..schemas import request_body

router = APIRouter()
Ingest = Annotated[ApiKeyRecord, Depends(require("ingest"))]
Read = Annotated[ApiKeyRecord, Depends(require("read"))]
Admin = Annotated[ApiKeyRecord, Depends(require("admin"))]


def _lost(found: Services, org_id: int, record: RunRecord) -> list[dict[str, Any]]:
    """``ranks_lost``: ranks that logged and never finished while the others did, each with
    its last step (over the run's rank keys)."""
    stores = found.stores
    activity = stores.runs.rank_activity(org_id, record.run_id)
    if not activity:
        return []
    th = found.monitor.thresholds(org_id, record.run_id)
    lost = ranks_lost(activity, th, time.time())
    if not lost:
        return []
    last: dict[int, int] = {}
    for sid, kind, _ in stores.runs.series(org_id, record.run_id) or []:
        if kind == RANK:
            for rank, step in stores.points.last_steps_of(sid, lost).items():
                last[rank] = max(step, last.get(rank, -1))
    return [{"rank": r, "last_step": last.get(r)} for r in lost]


def _runs_json(found: Services, org_id: int, records: list[RunRecord]) -> list[dict[str, Any]]:
    """Runs as the API gives them: with their health and the ranks they lost."""
    kinds = found.stores.health.open_kinds(org_id, [record.run_id for record in records])
    return [
        {
            **record.to_json(),
            "health": status(kinds.get(record.run_id, [])),
            "ranks_lost": _lost(found, org_id, record),
        }
        for record in records
    ]


@router.get("/runs/{run_id}")
async def get_run(request: Request, run_id: str, key: Read) -> dict[str, Any]:
    found = services(request)
    record = await run_in_threadpool(found.stores.runs.get_run, key.org_id, run_id)
    if record is None:
        raise ApiError(404, f"run {run_id!r} not found")
    (run,) = await run_in_threadpool(_runs_json, found, key.org_id, [record])
    return {"run": run}


@router.get("/api/runs")
async def list_runs(
    request: Request,
    key: Read,
    project: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict[str, Any]:
    """The org's runs, newest first, optionally of one project."""
    found = services(request)
    records = await run_in_threadpool(found.stores.runs.list_runs, key.org_id, project, limit)
    return {"runs": await run_in_threadpool(_runs_json, found, key.org_id, records)}


@router.delete("/api/runs/{run_id}", status_code=204)
async def delete_run(request: Request, run_id: str, key: Admin) -> Response:
    """Delete a run and everything of it: its points, aggregates, logs, alerts and their
    deliveries leave the stores (answered once its points are gone from the point store).
    The month's usage stays as charged; the id may name a new run at once. A write that
    arrives later finds no run (404)."""
    if not await services(request).writer.delete_run(key.org_id, run_id):
        raise ApiError(404, f"run {run_id!r} not found")
    return Response(status_code=204)


class RetentionBody(msgspec.Struct):
    """``PUT /api/projects/{project}/retention``: days a run is kept after its last write
    (null: for ever)."""

    days: Annotated[int, msgspec.Meta(ge=1, le=100_000)] | None


def _retention(found: Services, org_id: int, project: str) -> dict[str, Any]:
    own, days = found.stores.deletions.retention(org_id, project)
    default = found.settings.retention_days
    return {"project": project, "days": days if own else default, "default": not own}


@router.get("/api/projects/{project}/retention")
async def get_retention(request: Request, project: str, key: Read) -> dict[str, Any]:
    """How many days a project's runs are kept after their last write (``days``; null:
    for ever), and whether that is the server's default (``INSTANTML_RETENTION_DAYS``)."""
    return await run_in_threadpool(_retention, services(request), key.org_id, project)


@router.put("/api/projects/{project}/retention", openapi_extra=request_body(RetentionBody))
async def set_retention(request: Request, project: str, key: Admin) -> dict[str, Any]:
    """Set a project's retention: ``{"days": N}`` deletes its runs N days after their last
    write (in the background, a bounded unit at a time); ``{"days": null}`` keeps them for
    ever whatever the server's default."""
    body = await read_json_object(request)
    if "days" not in body:
        raise ApiError(422, "days: Field required (a number of days, or null: for ever)")
    days = body["days"]
    if days is not None and (type(days) is not int or not 1 <= days <= 100_000):
        raise ApiError(422, f"days: must be an integer from 1 to 100000, or null; got {days!r}")
    if not 1 <= len(project) <= 255 or "\x00" in project:
        raise ApiError(422, "project: must be 1 to 255 characters, without NUL")
    found = services(request)

    def store() -> None:
        with found.stores.unit():
            found.stores.deletions.set_retention(key.org_id, project, days)

    await run_in_threadpool(store)
    return await run_in_threadpool(_retention, found, key.org_id, project)
