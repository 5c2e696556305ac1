"""Every route but health requires a valid key."""

from __future__ import annotations

import httpx
import pytest

from instantml.server.process import ServerProcess

ROUTES = [
    ("POST", "/runs"),
    ("GET", "/runs/x"),
    ("PATCH", "/runs/x"),
    ("POST", "/runs/x/metrics"),
    ("POST", "/runs/x/rank-metrics"),
    ("POST", "/api/ingest"),
    ("GET", "/api/runs"),
    ("GET", "/api/runs/x/keys"),
]


@pytest.mark.parametrize(("method", "path"), ROUTES)
@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer iml_000000000000_wrong"},
        {"Authorization": "Bearer garbage"},
        {"Authorization": "Basic dXNlcjpwYXNz"},
    ],
    ids=["none", "wrong-secret", "malformed", "basic"],
)
def test_missing_or_bad_key_is_401(
    server: ServerProcess, method: str, path: str, headers: dict[str, str]
) -> None:
    response = httpx.request(method, server.url + path, headers=headers, json={})
    assert response.status_code == 401
    assert "API key" in response.json()["error"]


def test_right_id_wrong_secret_is_401(server: ServerProcess) -> None:
    key_id = server.admin_key.split("_")[1]
    response = httpx.get(
        f"{server.url}/api/runs", headers={"Authorization": f"Bearer iml_{key_id}_nope"}
    )
    assert response.status_code == 401


def test_health_and_schema_need_no_key(server: ServerProcess) -> None:
    assert httpx.get(f"{server.url}/healthz").status_code == 200
    schema = httpx.get(f"{server.url}/openapi.json").json()
    assert "/runs/{run_id}/rank-metrics" in schema["paths"]


def test_unknown_route_answers_json(api: httpx.Client) -> None:
    response = api.get("/no/such/route")
    assert response.status_code == 404 and "error" in response.json()
