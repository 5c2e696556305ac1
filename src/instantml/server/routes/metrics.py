"""The raw series of a run: its keys, scalars, rank points and console lines (their
writes are write routes: ``routes/writes.py``)."""

from __future__ import annotations

import math
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from starlette.concurrency import run_in_threadpool

from ...storage.protocols import Stores
from ...storage.records import RANK, SCALAR, ApiKeyRecord
from ...validation import mark_of
from ..context import require, services
from ..errors import ApiError
from ..keyquery import KeyName, required
from ..responses import JSONResponse
from ..write import validate

router = APIRouter()
CAPTURED = "string_series"  # the public SDK's capture_console: log_text under console/
Ingest = Annotated[ApiKeyRecord, Depends(require("ingest"))]
Read = Annotated[ApiKeyRecord, Depends(require("read"))]


@router.get("/api/runs/{run_id}/logs")
async def console_lines(
    request: Request,
    run_id: str,
    key: Read,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 1000,
) -> JSONResponse:
    """The run's last ``limit`` console lines, in the order written: numbered lines
    (``log_console``; one sent again keeps its place and its latest text) and the text
    ``capture_console=True`` logs as ``console/stdout`` / ``console/stderr`` string series
    (at the run's current step)."""
    stores = services(request).stores
    if await run_in_threadpool(stores.runs.get_run, key.org_id, run_id) is None:
        raise ApiError(404, f"run {run_id!r} not found")
    found = await run_in_threadpool(
        stores.runs.attributes_of, key.org_id, run_id, (validate.CONSOLE, CAPTURED), "console/"
    )
    lines: dict[tuple[str, int | None] | int, dict[str, Any]] = {}
    for i, (kind, path, step, value) in enumerate(found):
        stream = path.removeprefix("console/")
        if kind == validate.CONSOLE:  # log_console: numbered lines
            lines[(path, step)] = {
                "stream": stream, "line_number": step, "step": None,
                "message": value.get("message"), "timestamp": value.get("timestamp"),
            }  # fmt: skip
        elif isinstance(value, str):  # capture_console: text at the run's current step
            lines[i] = {
                "stream": stream, "line_number": None, "step": step, "message": value,
                "timestamp": None,
            }  # fmt: skip
    listed = list(lines.values())
    return JSONResponse({"total": len(listed), "lines": listed[-limit:]})


@router.get("/api/runs/{run_id}/keys")
async def list_keys(request: Request, run_id: str, key: Read) -> dict[str, Any]:
    """Every metric key of the run, rank-scoped and scalar, with point counts."""
    series = await run_in_threadpool(_series, services(request).stores, key.org_id, run_id)
    if series is None:
        raise ApiError(404, f"run {run_id!r} not found")
    return {"keys": series}


def _series(stores: Stores, org_id: int, run_id: str) -> list[dict[str, Any]] | None:
    found = stores.runs.series(org_id, run_id)
    if found is None:
        return None
    counts = stores.points.counts([sid for sid, _, _ in found])
    listed = []
    for sid, kind, name in sorted(found, key=lambda s: (s[2], s[1])):
        points, last = counts.get(sid, (0, None))
        if points:  # a series staged by a unit that then failed has none: not shown
            kind_name = "rank" if kind == RANK else "scalar"
            listed.append({"key": name, "kind": kind_name, "points": points, "last_step": last})
    return listed


def _points(stores: Stores, org_id: int, run_id: str, kind: int, metric: str) -> list[Any] | None:
    sid = stores.runs.series_id(org_id, run_id, kind, metric)
    if sid is None:
        return None
    return (stores.points.rank_points if kind == RANK else stores.points.scalar_points)(sid)


@router.get("/api/runs/{run_id}/metrics")
async def scalar_series(
    request: Request, run_id: str, key: Read, name: KeyName = None
) -> dict[str, Any]:
    """One scalar series: ``points`` as ``[step, value]`` pairs (finite values), and
    ``nonfinite`` as ``[step, "nan" | "inf" | "-inf"]`` pairs."""
    metric = required(name)
    stores = services(request).stores
    points = await run_in_threadpool(_points, stores, key.org_id, run_id, SCALAR, metric)
    if points is None:
        raise ApiError(404, f"metric {metric!r} of run {run_id!r} not found")
    finite = [p for p in points if math.isfinite(p[1])]
    marks = [[s, mark_of(v)] for s, v in points if not math.isfinite(v)]
    return {"run_id": run_id, "key": metric, "points": finite, "nonfinite": marks}


@router.get("/api/runs/{run_id}/rank-points")
async def rank_series(
    request: Request, run_id: str, key: Read, name: KeyName = None
) -> dict[str, Any]:
    """Every stored rank point of one key: ``[step, rank, value, weight, local_rank,
    world_size]``; a non-finite value as its mark, ``"nan"``, ``"inf"`` or ``"-inf"``."""
    metric = required(name)
    stores = services(request).stores
    points = await run_in_threadpool(_points, stores, key.org_id, run_id, RANK, metric)
    if points is None:
        raise ApiError(404, f"rank metric {metric!r} of run {run_id!r} not found")
    shown = [p if math.isfinite(p[2]) else (p[0], p[1], mark_of(p[2]), *p[3:]) for p in points]
    return {"run_id": run_id, "key": metric, "points": shown}
