"""``--workers``, bad configuration and an engine going away: a clear error at start, 503
(retryable) while running, and nothing half-written: the uploader's retry completes it."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import httpx
import pytest

import instantml as im
from instantml.server.process import ServerProcess, StartFailed, free_port
from tests.clickhouse_http import Endpoint
from tests.engines import Engines
from tests.helpers import instantml, rank_body, stored_rank_points
from tests.postgres import PASSWORD
from tests.spool.conftest import sync_process


def test_workers_serve_on_one_port_and_stop_together(
    tmp_path: Path, shared_stores: dict[str, str]
) -> None:
    server = ServerProcess(
        tmp_path / "data",
        env={"HOME": str(tmp_path / "home"), "INSTANTML_WORKERS": "3", **shared_stores},
    ).start(60)
    try:
        assert "3 processes" in server.log()
        key = server.admin_key
        headers = {"Authorization": f"Bearer {key}"}
        workers: set[int] = set()
        for step in range(60):  # a new connection each time: the kernel spreads them
            with httpx.Client(base_url=server.url, headers=headers, timeout=30) as api:
                workers.add(api.get("/healthz").json()["worker_pid"])
                if step == 0:
                    api.post("/runs", json={"project": "p", "id": "w"}).raise_for_status()
                body = rank_body(metrics={"loss": float(step)}, step=step)
                assert api.post("/runs/w/rank-metrics", json=body).status_code == 200
        assert len(workers) >= 2 and server.proc is not None and server.proc.pid not in workers
        with httpx.Client(base_url=server.url, headers=headers, timeout=30) as api:
            assert len(stored_rank_points(api, "w", "loss")) == 60
    finally:
        assert server.stop() == 0
    for pid in workers:  # SIGTERM to the launcher stops every process
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.parametrize("points", ["default", "chdb"])
def test_workers_are_refused_on_an_embedded_store(
    tmp_path: Path, engines: Engines, points: str
) -> None:
    env = {"HOME": str(tmp_path / "home")}
    if points == "chdb":
        env["INSTANTML_METADATA_URL"] = engines.postgres().new_database()
        env["INSTANTML_POINTS_URL"] = f"chdb://{tmp_path / 'ch'}"
    data = tmp_path / "data"
    out = instantml("server", "--data-dir", str(data), "--port", str(free_port()),
                    "--workers", "2", env=env)  # fmt: skip
    assert out.returncode == 1
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert "--workers 2 needs stores every process shares" in out.stderr
    assert ("an embedded DuckDB file" if points == "default" else "chdb") in out.stderr
    assert not data.exists()  # refused before anything was created


def test_unreachable_postgresql_or_a_wrong_password_is_one_clear_line(
    tmp_path: Path, engines: Engines
) -> None:
    cluster = engines.postgres()
    points = engines.clickhouse().url()
    nowhere = f"postgresql://postgres:{PASSWORD}@127.0.0.1:{free_port()}/x"
    wrong = cluster.url("postgres", password="not-the-password")
    for url, says in ((nowhere, "Connection refused"), (wrong, "password authentication failed")):
        started = time.monotonic()
        out = instantml("server", "--data-dir", str(tmp_path / "data"), "--port",
                        str(free_port()), "--metadata-url", url, "--points-url", points,
                        env={"HOME": str(tmp_path / "home")})  # fmt: skip
        assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
        assert out.stderr.startswith("error: cannot connect to PostgreSQL at postgresql://")
        assert says in out.stderr and out.stderr.count("\n") == 1, out.stderr
        assert PASSWORD not in out.stderr and "not-the-password" not in out.stderr
        assert time.monotonic() - started < 30
    # ClickHouse where nothing listens: the same, for the points URL.
    gone = f"clickhouse://127.0.0.1:{free_port()}/points"
    out = instantml("server", "--data-dir", str(tmp_path / "data"), "--port", str(free_port()),
                    "--metadata-url", cluster.new_database(), "--points-url", gone,
                    env={"HOME": str(tmp_path / "home")})  # fmt: skip
    assert out.returncode == 1 and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith(f"error: cannot use ClickHouse at {gone}: "), out.stderr


def test_clickhouse_down_mid_ingest_is_503_and_the_uploader_completes_after(
    tmp_path: Path, engines: Engines
) -> None:
    endpoint = Endpoint(tmp_path / "clickhouse" / "engine")  # this test's own, to stop
    server = ServerProcess(
        tmp_path / "data",
        env={
            "HOME": str(tmp_path / "home"),
            "INSTANTML_METADATA_URL": engines.postgres().new_database(),
            "INSTANTML_POINTS_URL": endpoint.url("points"),
        },
    ).start(60)
    follower = None
    try:
        key = server.admin_key
        api = httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=60
        )
        run_id = f"down-{uuid.uuid4().hex[:8]}"
        api.post("/runs", json={"project": "p", "id": run_id}).raise_for_status()
        for rank in range(4):
            body = rank_body(metrics={"loss": 1.0}, step=0, rank=rank, world_size=4)
            assert api.post(f"/runs/{run_id}/rank-metrics", json=body).status_code == 200
        used = api.get("/api/usage").json()["used"]

        endpoint.stop()
        body = rank_body(metrics={"loss": 2.0}, step=1, rank=0, world_size=4)
        down = api.post(f"/runs/{run_id}/rank-metrics", json=body)
        assert down.status_code == 503 and "retry" in down.json()["error"], down.text
        summary = api.get(f"/api/runs/{run_id}/distributed", params={"metric": "loss"})
        assert summary.status_code == 503 and "retry" in summary.json()["error"]
        assert api.get("/api/usage").json()["used"] == used  # nothing counted, nothing kept

        # Eight ranks spool while the engine is down; the uploader retries until it is back.
        spool = tmp_path / "spool"
        for rank in range(8):
            run = im.init(project="p", run_id=run_id, upload_mode="spool", spool_dir=str(spool))
            for step in range(1, 21):
                run.log_rank_metrics({"loss": step + rank / 10}, step=step, rank=rank, world_size=8)
            run.finish()
        follower = sync_process(spool, server.url, key, "--retry-for", "120")
        time.sleep(2.0)
        assert follower.poll() is None  # still retrying
        endpoint = endpoint.restart()
        _, err = follower.communicate(timeout=120)
        assert follower.returncode == 0, err
        points = stored_rank_points(api, run_id, "loss")
        values = {(step, rank): value for step, rank, value, *_ in points}
        assert len(points) == len(values) == 4 + 8 * 20
        assert all(values[(s, r)] == s + r / 10 for s in range(1, 21) for r in range(8))
        assert api.get("/api/usage").json()["used"] == used + 8 * 20  # each point once
        assert api.get(f"/api/runs/{run_id}/distributed", params={"metric": "loss"}).is_success
        api.close()
    finally:
        if follower is not None and follower.poll() is None:
            follower.send_signal(signal.SIGTERM)
            follower.wait(10)
        server.stop()
        endpoint.stop()


def test_start_failures_are_reported_by_the_launcher(tmp_path: Path) -> None:
    # The fixture's own contract: a server that exits at start raises, with its reason.
    with pytest.raises(StartFailed, match="--workers 2 needs stores"):
        ServerProcess(
            tmp_path / "data",
            env={"HOME": str(tmp_path / "home"), "INSTANTML_WORKERS": "2"},
        ).start()
