"""Runs: read one, list (their writes are write routes: ``routes/writes.py``)."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from starlette.concurrency import run_in_threadpool

from ...health.detectors import ranks_lost, status
from ...storage.records import RANK, ApiKeyRecord, RunRecord
from ..context import Services, require, services
from ..errors import ApiError

router = APIRouter()
Ingest = Annotated[ApiKeyRecord, Depends(require("ingest"))]
Read = Annotated[ApiKeyRecord, Depends(require("read"))]


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
