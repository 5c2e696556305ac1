"""`instantml server` as a process: first-start bootstrap, clean SIGTERM, acknowledged
writes surviving SIGKILL."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from instantml.server.process import ServerProcess, StartFailed, free_port
from tests.helpers import admin_client, instantml, rank_body, stored_rank_points


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


def _instantml(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    return instantml(*args, env={"HOME": str(home)})


def test_first_start_says_it_wrote_the_credentials(
    start_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = start_server()
    credentials = tmp_path / "server-home" / ".instantml" / "credentials"
    assert f"Wrote the local SDK credentials (this server and its admin key) to {credentials}" in (
        server.log()
    )


def test_a_kept_credentials_file_is_said_with_what_to_use_instead(
    start_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    # The user's file points at another server (an earlier demo, another port).
    credentials = tmp_path / "server-home" / ".instantml" / "credentials"
    credentials.parent.mkdir(parents=True)
    before = 'api_key = "iml_000000000000_old"\napi_host = "http://127.0.0.1:1"\n'
    credentials.write_text(before)
    server = start_server()
    log = server.log()
    assert credentials.read_text() == before
    assert "Local SDK credentials" not in log
    assert f"Kept {credentials}: it holds another key or address (http://127.0.0.1:1)" in log
    exports = dict(
        line.strip().removeprefix("export ").split("=", 1)
        for line in log.splitlines()
        if line.strip().startswith("export ")
    )
    assert exports == {
        "INSTANTML_API_BASE_URL": server.url,
        "INSTANTML_API_KEY": server.admin_key,
    }
    # The two lines work as printed: the SDK reaches this server with them.
    job = (
        "import instantml as im\n"
        "run = im.init(project='p', upload_mode='sync')\n"
        "run.log({'x': 1.0}, step=0)\n"
        "run.finish()\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", job],
        env={**os.environ, "HOME": str(tmp_path / "server-home"), **exports},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr


def test_a_busy_port_creates_nothing_and_says_so(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = _instantml(
            "server", "--data-dir", str(data), "--port", str(port), home=tmp_path / "home"
        )
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        f"error: cannot listen on 127.0.0.1:{port}: Address already in use"
        " (another server on it? choose one with --port)"
    ]
    assert out.stdout == ""  # no key printed
    assert not data.exists() and not (tmp_path / "home" / ".instantml").exists()


def test_a_second_server_on_a_data_dir_names_the_first(
    start_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    first = start_server()
    assert first.proc is not None
    out = _instantml(
        "server",
        "--data-dir",
        str(first.data_dir),
        "--port",
        str(free_port()),
        home=tmp_path / "home",
    )
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        f"error: data dir {first.data_dir} is in use by another instantml server"
        f" (PID {first.proc.pid})"
    ]


def test_a_health_check_answered_by_another_server_does_not_count(
    start_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    other = start_server()
    start = time.monotonic()
    with pytest.raises(StartFailed, match=f"port {other.port} on 127.0.0.1 is already in use"):
        ServerProcess(tmp_path / "mine", port=other.port).start()
    assert time.monotonic() - start < 5
    assert not (tmp_path / "mine").exists()
