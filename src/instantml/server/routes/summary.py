"""``GET /api/runs/{id}/distributed``: the Distributed summary of one rank-metric key."""

from __future__ import annotations

import time
from functools import partial
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from starlette.concurrency import run_in_threadpool

from ...rankmath.params import SummaryParams, default_key
from ...rankmath.stragglers import DEFAULT_KEY, DEFAULT_WINDOW, is_timing_key, scores
from ...storage.querier import drive
from ...storage.records import RANK, ApiKeyRecord, RankActivity
from ...summary.assemble import assemble
from ...summary.coverage import seen_before, split_lagging
from ...summary.nodes import add_nodes, node_scores, order_heatmap_by_node
from ..context import Services, require, services
from ..errors import ApiError
from ..keyquery import KeyName
from ..responses import JSONResponse

router = APIRouter()
Read = Annotated[ApiKeyRecord, Depends(require("read"))]


async def _rank_series(
    found: Services, org_id: int, run_id: str, metric: str | None
) -> tuple[list[str], str, int]:
    """The run's rank keys, the key asked for (default: a loss, ``default_key``), and its
    series; 404s that name what exists."""
    series = await run_in_threadpool(found.stores.runs.series, org_id, run_id)
    if series is None:
        raise ApiError(404, f"run {run_id!r} not found")
    ids = {name: sid for sid, kind, name in series if kind == RANK}
    keys = sorted(ids)
    if metric is None:
        if not keys:
            raise ApiError(404, f"run {run_id!r} has no rank metrics yet")
        metric = default_key(keys)
    elif metric not in ids:
        listed = ", ".join(repr(k) for k in keys[:20]) + (", ..." if len(keys) > 20 else "")
        raise ApiError(
            404, f"key: run {run_id!r} has no rank metric {metric!r}; its rank metrics: {listed}"
        )
    return keys, metric, ids[metric]


@router.get("/api/runs/{run_id}/distributed")
async def distributed(
    request: Request,
    run_id: str,
    key: Read,
    metric: KeyName = None,
    step_min: Annotated[int | None, Query(ge=0)] = None,
    step_max: Annotated[int | None, Query(ge=0)] = None,
    max_points: Annotated[int, Query(ge=1, le=10_000)] = 500,
    heatmap_steps: Annotated[int, Query(ge=1, le=2_000)] = 200,
    z: Annotated[float, Query(gt=0, le=1e6)] = 3.0,
    outlier_limit: Annotated[int, Query(ge=0, le=10_000)] = 100,
    order: Annotated[
        Literal["rank", "node"], Query(description="the heatmap's rows: by rank, or by node")
    ] = "rank",
) -> JSONResponse:
    """Reducers across ranks per step, coverage, rank x step heatmap, outliers, the
    per-rank rollup and the ranks grouped by node, of one key (default: a loss)."""
    found = services(request)
    keys, metric, sid = await _rank_series(found, key.org_id, run_id, metric)
    try:
        params = SummaryParams(
            metric, step_min, step_max, max_points, heatmap_steps, z, outlier_limit
        )
    except ValueError as exc:
        raise ApiError(422, str(exc)) from None
    answer = await _summary(found, key.org_id, run_id, sid, params, order)
    # Rendered straight by orjson: the answer is already plain data, and validating a
    # 100k-cell heatmap as ``dict[str, Any]`` would cost more than reading it.
    return JSONResponse({"run_id": run_id, "key": metric, "keys": keys, **answer})


async def _summary(
    found: Services, org_id: int, run_id: str, sid: int, params: SummaryParams, order: str
) -> dict[str, Any]:
    """The Distributed summary of one series, as the route answers it."""
    points = found.stores.points
    # Answer with every point committed before the request: stale aggregates are brought
    # up to date first, by the writer (the only thread that writes).
    if await run_in_threadpool(points.needs_refresh, sid):
        await found.writer.compact(sid)
    # Between its reads the summary waits for the writes in flight (a bounded wait): a
    # summary is polled every few seconds, a write's answer holds up a training job.
    reading = points.summary_reading(sid, params)
    rows = await run_in_threadpool(drive, reading, found.writer.wait_quiet)
    answer = assemble(rows)
    activity = await run_in_threadpool(found.stores.runs.rank_activity, org_id, run_id)
    await run_in_threadpool(_live_coverage, found, org_id, run_id, sid, params, answer, activity)
    nodes = _nodes(activity)
    add_nodes(answer, nodes)
    if order == "node":
        order_heatmap_by_node(answer["heatmap"], nodes)
    return answer


def _nodes(activity: dict[int, RankActivity]) -> dict[int, str]:
    """Each rank's node, for the ranks that said one."""
    return {rank: a.node for rank, a in activity.items() if a.node is not None}


def _live_coverage(
    found: Services, org_id: int, run_id: str, sid: int, params: SummaryParams,
    answer: dict[str, Any], activity: dict[int, RankActivity],
) -> None:  # fmt: skip
    """Coverage as it is now: ranks merely behind in a live run (running, and sent points
    within the run's ``lag_seconds``) are ``lagging``, not missing, when the server heard
    from them within ``lag_seconds``;
    in a zoomed range, a rank that left before it is "last seen" where it was."""
    coverage = answer["coverage"]
    missing = seen_before(answer, params.step_min, partial(found.stores.points.last_steps_of, sid))
    lagging: list[dict[str, Any]] = []
    run = found.stores.runs.get_run(org_id, run_id) if missing else None
    if run is not None and run.status == "running":  # an ended run's coverage is final
        th = found.monitor.thresholds(org_id, run_id)
        heard = {rank: a.last_seen for rank, a in activity.items()}
        missing, lagging = split_lagging(missing, heard, time.time(), th.lag_seconds)
    coverage["missing"], coverage["lagging"] = missing, lagging


@router.get("/api/runs/{run_id}/stragglers")
async def stragglers(
    request: Request,
    run_id: str,
    key: Read,
    metric: KeyName = None,
    window: Annotated[int, Query(ge=1, le=100_000)] = DEFAULT_WINDOW,
    step_max: Annotated[int | None, Query(ge=0)] = None,
) -> dict[str, Any]:
    """Per-rank straggler scores of a timing key over its last ``window`` steps (up to
    ``step_max``, a zoom's last step): the fastest judged rank's median over this rank's;
    below the run's ``straggler_score`` (0.75), from ``straggler_min_steps`` samples and
    ``straggler_min_ms`` above the fastest, a straggler."""
    found = services(request)
    _, metric, sid = await _rank_series(found, key.org_id, run_id, metric or DEFAULT_KEY)
    return await _stragglers(found, key.org_id, run_id, metric, sid, window, step_max)


async def _stragglers(
    found: Services, org_id: int, run_id: str, metric: str, sid: int, window: int,
    step_max: int | None,
) -> dict[str, Any]:  # fmt: skip
    step_range, medians = await run_in_threadpool(
        found.stores.points.window_medians, sid, window, step_max
    )
    th = await run_in_threadpool(found.monitor.thresholds, org_id, run_id)
    activity = await run_in_threadpool(found.stores.runs.rank_activity, org_id, run_id)
    answer = {
        "run_id": run_id,
        "key": metric,
        "window": window,
        "step_range": None if step_range is None else list(step_range),
        "threshold": th.straggler_score,
        "min_steps": th.straggler_min_steps,
        "min_ms": th.straggler_min_ms,
        **scores(medians, th.straggler_score, th.straggler_min_steps, th.straggler_min_ms),
    }
    node_scores(answer, _nodes(activity))
    return answer


MAX_COMPARED = 8


@router.get("/api/compare")
async def compare(
    request: Request,
    key: Read,
    runs: Annotated[str, Query(description="run ids, comma-separated (2 to 8)")],
    metric: KeyName = None,
    max_points: Annotated[int, Query(ge=1, le=10_000)] = 500,
) -> JSONResponse:
    """Runs side by side on one rank key (default: a loss every run has): per run its
    record, world size, band (``steps``), last step's reducers (``last``), per-rank rollup,
    nodes, coverage, and straggler scores of a timing key (the key itself when it is one,
    else ``perf/forward_ms`` when the run has it)."""
    found = services(request)
    run_ids = [r for r in (part.strip() for part in runs.split(",")) if r]
    if not 2 <= len(run_ids) <= MAX_COMPARED or len(set(run_ids)) != len(run_ids):
        raise ApiError(422, f"runs: 2 to {MAX_COMPARED} distinct run ids, comma-separated")
    records = []
    for run_id in run_ids:
        record = await run_in_threadpool(found.stores.runs.get_run, key.org_id, run_id)
        if record is None:
            raise ApiError(404, f"runs: run {run_id!r} not found")
        records.append(record)
    if metric is None:
        shared = None
        for run_id in run_ids:
            keys, _, _ = await _rank_series(found, key.org_id, run_id, None)
            shared = set(keys) if shared is None else shared & set(keys)
        if not shared:
            raise ApiError(404, "key: these runs have no rank metric in common")
        metric = default_key(sorted(shared))
    compared = []
    for record in records:
        keys, _, sid = await _rank_series(found, key.org_id, record.run_id, metric)
        params = SummaryParams(metric, None, None, max_points, 1, 3.0, 0)
        answer = await _summary(found, key.org_id, record.run_id, sid, params, "rank")
        timing = metric if is_timing_key(metric) else DEFAULT_KEY if DEFAULT_KEY in keys else None
        stragglers = None
        if timing is not None:
            _, _, timing_sid = await _rank_series(found, key.org_id, record.run_id, timing)
            stragglers = await _stragglers(
                found, key.org_id, record.run_id, timing, timing_sid, DEFAULT_WINDOW, None
            )
        compared.append(
            {
                "run": record.to_json(),
                "world_size": answer["world_size"],
                "step_range": answer["step_range"],
                "bucket_size": answer["bucket_size"],
                "steps": answer["steps"],
                "last": answer["steps"][-1] if answer["steps"] else None,
                "ranks": answer["ranks"],
                "nodes": answer["nodes"],
                "coverage": answer["coverage"],
                "stragglers": stragglers,
            }
        )
    return JSONResponse({"key": metric, "runs": compared})
