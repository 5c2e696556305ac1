"""The public instantml 0.1.1 SDK (from PyPI, in a venv of its own) is a real client of this
server in each of its upload modes: sync, async and spool with its own drain_spool."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import httpx
import pytest

from instantml.server.process import ServerProcess
from tests.helpers import stored_keys, stored_rank_points, stored_scalars

PUBLIC_PYTHON = os.environ.get("INSTANTML_PUBLIC_SDK_PYTHON")
JOB = Path(__file__).with_name("public_sdk_job.py")

pytestmark = pytest.mark.skipif(
    not PUBLIC_PYTHON,
    reason="set INSTANTML_PUBLIC_SDK_PYTHON to a python with instantml==0.1.1 (scripts/test.sh does)",
)


@pytest.mark.parametrize("mode", ["sync", "async", "spool"])
def test_public_sdk_mode(
    server: ServerProcess, api: httpx.Client, tmp_path: Path, mode: str
) -> None:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "INSTANTML_API_KEY": server.admin_key,
        "INSTANTML_API_BASE_URL": server.url,
    }
    out = subprocess.run(
        [str(PUBLIC_PYTHON), str(JOB), mode, str(tmp_path / "spool")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    run_id = out.stdout.strip().splitlines()[-1]
    run = api.get(f"/runs/{run_id}").json()["run"]
    assert (run["project"], run["name"], run["status"]) == (
        "public-sdk",
        f"public-{mode}",
        "finished",
    )
    assert run["config"] == {"lr": 0.01, "nested": {"depth": 2}, "batch_size": 128}
    assert run["tags"] == ["compat"] and run["metadata"]["notes"] == "from the public SDK"
    stored = {k["key"]: (k["kind"], k["points"]) for k in stored_keys(api, run_id)}
    health = {key for key in stored if key.startswith("system/instantml/")}
    assert {key: stored[key] for key in stored.keys() - health} == {
        "eval/accuracy": ("scalar", 5),
        "train/loss": ("rank", 20),
        "optimizer/grad_norm": ("rank", 20),
    }
    if mode == "async":
        # Its uploader reports its own health at step = unix time: stored, and with nothing
        # failed or dropped (each of those requests was refused with a 422 before).
        assert {"system/instantml/upload_lag_seconds", "system/instantml/failed_events"} <= health
        for key in ("failed_events", "dropped_events"):
            series = stored_scalars(api, run_id, f"system/instantml/{key}")
            assert series["points"] and all(value == 0 for _, value in series["points"]), series
            assert all(step > 1.7e9 for step, _ in series["points"])  # unix times
        assert run["last_step"] == 4
    else:
        assert not health
    # capture_console=True: the job's printed lines, stored and in order.
    logs = api.get(f"/api/runs/{run_id}/logs").json()["lines"]
    stdout = [x["message"] for x in logs if x["stream"] == "stdout"]
    assert [m for m in stdout if m.startswith("epoch")] == [f"epoch {s} done" for s in range(5)]
    assert "warning: a slow rank" in [x["message"] for x in logs if x["stream"] == "stderr"]
    points = stored_rank_points(api, run_id, "train/loss")
    assert points[0] == [0, 0, 1.0, 32.0, 0, 4]
    assert points[-1] == [4, 3, 0.2 + 3, 128.0, 1, 4]
