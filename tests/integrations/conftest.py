"""Real frameworks, no mocks: jobs run as their launchers run them, against a real server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from instantml.server.process import ServerProcess

HERE = Path(__file__).parent


def needs(*modules: str) -> None:
    for module in modules:
        pytest.importorskip(module, reason=f"{module} is in the test extra")


def run_job(
    argv: list[str], server: ServerProcess, tmp_path: Path, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "INSTANTML_API_BASE_URL": server.url,
        "INSTANTML_API_KEY": server.admin_key,
        "PYTHONPATH": os.pathsep.join([str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",  # several ranks on two cores
    }
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "INSTANTML_RUN_ID", "TORCHELASTIC_RUN_ID"):
        env.pop(name, None)
    out = subprocess.run(
        [sys.executable, *argv], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    return out


def only_run(api: httpx.Client, project: str) -> dict[str, object]:
    runs = api.get("/api/runs", params={"project": project}).json()["runs"]
    assert len(runs) == 1, runs  # every rank in one run
    return runs[0]  # type: ignore[no-any-return]


def ranks_of(api: httpx.Client, run_id: str, key: str) -> set[int]:
    points = api.get(f"/api/runs/{run_id}/rank-points", params={"metric": key}).json()["points"]
    return {p[1] for p in points}
