"""``POST /api/ingest`` takes plain rank events in columns (server/write/rank_batch.py) and
everything else through the general path; either way each event is answered and stored
exactly as the same request sent alone to its own route.

Randomized events, most of them plain, the rest bent in one way each (an int value, a
float step, a string timestamp, a rank outside world_size, a long metric name, a missing
field, an extra field...), are sent in one batch to one run and one by one, with the
event id as Idempotency-Key, to a twin run; answers and stored points must match. Then
the batch is sent again, and each event alone again: every answer is a replay, in both
directions, so the fingerprints of the two paths agree too."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

BENDS: dict[str, Any] = {
    "plain": None,
    "int value": ("metrics", {"loss": 3}),
    "float step": ("step", 5.0),
    "string timestamp": ("timestamp", "2026-11-29T12:00:00Z"),
    "rank outside": ("rank", 8),
    "local rank outside": ("local_rank", 9),
    "negative step": ("step", -1),
    "bool rank": ("rank", True),
    "zero weight": ("weight", 0.0),
    "int weight": ("weight", 3),
    "long name": ("metrics", {"x" * 129: 1.0}),
    "empty metrics": ("metrics", {}),
    "missing world size": ("world_size", ...),
    "extra field": ("note", "hello"),
    "null local rank": ("local_rank", None),
    "huge step": ("step", 2**63),
    "world size 513": ("world_size", 513),
    # The batch decoder leaves the NUL rule to one check per distinct name (wire.RankFields).
    "NUL in a name": ("metrics", {"lo\x00ss": 1.0}),
    "NUL in a node": ("node", "host\x00a"),
    "node": ("node", "host-a"),
}


@st.composite
def batches(draw: st.DrawFn) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for i in range(draw(st.integers(1, 25))):
        body: dict[str, Any] = {
            "metrics": {"loss": draw(st.floats(-1e6, 1e6)), "gn": 2.5},
            "step": draw(st.integers(0, 4)),
            "rank": draw(st.integers(0, 7)),
            "world_size": 8,
            "local_rank": draw(st.integers(0, 7)),
            "weight": draw(st.sampled_from([1.0, 64.0])),
            "timestamp": 1_800_000_000.5,
        }
        bend = BENDS[draw(st.sampled_from(["plain"] * 12 + list(BENDS)))]
        if bend is not None:
            field, value = bend
            if value is ...:
                del body[field]
            else:
                body[field] = value
        events.append((f"e{i}", body))
    return events


def _new_run(api: httpx.Client) -> str:
    run_id = f"fast-{uuid.uuid4().hex[:12]}"
    assert api.post("/runs", json={"project": "tests", "id": run_id}).status_code == 201
    return run_id


def _points(api: httpx.Client, run_id: str) -> dict[str, Any]:
    keys = [k["key"] for k in api.get(f"/api/runs/{run_id}/keys").json()["keys"]]
    return {
        k: api.get(f"/api/runs/{run_id}/rank-points", params={"metric": k}).json()["points"]
        for k in keys
    }


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(events=batches())
def test_batch_events_are_answered_and_stored_as_if_sent_alone(
    api: httpx.Client, events: list[tuple[str, dict[str, Any]]]
) -> None:
    runs = [_new_run(api), _new_run(api)]
    prefix = uuid.uuid4().hex

    def batch(run: str, keys: str) -> list[tuple[int, Any, bool]]:
        response = api.post(
            "/api/ingest",
            json={
                "events": [
                    {
                        "event_id": f"{keys}-{event_id}",
                        "request": {
                            "method": "POST",
                            "path": f"/runs/{run}/rank-metrics",
                            "body": body,
                        },
                    }
                    for event_id, body in events
                ]
            },
        )
        assert response.status_code == 200
        return [
            (r["status"], r["body"], r.get("replayed", False)) for r in response.json()["results"]
        ]

    def alone(run: str, keys: str) -> list[tuple[int, Any, bool]]:
        answers = []
        for event_id, body in events:
            response = api.post(
                f"/runs/{run}/rank-metrics",
                json=body,
                headers={"Idempotency-Key": f"{keys}-{event_id}"},
            )
            replayed = response.headers.get("idempotent-replayed") == "true"
            answers.append((response.status_code, response.json(), replayed))
        return answers

    def same(a: list[tuple[int, Any, bool]], b: list[tuple[int, Any, bool]]) -> None:
        for (status_a, body_a, replay_a), (status_b, body_b, replay_b) in zip(a, b, strict=True):
            assert (status_a, replay_a) == (status_b, replay_b), (body_a, body_b)
            if status_a < 300:
                assert body_a == body_b
            else:  # the run id in a message differs; what it says must not
                assert body_a["error"].replace(runs[0], "R") == body_b["error"].replace(
                    runs[1], "R"
                )

    def replays_of(again: list[tuple[int, Any, bool]], first: list[tuple[int, Any, bool]]) -> None:
        for (status, body, replayed), (status0, body0, _) in zip(again, first, strict=True):
            assert (status, body) == (status0, body0)
            assert replayed == (status0 < 300)  # only applied writes are remembered

    # Run 0 in one batch (keys a-*), run 1 event by event (keys b-*): the same answers and
    # the same stored points.
    first_batch, first_alone = batch(runs[0], f"{prefix}a"), alone(runs[1], f"{prefix}b")
    same(first_batch, first_alone)
    assert _points(api, runs[0]) == _points(api, runs[1])
    # Each path replays what the other applied: the two fingerprint a request alike.
    replays_of(alone(runs[0], f"{prefix}a"), first_batch)
    replays_of(batch(runs[1], f"{prefix}b"), first_alone)
    assert _points(api, runs[0]) == _points(api, runs[1])
