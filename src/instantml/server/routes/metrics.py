"""Metric writes (scalar and per-rank), run attributes, and the raw series behind them."""

from __future__ import annotations

import math
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from starlette.concurrency import run_in_threadpool

from ...storage.base import ApiKeyRecord
from ...validation import mark_of
from .. import schemas, writes
from ..apply import apply_one
from ..auth import require
from ..body import read_json_object
from ..errors import ApiError
from ..responses import JSONResponse

router = APIRouter()
Ingest = Annotated[ApiKeyRecord, Depends(require("ingest"))]
Read = Annotated[ApiKeyRecord, Depends(require("read"))]
MetricKey = Annotated[str, Query(min_length=1, max_length=2048)]


@router.post("/runs/{run_id}/metrics", openapi_extra=schemas.SCALARS)
async def log_scalars(request: Request, run_id: str, key: Ingest) -> JSONResponse:
    body = await read_json_object(request)
    return await apply_one(request, key.org_id, writes.scalars(key.org_id, run_id, body), body)


@router.post("/runs/{run_id}/rank-metrics", openapi_extra=schemas.RANK_POINTS)
async def log_rank_metrics(request: Request, run_id: str, key: Ingest) -> JSONResponse:
    body = await read_json_object(request)
    return await apply_one(request, key.org_id, writes.rank_points(key.org_id, run_id, body), body)


@router.post("/api/runs/{run_id}/attributes", openapi_extra=schemas.ATTRIBUTES)
async def log_attributes(request: Request, run_id: str, key: Ingest) -> JSONResponse:
    body = await read_json_object(request)
    return await apply_one(request, key.org_id, writes.attributes(key.org_id, run_id, body), body)


@router.get("/api/runs/{run_id}/keys")
async def list_keys(request: Request, run_id: str, key: Read) -> dict[str, Any]:
    """Every metric key of the run, rank-scoped and scalar, with point counts."""
    series = await run_in_threadpool(request.app.state.store.list_series, key.org_id, run_id)
    if series is None:
        raise ApiError(404, f"run {run_id!r} not found")
    return {
        "keys": [
            {"key": s.key, "kind": s.kind, "points": s.points, "last_step": s.last_step}
            for s in series
        ]
    }


@router.get("/api/runs/{run_id}/metrics")
async def scalar_series(
    request: Request, run_id: str, key: Read, metric: MetricKey
) -> dict[str, Any]:
    """One scalar series: ``points`` as ``[step, value]`` pairs (finite values), and
    ``nonfinite`` as ``[step, "nan" | "inf" | "-inf"]`` pairs."""
    points = await run_in_threadpool(
        request.app.state.store.scalar_points, key.org_id, run_id, metric
    )
    if points is None:
        raise ApiError(404, f"metric {metric!r} of run {run_id!r} not found")
    finite = [p for p in points if math.isfinite(p[1])]
    marks = (
        [[s, mark_of(v)] for s, v in points if not math.isfinite(v)]
        if len(finite) < len(points)
        else []
    )
    return {"run_id": run_id, "key": metric, "points": finite, "nonfinite": marks}


@router.get("/api/runs/{run_id}/rank-points")
async def rank_series(
    request: Request, run_id: str, key: Read, metric: MetricKey
) -> dict[str, Any]:
    """Every stored rank point of one key: ``[step, rank, value, weight, local_rank,
    world_size]``; a non-finite value as its mark, ``"nan"``, ``"inf"`` or ``"-inf"``."""
    points = await run_in_threadpool(
        request.app.state.store.rank_points, key.org_id, run_id, metric
    )
    if points is None:
        raise ApiError(404, f"rank metric {metric!r} of run {run_id!r} not found")
    shown = [p if math.isfinite(p[2]) else (p[0], p[1], mark_of(p[2]), *p[3:]) for p in points]
    return {"run_id": run_id, "key": metric, "points": shown}
