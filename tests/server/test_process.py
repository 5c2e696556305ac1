"""`instantml server` as a process: first-start bootstrap, clean SIGTERM, acknowledged
writes surviving SIGKILL."""

from __future__ import annotations

import signal
import stat
from collections.abc import Callable
from pathlib import Path

from instantml.server.process import ServerProcess
from tests.helpers import admin_client, rank_body, stored_rank_points


def test_first_start_bootstrap(start_server: Callable[..., ServerProcess], tmp_path: Path) -> None:
    server = start_server()
    key_file = server.data_dir / "admin-key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    credentials = tmp_path / "server-home" / ".instantml" / "credentials"
    text = credentials.read_text()
    assert f'api_key = "{server.admin_key}"' in text and server.url in text
    assert stat.S_IMODE(credentials.stat().st_mode) == 0o600
    assert "Created the admin API key" in server.log() and server.admin_key in server.log()
    assert f"{server.url}/?token={server.admin_key}" in server.log()


def test_existing_credentials_are_left_alone(
    start_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    credentials = tmp_path / "server-home" / ".instantml" / "credentials"
    credentials.parent.mkdir(parents=True)
    credentials.write_text('api_key = "mine"\n')
    start_server()
    assert credentials.read_text() == 'api_key = "mine"\n'


def test_sigterm_stops_cleanly_and_restart_keeps_data(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = {"HOME": str(tmp_path / "home")}
    with ServerProcess(data, env=env) as server:
        key = server.admin_key
        with admin_client(server) as api:
            api.post("/runs", json={"project": "p", "id": "keep"}).raise_for_status()
            api.post("/runs/keep/rank-metrics", json=rank_body()).raise_for_status()
        assert server.stop() == 0
    with ServerProcess(data, env=env) as again:
        assert again.admin_key == key
        assert "Created the admin API key" not in again.log().split("InstantML server on")[-1]
        with admin_client(again) as api:
            assert len(stored_rank_points(api, "keep", "train/loss")) == 1


def test_acknowledged_writes_survive_sigkill(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = {"HOME": str(tmp_path / "home")}
    server = ServerProcess(data, env=env).start()
    path = "/runs/crash/rank-metrics"
    events = [
        {
            "event_id": f"e{i}",
            "request": {
                "method": "POST",
                "path": path,
                "body": rank_body(step=i // 8, rank=i % 8, local_rank=None),
            },
        }
        for i in range(2000)
    ]
    with admin_client(server) as api:
        api.post("/runs", json={"project": "p", "id": "crash"}).raise_for_status()
        assert api.post("/api/ingest", json={"events": events}).status_code == 200
    assert server.proc is not None
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait()
    with ServerProcess(data, env=env) as again, admin_client(again) as api:
        assert len(stored_rank_points(api, "crash", "train/loss")) == 2000
        # The replay of the acknowledged batch is recognised after the crash too.
        results = api.post("/api/ingest", json={"events": events}).json()["results"]
        assert {r["status"] for r in results} == {200}
        assert all(r["body"] == {"accepted": 1} for r in results)
        assert len(stored_rank_points(api, "crash", "train/loss")) == 2000
