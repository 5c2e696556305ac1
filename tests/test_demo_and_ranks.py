"""The README's demo job, and `instantml ranks` on the run it leaves behind, by the
commands the demo prints."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from instantml.server.process import ServerProcess, free_port
from tests.helpers import admin_client, instantml


def _demo_args(tmp_path: Path, *args: str) -> list[str]:
    return ["demo", "--data-dir", str(tmp_path / "demo-data"), *args]


def _demo(tmp_path: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {"HOME": str(tmp_path / "home")}
    return instantml(*_demo_args(tmp_path, *args), env=env, timeout=timeout)


def test_demo_then_ranks_as_printed(tmp_path: Path) -> None:
    port = free_port()
    demo = _demo(tmp_path, "--no-serve", "--steps", "60", "--port", str(port))
    assert demo.returncode == 0, demo.stdout + demo.stderr
    out = demo.stdout
    run_id = re.search(r"Run id: (\S+)", out).group(1)  # type: ignore[union-attr]
    # The server is stopped: no dashboard link to it, but how to start it again.
    assert "Dashboard:" not in out and "The server is stopped (--no-serve)" in out
    # The demo keeps its own credentials: the user's file is never written.
    assert not (tmp_path / "home" / ".instantml" / "credentials").exists()
    lines = out.splitlines()
    start_line = lines[
        lines.index(next(x for x in lines if x.startswith("The server is stopped"))) + 1
    ]
    ranks_line = lines[-1].strip()
    assert " server --data-dir " in start_line and ranks_line.endswith(f"ranks {run_id}")
    env = {**os.environ, "HOME": str(tmp_path / "home"), "COLUMNS": "140", "NO_COLOR": "1"}
    server = subprocess.Popen(
        ["bash", "-c", f"exec {start_line.strip()}"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        summary = subprocess.run(
            ["bash", "-c", ranks_line], env=env, capture_output=True, text=True, timeout=60
        )
        with admin_client(ServerProcess(tmp_path / "demo-data", port=port)) as api:
            step_time = api.get(
                f"/api/runs/{run_id}/distributed", params={"key": "perf/step_time_ms"}
            ).json()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)
    assert summary.returncode == 0, summary.stderr
    text = summary.stdout
    assert f"run {run_id}" in text and "key train/loss" in text  # a loss by default
    assert "rank metrics: optimizer/grad_norm, perf/step_time_ms, train/loss" in text
    assert "Missing from the last step" in text
    assert re.search(r"│\s+3\s+│\s+36\s+│\s+37\s+│", text), text
    worst = text.split("Worst ranks")[1]
    first_row = next(line for line in worst.splitlines() if re.match(r"│\s+\d+\s+│", line))
    assert re.match(r"│\s+5\s+│", first_row), first_row  # the noisy shard heads the rollup
    assert step_time["world_size"] == 8
    assert step_time["coverage"]["missing"] == [
        {"rank": 3, "last_seen_step": 36, "first_missing_step": 37}
    ]
    # Rank 5 is the slow one: the furthest above the mean. (Its step times are measured,
    # so under load another rank may be as noisy by |z|; none is as slow.)
    assert max(step_time["ranks"], key=lambda r: r["mean_delta"])["rank"] == 5


def test_demo_on_a_busy_port_fails_at_once(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "other", env={"HOME": str(tmp_path / "h")}) as other:
        started = time.monotonic()
        demo = _demo(tmp_path, "--no-serve", "--port", str(other.port), timeout=60)
    assert demo.returncode == 1
    assert time.monotonic() - started < 20  # not minutes of silence and 401s
    assert f"port {other.port} on 127.0.0.1 is already in use" in demo.stderr
    assert "Running" not in demo.stdout
    assert not (tmp_path / "demo-data").exists()


def test_sigterm_to_the_demo_stops_its_server(tmp_path: Path) -> None:
    port = free_port()
    args = _demo_args(tmp_path, "--port", str(port), "--steps", "20", "--world-size", "2")
    demo = subprocess.Popen(
        [sys.executable, "-m", "instantml", *args],
        env={**os.environ, "HOME": str(tmp_path / "home")},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert demo.stdout is not None
    for line in demo.stdout:
        if "Serving" in line:
            break
    server_pid = int((tmp_path / "demo-data" / "server.lock").read_text())
    demo.send_signal(signal.SIGTERM)
    demo.communicate(timeout=30)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and _alive(server_pid):
        time.sleep(0.1)
    assert not _alive(server_pid)
    assert demo.returncode != 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) is not running either.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False
