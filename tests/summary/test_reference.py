"""The server's Distributed summary equals the numpy reference on randomized runs."""

from __future__ import annotations

import math
import uuid
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.summary.compare import assert_matches
from tests.summary.reference import Point, reference


def ingest(
    api: httpx.Client,
    writes: list[Point],
    key: str = "loss",
    name: str | None = None,
    batch: int = 10_000,
) -> str:
    """Send ``writes`` through ``/api/ingest`` in batches of ``batch`` events: a step
    split across two batches is whole in neither, so the store computes it once from the
    first batch's points and then again, from all of them, after the second."""
    run_id = f"sum-{uuid.uuid4().hex[:12]}"
    create: dict[str, Any] = {"project": "summary", "id": run_id}
    if name is not None:
        create["name"] = name
    events: list[dict[str, Any]] = [
        {
            "event_id": f"{run_id}-c",
            "request": {
                "method": "POST",
                "path": "/runs",
                "body": create,
            },
        }
    ]
    events += [
        {
            "event_id": f"{run_id}-{i}",
            "request": {
                "method": "POST",
                "path": f"/runs/{run_id}/rank-metrics",
                "body": {
                    **_values(key, p.value),
                    "step": p.step,
                    "rank": p.rank,
                    "world_size": p.world_size,
                    "local_rank": p.local_rank,
                    "weight": p.weight,
                },
            },
        }
        for i, p in enumerate(writes)
    ]
    for start in range(0, len(events), batch):
        response = api.post("/api/ingest", json={"events": events[start : start + batch]})
        assert response.status_code == 200
        assert {r["status"] for r in response.json()["results"]} <= {200, 201}
    # The job ended: its coverage is final, as the reference reads it (a live run's ranks
    # that sent points moments ago are "lagging", not missing: tests/summary/test_live.py).
    assert api.patch(f"/runs/{run_id}", json={"status": "finished"}).status_code == 200
    return run_id


def _values(key: str, value: float) -> dict[str, Any]:
    """A value as the SDK sends it: a finite one in ``metrics``, NaN or +-inf as a mark."""
    if math.isfinite(value):
        return {"metrics": {key: value}}
    return {"nonfinite": {key: "nan" if value != value else "inf" if value > 0 else "-inf"}}


def summary(api: httpx.Client, run_id: str, **params: Any) -> dict[str, Any]:
    response = api.get(
        f"/api/runs/{run_id}/distributed", params={k: v for k, v in params.items() if v is not None}
    )
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


@st.composite
def runs(draw: st.DrawFn) -> tuple[list[Point], float]:
    world = draw(st.sampled_from([1, 2, 3, 5, 8, 17]))
    n_steps = draw(st.integers(1, 25))
    stride = draw(st.sampled_from([1, 1, 10, 37]))
    offset = draw(st.integers(0, 1000))
    steps = [offset + i * stride for i in range(n_steps)]
    scale = draw(st.sampled_from([1.0, 1e-9, 1e9, 1e-300 * 1e290]))
    kind = draw(st.sampled_from(["normal", "ties", "constant"]))
    coverage = draw(st.sampled_from([1.0, 0.8, 0.4]))
    elastic = draw(st.booleans()) and world > 2
    weights = draw(st.sampled_from(["ones", "skewed", "random"]))
    # Some values NaN or +-inf (a rank diverging): marks, never values.
    poison = draw(st.sampled_from([0.0, 0.0, 0.1, 0.6]))
    seed = draw(st.integers(0, 2**32 - 1))
    import numpy as np

    rng = np.random.default_rng(seed)
    writes = []
    for s in steps:
        size = world - 1 if elastic and s == steps[0] and len(steps) > 1 else world
        for r in range(size):
            if coverage < 1.0 and rng.random() > coverage and not (s == steps[-1] and r == 0):
                continue
            if kind == "constant":
                value = 1.5
            elif kind == "ties":
                value = float(rng.choice([1.0, 1.0, 1.0, 2.0, 7.0]))
            else:
                value = float(rng.normal(1.0, 0.5))
            weight = {
                "ones": 1.0,
                "skewed": 1000.0 if r == 0 else 1.0,
                "random": float(rng.uniform(0.1, 100)),
            }[weights]
            local = None if r % 3 == 2 else r % 4
            if poison and rng.random() < poison:
                value = float(rng.choice([math.nan, math.inf, -math.inf]))
            writes.append(Point(s, r, value * scale, weight, local, size))
    # Duplicate writes of some points: the latest must win, a mark over a value and a value
    # over a mark included.
    for p in list(writes[: draw(st.integers(0, 5))]):
        if not math.isfinite(p.value):
            value = scale
        elif poison and rng.random() < 0.5:
            value = math.nan
        else:
            value = p.value * 2 + scale
        writes.append(Point(p.step, p.rank, value, p.weight, p.local_rank, p.world_size))
    return writes, scale


@st.composite
def queries(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "step_min": draw(st.one_of(st.none(), st.integers(0, 600))),
        "step_max": draw(st.one_of(st.none(), st.integers(600, 2000))),
        "max_points": draw(st.sampled_from([500, 7, 3, 1])),
        "heatmap_steps": draw(st.sampled_from([200, 5, 2, 1])),
        "z": draw(st.sampled_from([3.0, 1.0, 0.5])),
        "outlier_limit": 10_000,
    }


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(run=runs(), query=queries(), batch=st.sampled_from([10_000, 10_000, 7, 30]))
def test_summary_matches_reference(
    api: httpx.Client, run: tuple[list[Point], float], query: dict[str, Any], batch: int
) -> None:
    writes, scale = run
    run_id = ingest(api, writes, batch=batch)
    got = summary(api, run_id, **query)
    assert (got["run_id"], got["key"], got["keys"]) == (run_id, "loss", ["loss"])
    assert_matches(got, reference(writes, **query), scale, query["z"])


def test_world_size_512(api: httpx.Client) -> None:
    import numpy as np

    rng = np.random.default_rng(7)
    writes = [
        Point(s, r, float(rng.normal(5, 1)), float(rng.integers(1, 64)), r % 8, 512)
        for s in range(0, 40, 2)
        for r in range(512)
        if not (r == 300 and s > 20)
    ]
    run_id = ingest(api, writes)
    for query in (
        {},
        {"max_points": 6, "heatmap_steps": 4, "z": 2.0},
        {"step_min": 10, "step_max": 30},
    ):
        assert_matches(
            summary(api, run_id, **query), reference(writes, **query), 5.0, query.get("z", 3.0)
        )


def test_outlier_limit_keeps_the_strongest(api: httpx.Client) -> None:
    writes = [
        Point(s, r, 100.0 * (s + 1) if r == 3 else 1.0 + 0.01 * r, 1.0, None, 8)
        for s in range(10)
        for r in range(8)
    ]
    run_id = ingest(api, writes)
    got = summary(api, run_id, outlier_limit=4)
    assert [(o["step"], o["rank"]) for o in got["outliers"]] == [
        (o["step"], o["rank"]) for o in reference(writes, outlier_limit=4)["outliers"]
    ]
    assert len(got["outliers"]) == 4


def test_late_and_rewritten_points_update_the_summary(api: httpx.Client) -> None:
    writes = [Point(s, r, float(r), 1.0, None, 4) for s in range(5) for r in range(4)]
    run_id = ingest(api, writes)
    summary(api, run_id)  # aggregates now computed
    late = [Point(2, 1, 50.0, 3.0, 1, 4), Point(7, 0, 1.0, 1.0, None, 4)]
    path = f"/runs/{run_id}/rank-metrics"
    for p in late:
        body = {
            "metrics": {"loss": p.value},
            "step": p.step,
            "rank": p.rank,
            "world_size": 4,
            "local_rank": p.local_rank,
            "weight": p.weight,
        }
        assert api.post(path, json=body).status_code == 200
    assert_matches(summary(api, run_id), reference(writes + late), 1.0)
