"""The bad-input matrix: each bad body answers 4xx with {"error"} naming the field, on the
single routes and as an event of /api/ingest, and nothing of it is stored."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import rank_body, stored_keys

NAN, INF = float("nan"), float("inf")


def _without(field: str) -> dict[str, Any]:
    body = rank_body()
    del body[field]
    return body


RANK_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("nan value", rank_body(metrics={"train/loss": NAN}), "metrics"),
    ("infinity value", rank_body(metrics={"train/loss": INF}), "metrics"),
    ("-infinity value", rank_body(metrics={"train/loss": -INF}), "metrics"),
    ("bool value", rank_body(metrics={"train/loss": True}), "metrics"),
    ("string value", rank_body(metrics={"train/loss": "0.5"}), "metrics"),
    ("null value", rank_body(metrics={"train/loss": None}), "metrics"),
    ("empty metrics", rank_body(metrics={}), "metrics"),
    ("metrics a list", rank_body(metrics=[1.0]), "metrics"),
    ("empty key", rank_body(metrics={"": 1.0}), "metrics"),
    ("513-byte key", rank_body(metrics={"k" * 513: 1.0}), "metrics"),
    ("513-byte multibyte key", rank_body(metrics={"é" * 256 + "k": 1.0}), "metrics"),
    ("NUL in a key", rank_body(metrics={"train\x00loss": 1.0}), "metrics"),
    ("NUL in a node", rank_body(node="host\x00a"), "node"),
    ("world_size 0", rank_body(world_size=0, rank=0, local_rank=None), "world_size"),
    ("world_size 513", rank_body(world_size=513), "world_size"),
    ("rank = world_size", rank_body(rank=8), "rank"),
    ("negative rank", rank_body(rank=-1), "rank"),
    ("negative step", rank_body(step=-1), "step"),
    ("fractional step", rank_body(step=1.5), "step"),
    ("nan step", rank_body(step=NAN), "step"),
    ("string step", rank_body(step="1"), "step"),
    ("local_rank = world_size", rank_body(local_rank=8), "local_rank"),
    ("negative local_rank", rank_body(local_rank=-1), "local_rank"),
    ("weight 0", rank_body(weight=0), "weight"),
    ("negative weight", rank_body(weight=-2.0), "weight"),
    ("bool weight", rank_body(weight=True), "weight"),
    ("nan weight", rank_body(weight=NAN), "weight"),
    ("string rank", rank_body(rank="0"), "rank"),
    ("float rank", rank_body(rank=0.0), "rank"),
    ("bool world_size", rank_body(world_size=True), "world_size"),
    ("float world_size", rank_body(world_size=8.0), "world_size"),
    ("missing metrics", _without("metrics"), "metrics"),
    ("missing step", _without("step"), "step"),
    ("missing rank", _without("rank"), "rank"),
    ("missing world_size", _without("world_size"), "world_size"),
    ("bad timestamp", rank_body(timestamp="yesterday"), "timestamp"),
]

SCALAR_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("nan value", {"metrics": {"a": NAN}, "step": 1}, "metrics"),
    ("infinity value", {"metrics": {"a": INF}, "step": 1}, "metrics"),
    ("bool value", {"metrics": {"a": False}, "step": 1}, "metrics"),
    ("string value", {"metrics": {"a": "x"}, "step": 1}, "metrics"),
    ("empty metrics", {"metrics": {}, "step": 1}, "metrics"),
    ("empty key", {"metrics": {"": 1}, "step": 1}, "metrics"),
    ("513-byte key", {"metrics": {"k" * 513: 1}, "step": 1}, "metrics"),
    ("negative step", {"metrics": {"a": 1}, "step": -3}, "step"),
    ("negative fractional step", {"metrics": {"a": 1}, "step": -0.5}, "step"),
    ("nan step", {"metrics": {"a": 1}, "step": NAN}, "step"),
    ("string step", {"metrics": {"a": 1}, "step": "2.5"}, "step"),
    ("step beyond 2**53", {"metrics": {"a": 1}, "step": 2**53}, "step"),
    ("bool step", {"metrics": {"a": 1}, "step": True}, "step"),
    ("missing step", {"metrics": {"a": 1}}, "step"),
    ("missing metrics", {"step": 1}, "metrics"),
]


def _post_raw(api: httpx.Client, path: str, body: Any) -> httpx.Response:
    # json.dumps writes NaN and Infinity as the bare tokens a careless client would send.
    return api.post(path, content=json.dumps(body), headers={"Content-Type": "application/json"})


def _assert_refused(response: httpx.Response, field: str) -> None:
    assert 400 <= response.status_code < 500, response.text
    error = response.json()["error"]
    assert field in error, error


@pytest.mark.parametrize(("case", "body", "field"), RANK_CASES, ids=[c[0] for c in RANK_CASES])
def test_rank_metrics_refuses(
    api: httpx.Client, run_id: str, case: str, body: Any, field: str
) -> None:
    _assert_refused(_post_raw(api, f"/runs/{run_id}/rank-metrics", body), field)
    assert stored_keys(api, run_id) == []


@pytest.mark.parametrize(("case", "body", "field"), SCALAR_CASES, ids=[c[0] for c in SCALAR_CASES])
def test_metrics_refuses(api: httpx.Client, run_id: str, case: str, body: Any, field: str) -> None:
    _assert_refused(_post_raw(api, f"/runs/{run_id}/metrics", body), field)
    assert stored_keys(api, run_id) == []


def test_ingest_answers_each_bad_event_and_keeps_the_good_ones(
    api: httpx.Client, run_id: str
) -> None:
    path = f"/runs/{run_id}/rank-metrics"
    events = [
        {"event_id": f"bad-{i}", "request": {"method": "POST", "path": path, "body": body}}
        for i, (_, body, _) in enumerate(RANK_CASES)
    ]
    events += [
        {
            "event_id": f"bad-s{i}",
            "request": {"method": "POST", "path": f"/runs/{run_id}/metrics", "body": body},
        }
        for i, (_, body, _) in enumerate(SCALAR_CASES)
    ]
    good = {
        "event_id": "good",
        "request": {"method": "POST", "path": path, "body": rank_body(metrics={"ok": 1.0})},
    }
    response = _post_raw(api, "/api/ingest", {"events": [*events, good]})
    assert response.status_code == 200
    results = response.json()["results"]
    assert len(results) == len(events) + 1
    expected_fields = [f for _, _, f in RANK_CASES] + [f for _, _, f in SCALAR_CASES]
    for result, field, event in zip(results, expected_fields, events, strict=False):
        assert result["event_id"] == event["event_id"]
        assert 400 <= result["status"] < 500, result
        assert field in result["body"]["error"], result
    assert results[-1] == {"event_id": "good", "status": 200, "body": {"accepted": 1}}
    assert [k["key"] for k in stored_keys(api, run_id)] == ["ok"]


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        (b'{"metrics": {"a": 1}, "step": ', 400, "JSON"),
        (b"[1, 2]", 400, "object"),
        (b"", 400, "JSON"),
        (b'"text"', 400, "object"),
    ],
)
def test_malformed_bodies(
    api: httpx.Client, run_id: str, body: bytes, status: int, needle: str
) -> None:
    for path in (f"/runs/{run_id}/rank-metrics", f"/runs/{run_id}/metrics", "/api/ingest", "/runs"):
        response = api.post(path, content=body, headers={"Content-Type": "application/json"})
        assert response.status_code == status, (path, response.text)
        assert needle in response.json()["error"]
    assert stored_keys(api, run_id) == []


@pytest.mark.parametrize(
    ("batch", "needle"),
    [
        ({"events": "nope"}, "events"),
        ({}, "events"),
        ({"events": [{"request": {}}]}, "event_id"),
        (
            {
                "events": [
                    {"event_id": "x", "request": {"method": "POST", "path": "/runs/x/metrics"}}
                ]
            },
            "body",
        ),
        (
            {
                "events": [
                    {"event_id": "x", "request": {"method": "GET", "path": "/runs", "body": {}}}
                ]
            },
            "method",
        ),
        (
            {
                "events": [
                    {"event_id": "x", "request": {"method": "POST", "path": "/nowhere", "body": {}}}
                ]
            },
            "path",
        ),
    ],
)
def test_malformed_batches(api: httpx.Client, batch: dict[str, Any], needle: str) -> None:
    response = api.post("/api/ingest", json=batch)
    if response.status_code == 200:
        (result,) = response.json()["results"]
        assert 400 <= result["status"] < 500 and needle in result["body"]["error"], result
    else:
        assert response.status_code == 422 and needle in response.json()["error"]


def test_oversized_body_is_413_and_stores_nothing(start_server: Any, tmp_path: Path) -> None:
    server = start_server(env={"INSTANTML_MAX_BODY_BYTES": "4096"})
    headers = {"Authorization": f"Bearer {server.admin_key}"}
    with httpx.Client(base_url=server.url, headers=headers) as api:
        assert api.post("/runs", json={"project": "p", "id": "big"}).status_code == 201
        big = rank_body(metrics={f"k{i}": float(i) for i in range(400)})
        response = api.post("/runs/big/rank-metrics", json=big)
        assert response.status_code == 413 and "limit" in response.json()["error"]
        events = [
            {
                "event_id": "e",
                "request": {"method": "POST", "path": "/runs/big/rank-metrics", "body": big},
            }
        ]
        assert api.post("/api/ingest", json={"events": events}).status_code == 413
        assert stored_keys(api, "big") == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"project": "p\x00q"}, "project"),
        ({"project": "p", "name": "n\x00"}, "name"),
        ({"project": "p", "tags": ["ok", "t\x00"]}, "tags"),
    ],
)
def test_names_with_nul_are_refused(api: httpx.Client, body: dict[str, Any], field: str) -> None:
    # No database that keeps text takes a NUL character, and no name needs one.
    response = api.post("/runs", json=body)
    assert response.status_code == 422 and field in response.json()["error"], response.text
    assert api.get("/runs/a%00b").status_code == 404
