"""Idempotency-Key: a repeat returns the first answer and writes nothing; a different body
is 422; concurrent repeats write once; a refused request may be retried afresh."""

from __future__ import annotations

import asyncio
import random
import uuid

import httpx

from instantml.server.process import ServerProcess
from tests.helpers import rank_body, stored_rank_points, stored_scalars


def _key() -> dict[str, str]:
    return {"Idempotency-Key": uuid.uuid4().hex}


def test_repeat_returns_the_first_answer_and_stores_once(api: httpx.Client, run_id: str) -> None:
    headers = _key()
    path = f"/runs/{run_id}/rank-metrics"
    first = api.post(path, json=rank_body(metrics={"k": 1.0}), headers=headers)
    again = api.post(path, json=rank_body(metrics={"k": 1.0}), headers=headers)
    assert (
        (first.status_code, first.json())
        == (again.status_code, again.json())
        == (200, {"accepted": 1})
    )
    assert again.headers.get("idempotent-replayed") == "true"
    assert len(stored_rank_points(api, run_id, "k")) == 1


def test_replay_does_not_undo_a_later_write(api: httpx.Client, run_id: str) -> None:
    path = f"/runs/{run_id}/rank-metrics"
    headers = _key()
    api.post(path, json=rank_body(metrics={"k": 1.0}), headers=headers)
    api.post(path, json=rank_body(metrics={"k": 2.0}))  # a newer value for the same point
    api.post(path, json=rank_body(metrics={"k": 1.0}), headers=headers)  # stale retry: a no-op
    assert [p[2] for p in stored_rank_points(api, run_id, "k")] == [2.0]


def test_same_key_different_body_is_422(api: httpx.Client, run_id: str) -> None:
    headers = _key()
    path = f"/runs/{run_id}/rank-metrics"
    assert api.post(path, json=rank_body(metrics={"k": 1.0}), headers=headers).status_code == 200
    response = api.post(path, json=rank_body(metrics={"k": 5.0}, rank=4), headers=headers)
    assert response.status_code == 422 and "Idempotency-Key" in response.json()["error"]
    assert [(p[1], p[2]) for p in stored_rank_points(api, run_id, "k")] == [(0, 1.0)]


def test_refused_requests_are_not_remembered(api: httpx.Client, run_id: str) -> None:
    headers = _key()
    path = f"/runs/{run_id}/rank-metrics"
    assert api.post(path, json=rank_body(weight=0), headers=headers).status_code == 422
    assert api.post(path, json=rank_body(), headers=headers).status_code == 200


def test_create_run_replay_answers_201_again(api: httpx.Client) -> None:
    headers = _key()
    body = {"project": "tests", "id": f"idem-{uuid.uuid4().hex[:8]}"}
    first = api.post("/runs", json=body, headers=headers)
    again = api.post("/runs", json=body, headers=headers)
    assert first.status_code == again.status_code == 201
    assert first.json() == again.json()


def test_ingest_event_ids_are_idempotency_keys(api: httpx.Client, run_id: str) -> None:
    path = f"/runs/{run_id}/rank-metrics"
    events = [
        {
            "event_id": f"e-{run_id}-{r}",
            "request": {
                "method": "POST",
                "path": path,
                "body": rank_body(metrics={"k": float(r)}, rank=r),
            },
        }
        for r in range(4)
    ]
    first = api.post("/api/ingest", json={"events": events}).json()
    # A retry of the same batch, the same event twice within it, and a single-route replay.
    again = api.post("/api/ingest", json={"events": events + events[:1]}).json()
    assert all("replayed" not in r for r in first["results"])
    assert again["results"][:4] == [{**r, "replayed": True} for r in first["results"]]
    assert again["results"][4] == {**first["results"][0], "replayed": True}
    single = api.post(
        path,
        json=events[0]["request"]["body"],  # type: ignore[index]
        headers={"Idempotency-Key": events[0]["event_id"]},
    )  # type: ignore[dict-item]
    assert single.json() == {"accepted": 1}
    assert len(stored_rank_points(api, run_id, "k")) == 4


def test_concurrent_repeats_write_once(
    server: ServerProcess, api: httpx.Client, run_id: str
) -> None:
    key = uuid.uuid4().hex
    path = f"/runs/{run_id}/metrics"

    async def hammer() -> list[httpx.Response]:
        headers = {"Authorization": f"Bearer {server.admin_key}", "Idempotency-Key": key}
        async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=30) as client:
            return await asyncio.gather(
                *[client.post(path, json={"metrics": {"c": 1.0}, "step": 1}) for _ in range(32)]
            )

    responses = asyncio.run(hammer())
    statuses = [r.status_code for r in responses]
    assert set(statuses) <= {200, 409}, statuses
    assert statuses.count(200) >= 1
    assert all(r.json() == {"accepted": 1} for r in responses if r.status_code == 200)
    assert all("Idempotency-Key" in r.json()["error"] for r in responses if r.status_code == 409)
    assert stored_scalars(api, run_id, "c")["points"] == [[1, 1.0]]


def test_writers_keys_are_the_same_keys_on_every_route(api: httpx.Client, run_id: str) -> None:
    """Event ids ``<prefix>-<n>`` (what the SDK and the spool send; the embedded store keeps
    them as ranges of n): replayed whichever route sent them first, in whatever order the
    batches came, and ``<prefix>-05`` or an unsent n is a new key."""
    path = f"/runs/{run_id}/rank-metrics"
    writers = [uuid.uuid4().hex for _ in range(8)]

    def event(rank: int, n: int, key: str | None = None) -> dict[str, object]:
        body = rank_body(metrics={"k": float(n)}, rank=rank, step=n)
        return {"event_id": key or f"{writers[rank]}-{n}",
                "request": {"method": "POST", "path": path, "body": body}}  # fmt: skip

    sent = [event(rank, n) for n in range(1, 31) for rank in range(8)]
    random.Random(4).shuffle(sent)
    for batch in (sent[:100], sent[100:200], sent[200:]):
        results = api.post("/api/ingest", json={"events": batch}).json()["results"]
        assert [r["status"] for r in results] == [200] * len(batch)
        assert not any(r.get("replayed") for r in results)
    late = [event(0, 31), event(1, 5, f"{writers[1]}-05"), event(9 % 8, 40)]
    again = api.post("/api/ingest", json={"events": sent[::7] + late}).json()["results"]
    assert [bool(r.get("replayed")) for r in again] == [True] * len(sent[::7]) + [False] * 3
    # The single route, with the batch's key: a replay; then a key sent first alone.
    first = sent[0]
    single = api.post(path, json=first["request"]["body"],  # type: ignore[index]
                      headers={"Idempotency-Key": first["event_id"]})  # type: ignore[dict-item]  # fmt: skip
    assert single.status_code == 200 and single.headers.get("idempotent-replayed") == "true"
    alone = event(2, 50)
    answer = api.post(path, json=alone["request"]["body"],  # type: ignore[index]
                      headers={"Idempotency-Key": alone["event_id"]})  # type: ignore[dict-item]  # fmt: skip
    assert answer.status_code == 200 and answer.headers.get("idempotent-replayed") is None
    results = api.post("/api/ingest", json={"events": [alone, event(2, 51)]}).json()["results"]
    assert [bool(r.get("replayed")) for r in results] == [True, False]
    # (The "-05" event rewrote its point: the same step and rank as "-5".)
    assert len(stored_rank_points(api, run_id, "k")) == 8 * 30 + 2 + 2
