"""Orgs, keys and scopes: isolation on every route, revocation, and the CLI on top."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from instantml.server.process import ServerProcess
from tests.helpers import instantml, rank_body


def cli(
    server: ServerProcess, *args: str, key: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {"INSTANTML_API_BASE_URL": server.url, "INSTANTML_API_KEY": key or server.admin_key}
    return instantml(*args, env=env)


def new_key(server: ServerProcess, org: str, *scopes: str) -> str:
    out = cli(server, "keys", "create", "--org", org, *(["--scopes", *scopes] if scopes else []))
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]  # the key alone on the last line


def client(server: ServerProcess, key: str) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def _fill(path: str, run_id: str) -> str:
    return path.replace("{run_id}", run_id).replace("{key_id}", "nokey")


BODIES: dict[str, dict[str, Any]] = {
    "/runs/{run_id}": {"status": "finished"},
    "/runs/{run_id}/metrics": {"metrics": {"a": 1.0}, "step": 0},
    "/runs/{run_id}/rank-metrics": rank_body(),
    "/api/runs/{run_id}/attributes": {"attributes": [{"path": "x", "value": 1}]},
    "/api/runs/{run_id}/logs": {"stream": "stdout", "lines": [{"line_number": 0, "message": "x"}]},
}


def test_another_orgs_key_gets_404_on_every_route_naming_a_run(server: ServerProcess) -> None:
    org_a, org_b = f"a-{uuid.uuid4().hex[:6]}", f"b-{uuid.uuid4().hex[:6]}"
    key_a, key_b = (
        new_key(server, org_a, "admin", "ingest", "read"),
        new_key(server, org_b, "admin", "ingest", "read"),
    )
    run_id = f"secret-{uuid.uuid4().hex[:6]}"
    with client(server, key_a) as a, client(server, key_b) as b:
        assert a.post("/runs", json={"project": "p", "id": run_id}).status_code == 201
        assert a.post(f"/runs/{run_id}/rank-metrics", json=rank_body()).status_code == 200
        schema = httpx.get(f"{server.url}/openapi.json").json()
        checked = 0
        for path, methods in schema["paths"].items():
            if "{run_id}" not in path:
                continue
            for method in methods:
                params = {"metric": "train/loss"} if method == "get" else None
                response = b.request(
                    method.upper(), _fill(path, run_id), json=BODIES.get(path, {}), params=params
                )
                assert response.status_code == 404, (method, path, response.text)
                assert run_id not in response.text or "not found" in response.text
                checked += 1
        assert checked >= 9
        # The same run id is free in org B: ids are per org, and nothing leaks through a 409.
        assert b.post("/runs", json={"project": "other", "id": run_id}).status_code == 201
        assert a.get(f"/runs/{run_id}").json()["run"]["project"] == "p"
        # Batch events are isolated too.
        events = [
            {
                "event_id": "x",
                "request": {
                    "method": "POST",
                    "path": f"/runs/{run_id}/metrics",
                    "body": {"metrics": {"a": 1}, "step": 0},
                },
            }
        ]
        assert a.post("/api/ingest", json={"events": events}).json()["results"][0]["status"] == 200
        # Another org's keys and usage are not visible.
        assert b.get("/api/keys", params={"org": org_a}).status_code == 404
        assert b.get("/api/usage", params={"org": org_a}).status_code == 404


def test_scopes(server: ServerProcess, run_id: str) -> None:
    org = f"s-{uuid.uuid4().hex[:6]}"
    read_key, ingest_key = new_key(server, org, "read"), new_key(server, org, "ingest")
    with client(server, read_key) as reader, client(server, ingest_key) as writer:
        assert writer.post("/runs", json={"project": "p", "id": "scoped"}).status_code == 201
        assert reader.get("/runs/scoped").status_code == 200
        for response in (
            reader.post("/runs", json={"project": "p"}),
            reader.post("/runs/scoped/rank-metrics", json=rank_body()),
            reader.post("/api/ingest", json={"events": []}),
            reader.patch("/runs/scoped", json={"status": "failed"}),
        ):
            assert response.status_code == 403 and "ingest" in response.json()["error"]
        assert writer.get("/runs/scoped").status_code == 403
        minted = writer.post("/api/keys", json={"scopes": ["read"]})
        assert minted.status_code == 403 and "admin" in minted.json()["error"]
    assert cli(server, "keys", "create", "--org", org, key=ingest_key).returncode == 1


def test_org_admin_manages_its_own_org_only(server: ServerProcess) -> None:
    org = f"o-{uuid.uuid4().hex[:6]}"
    admin = new_key(server, org, "admin", "read")
    listed = cli(server, "keys", "list", key=admin)
    assert listed.returncode == 0 and org in listed.stdout and "default" not in listed.stdout
    assert cli(server, "keys", "create", "--org", "someone-else", key=admin).returncode == 1
    with client(server, admin) as c:
        assert c.put("/api/usage/limit", json={"limit": 10**9}).status_code == 403


def test_revocation_takes_effect_on_the_next_request(server: ServerProcess) -> None:
    org = f"r-{uuid.uuid4().hex[:6]}"
    key = new_key(server, org, "read")
    key_id = key.split("_")[1]
    with client(server, key) as c:
        assert c.get("/api/runs").status_code == 200  # verified and cached
        out = cli(server, "keys", "revoke", key_id)
        assert out.returncode == 0, out.stderr
        assert c.get("/api/runs").status_code == 401
    listed = cli(server, "keys", "list", "--org", org)
    assert key_id in listed.stdout and "revoked" in listed.stdout


def test_keys_are_stored_hashed(start_server: Callable[..., ServerProcess]) -> None:
    server = start_server()
    key = new_key(server, "hashed")
    server.stop()
    # Nowhere on disk (any table, the WAL): only the server's own admin-key file has one.
    secret = key.split("_", 2)[2].encode()
    files = [p for p in server.data_dir.rglob("*") if p.is_file() and p.name != "admin-key"]
    assert files and all(secret not in p.read_bytes() for p in files)


@pytest.mark.parametrize(
    "bad", [{"scopes": []}, {"scopes": ["root"]}, {"org": ""}, {"scopes": "read"}]
)
def test_bad_key_requests(api: httpx.Client, bad: dict[str, Any]) -> None:
    response = api.post("/api/keys", json=bad)
    assert response.status_code == 422 and next(iter(bad)) in response.json()["error"]
