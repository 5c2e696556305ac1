"""The raw series of a run: its keys, scalars, rank points and console lines (their
writes are write routes: ``routes/writes.py``)."""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from ...storage import export
from ...storage.protocols import Stores
from ...storage.records import RANK, SCALAR, ApiKeyRecord
from ..context import require, services
from ..errors import ApiError
from ..export import MEDIA_TYPES, RANK_SCHEMA, SCALAR_SCHEMA, Format, stream, with_nodes
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


def _download(
    request: Request,
    key: ApiKeyRecord,
    run_id: str,
    kind: int,
    metric: str,
    fmt: Format,
    bounds: tuple[float | None, float | None],
) -> StreamingResponse:
    """A series' points as ``fmt``, streamed window by window (``server/export.py``)."""
    lo, hi = bounds
    if lo is not None and hi is not None and lo > hi:
        raise ApiError(422, f"step_min: {lo} is greater than step_max {hi}")
    stores = services(request).stores
    sid = stores.runs.series_id(key.org_id, run_id, kind, metric)
    if sid is None:
        what = "rank metric" if kind == RANK else "metric"
        raise ApiError(404, f"{what} {metric!r} of run {run_id!r} not found")
    tables = export.tables(stores.export, kind, sid, lo, hi)
    if kind == RANK:
        schema = RANK_SCHEMA
        said = stores.runs.rank_activity(key.org_id, run_id)
        nodes = {rank: a.node for rank, a in said.items() if a.node is not None}
        tables = (with_nodes(t, nodes) for t in tables)
    else:
        schema = SCALAR_SCHEMA
    head = {"run_id": run_id, "key": metric}
    headers = {}
    if fmt != "json":
        name = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{run_id}-{metric}")
        headers["Content-Disposition"] = f'attachment; filename="{name}.{fmt}"'
    return StreamingResponse(
        stream(tables, schema, fmt, head), media_type=MEDIA_TYPES[fmt], headers=headers
    )


FormatQuery = Annotated[
    Format, Query(description="json (default), csv, parquet or arrow (an IPC stream)")
]


@router.get("/api/runs/{run_id}/metrics")
async def scalar_series(
    request: Request,
    run_id: str,
    key: Read,
    name: KeyName = None,
    format: FormatQuery = "json",
    step_min: Annotated[float | None, Query(ge=0)] = None,
    step_max: Annotated[float | None, Query(ge=0)] = None,
) -> StreamingResponse:
    """Every stored point of one scalar key: columns ``step, value, timestamp``; in JSON
    ``{run_id, key, columns, points}`` with a non-finite value as its mark (``"nan"``,
    ``"inf"``, ``"-inf"``), in CSV, Parquet and Arrow as NaN or +-inf."""
    metric = required(name)
    return await run_in_threadpool(
        _download, request, key, run_id, SCALAR, metric, format, (step_min, step_max)
    )


@router.get("/api/runs/{run_id}/rank-points")
async def rank_series(
    request: Request,
    run_id: str,
    key: Read,
    name: KeyName = None,
    format: FormatQuery = "json",
    step_min: Annotated[int | None, Query(ge=0)] = None,
    step_max: Annotated[int | None, Query(ge=0)] = None,
) -> StreamingResponse:
    """Every stored point of one rank key, by step then rank: columns ``step, rank,
    local_rank, node, value, weight, world_size``; in JSON ``{run_id, key, columns,
    points}`` with a non-finite value as its mark, in CSV, Parquet and Arrow as NaN or
    +-inf. Streamed: a run of any length leaves the server in bounded memory."""
    metric = required(name)
    return await run_in_threadpool(
        _download, request, key, run_id, RANK, metric, format, (step_min, step_max)
    )
