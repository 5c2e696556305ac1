"""``GET /api/runs/{id}/distributed``: the Distributed summary of one rank-metric key."""

from __future__ import annotations

import time
from functools import partial
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from starlette.concurrency import run_in_threadpool

from ...rankmath.params import SummaryParams, default_key
from ...rankmath.stragglers import DEFAULT_KEY, DEFAULT_WINDOW, scores
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
    points = found.stores.points
    keys, metric, sid = await _rank_series(found, key.org_id, run_id, metric)
    try:
        params = SummaryParams(
            metric, step_min, step_max, max_points, heatmap_steps, z, outlier_limit
        )
    except ValueError as exc:
        raise ApiError(422, str(exc)) from None
    # Answer with every point committed before the request: stale aggregates are brought
    # up to date first, by the writer (the only thread that writes).
    if await run_in_threadpool(points.needs_refresh, sid):
        await found.writer.compact(sid)
    # Between its reads the summary waits for the writes in flight (a bounded wait): a
    # summary is polled every few seconds, a write's answer holds up a training job.
    reading = points.summary_reading(sid, params)
    rows = await run_in_threadpool(drive, reading, found.writer.wait_quiet)
    answer = assemble(rows, params)
    activity = await run_in_threadpool(found.stores.runs.rank_activity, key.org_id, run_id)
    await run_in_threadpool(
        _live_coverage, found, key.org_id, run_id, sid, params, answer, activity
    )
    nodes = _nodes(activity)
    add_nodes(answer, nodes)
    if order == "node":
        order_heatmap_by_node(answer["heatmap"], nodes)
    # Rendered straight by orjson: the answer is already plain data, and validating a
    # 100k-cell heatmap as ``dict[str, Any]`` would cost more than reading it.
    return JSONResponse({"run_id": run_id, "key": metric, "keys": keys, **answer})


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
    step_range, medians = await run_in_threadpool(
        found.stores.points.window_medians, sid, window, step_max
    )
    th = await run_in_threadpool(found.monitor.thresholds, key.org_id, run_id)
    activity = await run_in_threadpool(found.stores.runs.rank_activity, key.org_id, run_id)
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
