"""Every request the public 0.1.1 SDK can send gets an answer a user understands: served,
or 501 naming the feature (docs/sdk-requests.md), on its own route and through
/api/ingest alike. Console lines are served: stored, replayed once, shown in order."""

from __future__ import annotations

import re
import uuid
from typing import Any

import httpx
import pytest

from instantml.server.unsupported import UNSUPPORTED


def _path(template: str, run_id: str) -> str:
    return re.sub(r"\{[^}]+\}", lambda m: run_id if m.group() == "{run_id}" else "x1", template)


CASES = [
    (method, template, feature) for methods, template, feature in UNSUPPORTED for method in methods
]


@pytest.mark.parametrize(
    ("method", "template", "feature"), CASES, ids=[f"{m} {t}" for m, t, _ in CASES]
)
def test_an_unsupported_request_is_a_501_naming_its_feature(
    api: httpx.Client, run_id: str, method: str, template: str, feature: str
) -> None:
    path = _path(template, run_id)
    response = api.request(method, path, json={} if method in ("POST", "PUT") else None)
    assert response.status_code == 501, response.text
    assert response.json() == {"error": f"{feature} is not supported by this server"}
    if method != "POST":
        return
    event = {"event_id": uuid.uuid4().hex, "request": {"method": method, "path": path, "body": {}}}
    answer = api.post("/api/ingest", json={"events": [event]}).json()
    assert answer["results"][0]["status"] == 501
    assert answer["results"][0]["body"] == {"error": f"{feature} is not supported by this server"}


def _lines(*messages: str, start: int = 0) -> list[dict[str, Any]]:
    return [
        {"line_number": start + i, "message": m, "timestamp": None} for i, m in enumerate(messages)
    ]


def test_console_lines_are_stored_and_replayed_once(api: httpx.Client, run_id: str) -> None:
    path = f"/api/runs/{run_id}/logs"
    first = {"stream": "stdout", "lines": _lines("step 0", "step 1")}
    headers = {"Idempotency-Key": f"logs-{run_id}"}
    assert api.post(path, json=first, headers=headers).json() == {"accepted": 2}
    replay = api.post(path, json=first, headers=headers)
    assert replay.headers.get("Idempotent-Replayed") == "true"
    event = {"event_id": f"e-{run_id}", "request": {"method": "POST", "path": path,
             "body": {"stream": "stderr", "lines": _lines("warning: rank 3 slow")}}}  # fmt: skip
    assert api.post("/api/ingest", json={"events": [event]}).json()["results"][0]["status"] == 200
    # A line sent again without a key (a retry) keeps its place and its latest text.
    api.post(path, json={"stream": "stdout", "lines": _lines("step 1 (again)", start=1)})
    got = api.get(path).json()
    assert got["total"] == 3
    assert [(x["stream"], x["line_number"], x["message"]) for x in got["lines"]] == [
        ("stdout", 0, "step 0"),
        ("stdout", 1, "step 1 (again)"),
        ("stderr", 0, "warning: rank 3 slow"),
    ]
    assert (
        api.get(path, params={"limit": 1}).json()["lines"][0]["message"] == "warning: rank 3 slow"
    )


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"stream": "stdin", "lines": _lines("x")}, "stream"),
        ({"stream": "stdout", "lines": []}, "lines"),
        ({"stream": "stdout", "lines": [{"line_number": -1, "message": "x"}]}, "line_number"),
        ({"stream": "stdout", "lines": [{"line_number": 1.5, "message": "x"}]}, "line_number"),
        ({"stream": "stdout", "lines": [{"line_number": 0, "message": 7}]}, "message"),
        ({"stream": "stdout", "lines": [{"line_number": 0, "message": "x" * 70_000}]}, "message"),
        (
            {"stream": "stdout", "lines": [{"line_number": 0, "message": "x", "timestamp": 5}]},
            "timestamp",
        ),
        ({"stream": "stdout", "lines": _lines(*["x"] * 10_001)}, "lines"),
    ],
)
def test_bad_console_lines_name_the_field_and_store_nothing(
    api: httpx.Client, run_id: str, body: dict[str, Any], field: str
) -> None:
    response = api.post(f"/api/runs/{run_id}/logs", json=body)
    assert response.status_code == 422 and field in response.json()["error"], response.text
    assert api.get(f"/api/runs/{run_id}/logs").json() == {"total": 0, "lines": []}


def test_console_lines_of_an_unknown_run_are_404(api: httpx.Client) -> None:
    assert api.get("/api/runs/no-such-run/logs").status_code == 404
    response = api.post(
        "/api/runs/no-such-run/logs", json={"stream": "stdout", "lines": _lines("x")}
    )
    assert response.status_code == 404
