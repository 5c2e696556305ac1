"""Runs: create, attach by id, read, status, list; answer shapes as docs/reference.md gives them."""

from __future__ import annotations

import subprocess
import sys
import uuid

import httpx

from instantml.server.process import ServerProcess

RUN_FIELDS = {"id", "project", "name", "status", "config", "tags", "metadata", "created_at"}


def test_create_then_attach_then_conflict(api: httpx.Client) -> None:
    rid = f"job-{uuid.uuid4().hex[:8]}"
    body = {"project": "p1", "name": "first", "id": rid, "config": {"lr": 0.1}, "tags": ["a"]}
    created = api.post("/runs", json=body)
    assert created.status_code == 201
    run = created.json()["run"]
    assert run.keys() >= RUN_FIELDS
    assert (run["id"], run["project"], run["status"], run["config"]) == (
        rid,
        "p1",
        "running",
        {"lr": 0.1},
    )

    attached = api.post("/runs", json={"project": "p1", "id": rid})
    assert attached.status_code == 200
    assert attached.json()["run"]["name"] == "first"  # attaching keeps the run as created

    elsewhere = api.post("/runs", json={"project": "p2", "id": rid})
    assert elsewhere.status_code == 409
    assert "id" in elsewhere.json()["error"]


def test_create_without_id_gets_a_fresh_one(api: httpx.Client) -> None:
    a = api.post("/runs", json={"project": "p"}).json()["run"]["id"]
    b = api.post("/runs", json={"project": "p"}).json()["run"]["id"]
    assert a != b


def test_get_patch_and_list(api: httpx.Client, run_id: str) -> None:
    assert api.get(f"/runs/{run_id}").json()["run"]["status"] == "running"
    patched = api.patch(f"/runs/{run_id}", json={"status": "finished"})
    assert patched.status_code == 200
    assert patched.json()["run"]["status"] == "finished"
    assert api.get(f"/runs/{run_id}").json()["run"]["status"] == "finished"
    listed = api.get("/api/runs", params={"project": "tests"}).json()["runs"]
    assert run_id in [r["id"] for r in listed]
    assert listed == sorted(listed, key=lambda r: r["created_at"], reverse=True)


def test_unknown_run_is_404(api: httpx.Client) -> None:
    assert api.get("/runs/nope-404").status_code == 404
    response = api.patch("/runs/nope-404", json={"status": "finished"})
    assert response.status_code == 404 and "error" in response.json()


def test_bad_status_and_bad_id(api: httpx.Client, run_id: str) -> None:
    response = api.patch(f"/runs/{run_id}", json={"status": "done"})
    assert response.status_code == 422 and "status" in response.json()["error"]
    response = api.post("/runs", json={"project": "p", "id": "has space"})
    assert response.status_code == 422 and "id" in response.json()["error"]


ATTACH_SCRIPT = """
import sys, instantml as im
run = im.init(project="multi", upload_mode="sync", api_key=sys.argv[1], base_url=sys.argv[2])
run.log_rank_metrics({"x": 1.0}, step=0)
run.finish()
print(run.run_id)
"""


def test_ranks_in_several_processes_share_one_run(server: ServerProcess, api: httpx.Client) -> None:
    job = uuid.uuid4().hex[:10]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", ATTACH_SCRIPT, server.admin_key, server.url],
            env={
                "PATH": "/usr/bin:/bin",
                "HOME": "/nonexistent",
                "TORCHELASTIC_RUN_ID": job,
                "RANK": str(rank),
                "WORLD_SIZE": "6",
                "LOCAL_RANK": str(rank % 2),
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(6)
    ]
    outputs = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    ids = {out.strip() for out, _ in outputs}
    assert len(ids) == 1
    (rid,) = ids
    assert job in rid
    points = api.get(f"/api/runs/{rid}/rank-points", params={"metric": "x"}).json()["points"]
    assert sorted(p[1] for p in points) == list(range(6))
    assert len(api.get("/api/runs", params={"project": "multi"}).json()["runs"]) >= 1
