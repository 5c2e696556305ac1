"""Deleting runs over HTTP and from the CLI: gone from every route, usage unchanged, the id
free again, a delete while the run is written, another org's run, retention in the
background, and each run's points in the runs list."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from instantml.server.process import ServerProcess
from tests.conftest import STORES
from tests.helpers import admin_client, instantml, rank_body
from tests.server.test_tenancy import new_key


def _log(api: httpx.Client, run_id: str, steps: int, ranks: int = 4) -> None:
    events = [
        {"event_id": f"{run_id}-{s}-{r}",
         "request": {"method": "POST", "path": f"/runs/{run_id}/rank-metrics",
                     "body": rank_body(step=s, rank=r, world_size=ranks,
                                       metrics={"loss": s + r / 10, "grad": 1.0})}}
        for s in range(steps) for r in range(ranks)
    ]  # fmt: skip
    response = api.post("/api/ingest", json={"events": events})
    assert response.status_code == 200 and all(
        e["status"] == 200 for e in response.json()["results"]
    ), response.text


def _routes(run_id: str) -> list[str]:
    return [
        f"/runs/{run_id}", f"/api/runs/{run_id}/keys", f"/api/runs/{run_id}/logs",
        f"/api/runs/{run_id}/rank-points?key=loss", f"/api/runs/{run_id}/metrics?key=eval",
        f"/api/runs/{run_id}/distributed?key=loss", f"/api/runs/{run_id}/stragglers?key=loss",
        f"/api/runs/{run_id}/health",
    ]  # fmt: skip


def test_a_deleted_run_is_404_everywhere_and_its_id_is_free(api: httpx.Client, run_id: str) -> None:
    _log(api, run_id, 50)
    api.post(f"/runs/{run_id}/metrics", json={"metrics": {"eval": 0.5}, "step": 3})
    api.post(f"/api/runs/{run_id}/attributes", json={"attributes": [
        {"path": "config/lr", "type": "config", "value": 0.1}]})  # fmt: skip
    listed = {r["id"]: r for r in api.get("/api/runs", params={"project": "tests"}).json()["runs"]}
    assert listed[run_id]["points"] == 50 * 4 * 2 + 1
    for path in _routes(run_id):
        assert api.get(path).status_code == 200, path
    used = api.get("/api/usage").json()["used"]

    assert api.delete(f"/api/runs/{run_id}").status_code == 204
    for path in _routes(run_id):
        response = api.get(path)
        assert response.status_code == 404, (path, response.text)
    assert run_id not in {r["id"] for r in api.get("/api/runs").json()["runs"]}
    assert api.get("/api/usage").json()["used"] == used  # charged stays charged
    assert api.delete(f"/api/runs/{run_id}").status_code == 404
    # The id is free: a new run, with nothing of the old one.
    created = api.post("/runs", json={"project": "other", "id": run_id})
    assert created.status_code == 201, created.text
    assert created.json()["run"]["points"] == 0 and created.json()["run"]["last_step"] is None
    assert api.get(f"/api/runs/{run_id}/keys").json()["keys"] == []
    assert api.get(f"/runs/{run_id}").json()["run"]["config"] == {}


def test_a_run_deleted_while_written_keeps_nothing_written_before(
    api: httpx.Client, run_id: str
) -> None:
    """The delete is applied after the writes queued before it; a later write finds no
    run (404). Nothing written is left behind."""
    statuses: list[int] = []
    stop = threading.Event()

    def write() -> None:
        with httpx.Client(base_url=str(api.base_url), headers=api.headers, timeout=30) as own:
            step = 0
            while not stop.is_set():
                body = rank_body(step=step, rank=0, world_size=1, metrics={"loss": 1.0})
                statuses.append(own.post(f"/runs/{run_id}/rank-metrics", json=body).status_code)
                step += 1

    writers = [threading.Thread(target=write) for _ in range(3)]
    for thread in writers:
        thread.start()
    while len(statuses) < 30:
        time.sleep(0.01)
    assert api.delete(f"/api/runs/{run_id}").status_code == 204
    after = len(statuses)
    time.sleep(0.5)
    stop.set()
    for thread in writers:
        thread.join()
    assert set(statuses) <= {200, 404}, set(statuses)
    assert statuses[:30].count(200) == 30
    assert statuses[after + 3 :] and set(statuses[after + 3 :]) == {404}
    assert api.get(f"/api/runs/{run_id}/keys").status_code == 404
    # No row of it left for a new run of the same id to see.
    assert api.post("/runs", json={"project": "tests", "id": run_id}).status_code == 201
    assert api.get(f"/api/runs/{run_id}/keys").json()["keys"] == []


def test_only_an_admin_of_the_org_deletes(
    server: ServerProcess, api: httpx.Client, run_id: str
) -> None:
    org = f"del-{uuid.uuid4().hex[:8]}"
    with httpx.Client(base_url=server.url, timeout=30) as other:
        other.headers["Authorization"] = f"Bearer {new_key(server, org, 'admin')}"
        assert other.delete(f"/api/runs/{run_id}").status_code == 404  # another org's run
        other.headers["Authorization"] = f"Bearer {new_key(server, org, 'read', 'ingest')}"
        response = other.delete(f"/api/runs/{run_id}")
        assert response.status_code == 403 and "admin" in response.json()["error"]
    assert api.get(f"/runs/{run_id}").status_code == 200


def test_the_cli_lists_points_and_deletes(
    server: ServerProcess, api: httpx.Client, run_id: str
) -> None:
    _log(api, run_id, 10)
    env = {"INSTANTML_API_BASE_URL": server.url, "INSTANTML_API_KEY": server.admin_key}
    listing = instantml("runs", "--project", "tests", env=env)
    assert listing.returncode == 0, listing.stderr
    (line,) = [row for row in listing.stdout.splitlines() if row.startswith(run_id)]
    assert "80" in line.split() and "points" in listing.stdout.splitlines()[0]
    refused = instantml("runs", "delete", run_id, env=env)  # not a terminal, no --yes
    assert refused.returncode != 0 and "--yes" in refused.stderr
    assert api.get(f"/runs/{run_id}").status_code == 200
    done = instantml("runs", "delete", run_id, "--yes", env=env)
    assert done.returncode == 0 and f"Deleted run {run_id!r}" in done.stdout, done.stderr
    assert api.get(f"/runs/{run_id}").status_code == 404
    missing = instantml("runs", "delete", run_id, "--yes", env=env)
    assert missing.returncode != 0 and "404" in missing.stderr


def test_retention_setting_is_checked_and_kept(api: httpx.Client) -> None:
    project = f"keep-{uuid.uuid4().hex[:8]}"
    path = f"/api/projects/{project}/retention"
    assert api.get(path).json() == {"project": project, "days": None, "default": True}
    assert api.put(path, json={"days": 30}).json() == {
        "project": project,
        "days": 30,
        "default": False,
    }
    assert api.get(path).json()["days"] == 30
    for bad in ({"days": 0}, {"days": "30"}, {"days": 1.5}, {}, {"days": True}):
        response = api.put(path, json=bad)
        assert response.status_code == 422 and response.json()["error"].startswith("days:"), bad
    assert api.put(path, json={"days": None}).json()["days"] is None
    assert api.get(path).json() == {"project": project, "days": None, "default": False}


def _age(data: Path, env: dict[str, str], run_ids: list[str], days: float) -> None:
    """Make runs look last written ``days`` ago (the server stopped; its stores edited)."""
    seconds = days * 86_400
    url = env.get("INSTANTML_METADATA_URL")
    if url is None:
        import duckdb

        with duckdb.connect(str(data / "instantml.duckdb")) as con:
            con.execute(
                "UPDATE runs SET updated_at = updated_at - ? WHERE run_id IN (SELECT unnest(?))",
                [seconds, run_ids],
            )
    else:
        import psycopg

        with psycopg.connect(url) as con:
            con.execute(
                "UPDATE runs SET updated_at = updated_at - %s WHERE run_id = ANY(%s)",
                [seconds, run_ids],
            )


def test_retention_deletes_only_runs_past_their_days(
    start_server: Callable[..., ServerProcess],
    stores_env: Callable[[Path], dict[str, str]],
    tmp_path: Path,
) -> None:
    data = tmp_path / "retained"
    server = start_server(data)
    with admin_client(server) as api:
        for run_id, project in (("old", "default"), ("old-kept", "forever"), ("old-long", "long"),
                                ("new", "default")):  # fmt: skip
            assert api.post("/runs", json={"project": project, "id": run_id}).status_code == 201
            _log(api, run_id, 5)
        api.put("/api/projects/forever/retention", json={"days": None})
        api.put("/api/projects/long/retention", json={"days": 30})
        used = api.get("/api/usage").json()["used"]
    server.stop()
    _age(data, stores_env(data), ["old", "old-kept", "old-long"], 3)
    env = {"INSTANTML_RETENTION_DAYS": "2", "INSTANTML_RETENTION_CHECK_SECONDS": "1"}
    server = start_server(data, env=env)
    stop = threading.Event()
    accepted: list[int] = []

    def busy() -> None:
        """Writes one after another: the writer is never idle, retention must still run."""
        with admin_client(server) as own:
            step = 5
            while not stop.is_set():
                body = rank_body(step=step, rank=0, world_size=4, metrics={"loss": 1.0})
                if own.post("/runs/new/rank-metrics", json=body).status_code == 200:
                    accepted.append(step)
                step += 1

    writer = threading.Thread(target=busy)
    writer.start()
    try:
        with admin_client(server) as api:
            deadline = time.monotonic() + 30
            while api.get("/runs/old").status_code != 404:
                assert time.monotonic() < deadline, "the run past its retention was not deleted"
                time.sleep(0.2)
    finally:
        stop.set()
        writer.join()
    with admin_client(server) as api:
        time.sleep(1.5)  # another check: nothing else goes
        kept = {r["id"] for r in api.get("/api/runs").json()["runs"]}
        assert kept == {"old-kept", "old-long", "new"}
        assert api.get("/api/runs/old/rank-points", params={"key": "loss"}).status_code == 404
        assert api.get("/api/usage").json()["used"] == used + len(accepted)  # none given back


@pytest.mark.skipif(STORES != "duckdb", reason="the embedded file's blocks")
def test_deleting_gives_space_back_to_new_writes(
    start_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """A deleted run's blocks go back to the embedded file's free list (DuckDB writes new
    data there before it grows the file); its Idempotency-Key answers stay, as they
    must."""
    import duckdb

    data = tmp_path / "space"

    def session(run_id: str | None = None, delete: str | None = None) -> tuple[int, int]:
        server = start_server(data)
        with admin_client(server) as api:
            if delete is not None:
                assert api.delete(f"/api/runs/{delete}").status_code == 204
            if run_id is not None:
                api.post("/runs", json={"project": "p", "id": run_id})
                for chunk in range(10):
                    _log_steps(api, run_id, chunk * 100, 100, 64)
        server.stop()  # a checkpoint: the file holds everything
        with duckdb.connect(str(data / "instantml.duckdb"), read_only=True) as con:
            ((used, free),) = con.execute(
                "SELECT used_blocks, free_blocks FROM pragma_database_size()"
            ).fetchall()
        return int(used), int(free)

    empty, _ = session()
    written, _ = session("first")
    used, free = session(delete="first")
    assert free >= (written - empty) // 3 and used < written, (empty, written, used, free)
    _, left = session("second")
    assert left < free  # the new run was written into the freed blocks first


def _log_steps(api: httpx.Client, run_id: str, first: int, steps: int, ranks: int) -> None:
    events = [
        {"event_id": f"{run_id}-{s}-{r}",
         "request": {"method": "POST", "path": f"/runs/{run_id}/rank-metrics",
                     "body": rank_body(step=s, rank=r, world_size=ranks, metrics={"loss": s * 0.5 + r})}}
        for s in range(first, first + steps) for r in range(ranks)
    ]  # fmt: skip
    assert api.post("/api/ingest", json={"events": events}).status_code == 200
