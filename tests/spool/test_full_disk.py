"""A full disk during logging (RLIMIT_FSIZE on the rank process) never crashes training;
what was written before is delivered, the torn fragment is skipped."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from instantml.server.process import ServerProcess
from tests.helpers import admin_client, stored_rank_points
from tests.spool.conftest import sync

FULL = """
import resource, sys, warnings, instantml as im
warnings.simplefilter("always")
resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))  # the "disk" holds 20 kB
run = im.init(project="full", run_id="full", upload_mode="spool", spool_dir=sys.argv[1])
for step in range(1000):
    run.log_rank_metrics({"loss": float(step)}, step=step, rank=0, world_size=1)
print("dropped", run.dropped_events)
run.finish()
print("finished")
"""


def test_full_disk(tmp_path: Path, start_server: Callable[..., ServerProcess]) -> None:
    spool = tmp_path / "spool"
    out = subprocess.run(
        [sys.executable, "-c", FULL, str(spool)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "INSTANTML_API_BASE_URL": "http://127.0.0.1:9"},
    )
    assert out.returncode == 0, out.stderr
    assert "finished" in out.stdout
    dropped = int(out.stdout.split("dropped")[1].split()[0])
    assert dropped > 500
    assert out.stderr.count("RuntimeWarning") == 1 and "spool" in out.stderr
    server = start_server()
    result = sync(spool, server.url, server.admin_key)
    assert result.returncode == 0, result.stderr
    with admin_client(server) as api:
        points = stored_rank_points(api, "full", "loss")
    # Every event that fit is delivered, in order, and nothing that did not fit.
    assert [p[0] for p in points] == list(range(len(points)))
    assert len(points) + dropped == 1000
