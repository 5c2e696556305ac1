"""POST /api/ingest: events applied in order, each answered like its own request."""

from __future__ import annotations

import uuid

import httpx

from tests.helpers import rank_body, stored_rank_points


def _event(event_id: str, method: str, path: str, body: dict[str, object]) -> dict[str, object]:
    return {"event_id": event_id, "request": {"method": method, "path": path, "body": body}}


def test_a_whole_run_in_one_batch(api: httpx.Client) -> None:
    rid = f"ing-{uuid.uuid4().hex[:8]}"
    events = [_event("create", "POST", "/runs", {"project": "tests", "id": rid})]
    events += [
        _event(
            f"r{rank}",
            "POST",
            f"/runs/{rid}/rank-metrics",
            rank_body(metrics={"loss": rank / 10}, step=0, rank=rank, local_rank=rank % 4),
        )
        for rank in range(8)
    ]
    events.append(
        _event("scalar", "POST", f"/runs/{rid}/metrics", {"metrics": {"acc": 0.5}, "step": 0})
    )
    events.append(_event("finish", "PATCH", f"/runs/{rid}", {"status": "finished"}))
    response = api.post("/api/ingest", json={"events": events})
    assert response.status_code == 200
    results = response.json()["results"]
    assert [r["event_id"] for r in results] == [e["event_id"] for e in events]
    assert results[0]["status"] == 201 and results[0]["body"]["run"]["id"] == rid
    assert all(
        r == {"event_id": f"r{i}", "status": 200, "body": {"accepted": 1}}
        for i, r in enumerate(results[1:9])
    )
    assert results[-1]["status"] == 200 and results[-1]["body"]["run"]["status"] == "finished"
    assert [p[1] for p in stored_rank_points(api, rid, "loss")] == list(range(8))


def test_an_event_for_an_unknown_run_does_not_sink_the_batch(
    api: httpx.Client, run_id: str
) -> None:
    events = [
        _event("a", "POST", "/runs/not-there/rank-metrics", rank_body()),
        _event("b", "POST", f"/runs/{run_id}/rank-metrics", rank_body()),
    ]
    results = api.post("/api/ingest", json={"events": events}).json()["results"]
    assert [r["status"] for r in results] == [404, 200]
    assert len(stored_rank_points(api, run_id, "train/loss")) == 1


def test_ten_thousand_events_is_never_too_large(api: httpx.Client, run_id: str) -> None:
    events = [
        _event(
            f"big-{i}",
            "POST",
            f"/runs/{run_id}/rank-metrics",
            rank_body(metrics={"loss": float(i)}, step=i // 8, rank=i % 8, local_rank=None),
        )
        for i in range(10_000)
    ]
    response = api.post("/api/ingest", json={"events": events})
    assert response.status_code == 200
    assert {r["status"] for r in response.json()["results"]} == {200}
    assert len(stored_rank_points(api, run_id, "loss")) == 10_000


def test_empty_batch(api: httpx.Client) -> None:
    assert api.post("/api/ingest", json={"events": []}).json() == {"results": []}
