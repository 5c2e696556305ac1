"""Runs a process did not finish are finished at exit, after a crash, and on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import httpx
import pytest

from instantml.server.process import ServerProcess

SCRIPT = """
import os, sys, time, instantml as im
run = im.init(project="life", run_id=sys.argv[1], upload_mode=sys.argv[2])
run.log_rank_metrics({"x": 1.0}, step=0, rank=0, world_size=1)
mode = sys.argv[3]
if mode == "context":
    with im.init(project="life", run_id=sys.argv[1] + "-ctx") as ctx:
        ctx.log({"y": 1.0})
        raise SystemExit(0)
if mode == "raise":
    raise RuntimeError("training diverged")
if mode == "sigterm":
    print("ready", flush=True)
    time.sleep(60)
"""


def _spawn(
    server: ServerProcess, run_id: str, upload_mode: str, mode: str
) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "INSTANTML_API_KEY": server.admin_key,
        "INSTANTML_API_BASE_URL": server.url,
    }
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT, run_id, upload_mode, mode],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("upload_mode", ["sync", "async"])
@pytest.mark.parametrize(
    ("mode", "status"), [("exit", "finished"), ("raise", "failed"), ("sigterm", "crashed")]
)
def test_status_after_process_end(
    server: ServerProcess, api: httpx.Client, upload_mode: str, mode: str, status: str
) -> None:
    run_id = f"life-{uuid.uuid4().hex[:8]}"
    proc = _spawn(server, run_id, upload_mode, mode)
    if mode == "sigterm":
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    if mode == "sigterm":
        assert proc.returncode == -signal.SIGTERM, err  # the signal still ends the process
    run = api.get(f"/runs/{run_id}").json()["run"]
    assert run["status"] == status, err
    assert api.get(f"/api/runs/{run_id}/rank-points", params={"metric": "x"}).json()["points"]


def test_context_manager_finishes(server: ServerProcess, api: httpx.Client) -> None:
    run_id = f"life-{uuid.uuid4().hex[:8]}"
    proc = _spawn(server, run_id, "sync", "context")
    proc.communicate(timeout=60)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if api.get(f"/runs/{run_id}-ctx").json()["run"]["status"] == "finished":
            break
        time.sleep(0.1)
    assert api.get(f"/runs/{run_id}-ctx").json()["run"]["status"] == "finished"
