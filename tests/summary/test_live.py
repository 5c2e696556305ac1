"""Coverage of a live run (docs/reference.md, "The Distributed summary"): ranks upload at
different moments, so a rank behind the others that sent points within ``lag_seconds`` is
``lagging``, not missing; one quiet that long is missing; once the run ends, what is
absent is missing. In a zoomed range, a rank that left before it was "last seen" there."""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx

from tests.summary.test_reference import summary


def _post(api: httpx.Client, run_id: str, steps: range, ranks: range) -> None:
    events = [
        {
            "event_id": f"{run_id}-{s}-{r}",
            "request": {
                "method": "POST",
                "path": f"/runs/{run_id}/rank-metrics",
                "body": {"metrics": {"loss": 1.0 + 0.01 * r}, "step": s, "rank": r,
                         "world_size": 4},
            },
        }
        for s in steps
        for r in ranks
    ]  # fmt: skip
    response = api.post("/api/ingest", json={"events": events})
    assert response.status_code == 200 and all(
        x["status"] == 200 for x in response.json()["results"]
    )


def _run(api: httpx.Client, lag: float) -> str:
    run_id = f"live-{uuid.uuid4().hex[:8]}"
    assert api.post("/runs", json={"project": "live", "id": run_id}).status_code == 201
    health = [{"path": "health/lag_seconds", "type": "health", "value": lag}]
    assert (
        api.post(f"/api/runs/{run_id}/attributes", json={"attributes": health}).status_code == 200
    )
    return run_id


def coverage(api: httpx.Client, run_id: str, **params: Any) -> dict[str, Any]:
    return dict(summary(api, run_id, key="loss", **params)["coverage"])


def test_a_rank_behind_but_sending_is_lagging_until_it_is_quiet(api: httpx.Client) -> None:
    run_id = _run(api, lag=2.0)
    _post(api, run_id, range(50), range(4))
    _post(api, run_id, range(50, 60), range(3))  # rank 3's uploads are 10 steps behind
    live = coverage(api, run_id)
    assert live["missing"] == [] and live["lagging"] == [{"rank": 3, "last_step": 49}]
    time.sleep(1.0)
    _post(api, run_id, range(60, 62), range(3))  # the others go on; rank 3 says nothing
    time.sleep(1.5)  # rank 3 quiet for 2.5 s now, the run still live
    quiet = coverage(api, run_id)
    assert quiet["lagging"] == []
    assert quiet["missing"] == [{"rank": 3, "last_seen_step": 49, "first_missing_step": 50}]
    _post(api, run_id, range(50, 62), [3])  # its late upload arrives: whole again
    assert coverage(api, run_id)["missing"] == coverage(api, run_id)["lagging"] == []


def test_an_ended_runs_coverage_is_final(api: httpx.Client) -> None:
    run_id = _run(api, lag=60.0)
    _post(api, run_id, range(20), range(4))
    _post(api, run_id, range(20, 30), range(3))
    assert coverage(api, run_id)["lagging"] == [{"rank": 3, "last_step": 19}]
    assert api.patch(f"/runs/{run_id}", json={"status": "finished"}).status_code == 200
    final = coverage(api, run_id)
    assert final["lagging"] == []
    assert final["missing"] == [{"rank": 3, "last_seen_step": 19, "first_missing_step": 20}]


def test_a_zoom_after_a_rank_left_says_where_it_was_last_seen(api: httpx.Client) -> None:
    run_id = _run(api, lag=60.0)
    _post(api, run_id, range(20), range(4))
    _post(api, run_id, range(20, 60), range(3))  # rank 3 left after step 19
    assert api.patch(f"/runs/{run_id}", json={"status": "finished"}).status_code == 200
    zoomed = coverage(api, run_id, step_min=40, step_max=59)
    assert zoomed["missing"] == [{"rank": 3, "last_seen_step": 19, "first_missing_step": 40}]
