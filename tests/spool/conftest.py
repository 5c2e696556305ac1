"""Helpers for spool tests: rank processes that log into a spool, and `instantml sync`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

RANK_SCRIPT = """
import os, sys, time, instantml as im
spool, run_id, steps, record = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
rec = os.open(record, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
run = im.init(project="spool", run_id=run_id, upload_mode="spool", spool_dir=spool)
os.write(rec, b"ready\\n")
for step in range(steps):
    run.log_rank_metrics({"loss": step + int(os.environ["RANK"]) / 100, "grad": 1.0, "t": 2.0}, step=step)
    os.write(rec, f"{step}\\n".encode())  # the call returned
    if os.environ.get("SLOW"):
        time.sleep(0.002)
run.finish()
"""


def spawn_rank(
    spool: Path, run_id: str, steps: int, record: Path, rank: int, world: int, slow: bool = False
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(rank % 4),
        # no server anywhere: spool mode must not need one
        "INSTANTML_API_BASE_URL": "http://127.0.0.1:9",
    }
    if slow:
        env["SLOW"] = "1"
    with record.with_suffix(".err").open("wb") as err:
        return subprocess.Popen(
            [sys.executable, "-c", RANK_SCRIPT, str(spool), run_id, str(steps), str(record)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


def returned_steps(record: Path) -> list[int]:
    if not record.exists():
        return []
    return [int(line) for line in record.read_text().split() if line != "ready"]


def sync(
    spool: Path, url: str, key: str, *extra: str, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "INSTANTML_API_BASE_URL": url, "INSTANTML_API_KEY": key}
    return subprocess.run(
        [sys.executable, "-m", "instantml", "sync", "--spool-dir", str(spool), *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def sync_process(spool: Path, url: str, key: str, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "INSTANTML_API_BASE_URL": url, "INSTANTML_API_KEY": key}
    return subprocess.Popen(
        [sys.executable, "-m", "instantml", "sync", "--spool-dir", str(spool), *extra],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
