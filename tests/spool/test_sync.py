"""The uploader's contract: torn lines, dead letters, idempotent re-sync, one uploader per
spool, a refused key, and the background uploader started by init."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

import instantml as im
from instantml.server.process import ServerProcess
from instantml.spool import segments
from instantml.spool.uploader import DEAD_LETTER
from tests.helpers import admin_client, stored_keys, stored_rank_points
from tests.spool.conftest import sync, sync_process


def _log(spool: Path, run_id: str, steps: int = 10, world: int = 2) -> None:
    run = im.init(
        project="spool",
        run_id=run_id,
        upload_mode="spool",
        spool_dir=str(spool),
        base_url="http://127.0.0.1:9",
    )
    for step in range(steps):
        for rank in range(world):
            run.log_rank_metrics(
                {"loss": float(step + rank)}, step=step, rank=rank, world_size=world
            )
    run.finish()


def _event_line(run_id: str, event_id: str, body: dict[str, object]) -> bytes:
    return (
        orjson.dumps(
            {
                "version": 1,
                "event_id": event_id,
                "sequence": 1,
                "run_id": run_id,
                "timestamp": 0.0,
                "request": {"method": "POST", "path": f"/runs/{run_id}/rank-metrics", "body": body},
            }
        )
        + b"\n"
    )


def test_event_lines_have_the_documented_shape(tmp_path: Path) -> None:
    _log(tmp_path, "shape", steps=1, world=1)
    (segment,) = segments.list_segments(tmp_path)
    first, second, last = (orjson.loads(line) for line in segment.read_bytes().splitlines())
    assert first.keys() == {"version", "event_id", "sequence", "run_id", "timestamp", "request"}
    assert first["request"] == {
        "method": "POST",
        "path": "/runs",
        "body": {"project": "spool", "id": "shape"},
    }
    assert second["request"]["path"] == "/runs/shape/rank-metrics"
    assert [first["sequence"], second["sequence"], last["sequence"]] == [1, 2, 3]
    assert last["request"] == {
        "method": "PATCH",
        "path": "/runs/shape",
        "body": {"status": "finished"},
    }


def test_torn_last_line_and_a_bad_event(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    spool = tmp_path / "spool"
    _log(spool, "torn", steps=5)
    (segment,) = segments.list_segments(spool)
    good = {"metrics": {"loss": 9.0}, "step": 99, "rank": 0, "world_size": 2}
    with segment.open("ab") as handle:  # as a writer killed mid-line would leave it
        handle.write(_event_line("torn", "bad-1", {**good, "weight": 0}))
        handle.write(_event_line("torn", "good-1", good))
        handle.write(_event_line("torn", "cut", good)[:60])
    server = start_server()
    out = sync(spool, server.url, server.admin_key)
    assert out.returncode == 0, out.stderr
    assert "1 refused" in out.stdout and "1 torn" in out.stdout
    with admin_client(server) as api:
        points = stored_rank_points(api, "torn", "loss")
    assert len(points) == 11 and points[-1][:3] == [99, 0, 9.0]
    dead = [orjson.loads(line) for line in (spool / DEAD_LETTER).read_bytes().splitlines()]
    assert [d["status"] for d in dead] == [422, None]
    assert "weight" in dead[0]["reason"] and dead[0]["event"]["event_id"] == "bad-1"
    assert "torn" in dead[1]["reason"]
    assert segments.list_segments(spool) == []


def test_the_same_spool_synced_twice_changes_nothing(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    spool, copy = tmp_path / "spool", tmp_path / "copy"
    _log(spool, "twice")
    shutil.copytree(spool, copy)
    server = start_server()
    first = sync(spool, server.url, server.admin_key)
    assert "22 events delivered, 0 already" in first.stdout, first.stdout
    again = sync(spool, server.url, server.admin_key)
    assert "0 events delivered, 0 already" in again.stdout
    replay = sync(copy, server.url, server.admin_key)  # the same events sent a second time
    assert "0 events delivered, 22 already delivered" in replay.stdout, replay.stdout
    with admin_client(server) as api:
        assert len(stored_rank_points(api, "twice", "loss")) == 20


def test_one_uploader_per_spool(tmp_path: Path, start_server: Callable[..., ServerProcess]) -> None:
    spool = tmp_path / "spool"
    _log(spool, "lock")
    server = start_server()
    follower = sync_process(spool, server.url, server.admin_key, "--follow")
    try:
        deadline = time.monotonic() + 30
        while segments.list_segments(spool) and time.monotonic() < deadline:
            time.sleep(0.05)
        second = sync(spool, server.url, server.admin_key)
        assert second.returncode == 3 and "another uploader" in second.stderr
    finally:
        follower.terminate()
        out, _ = follower.communicate(timeout=30)
    assert follower.returncode == 0 and "22 events delivered" in out
    # The lock dies with its holder: a new uploader may start at once.
    assert sync(spool, server.url, server.admin_key).returncode == 0


def test_a_refused_key_stops_the_upload_and_keeps_the_spool(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    spool = tmp_path / "spool"
    _log(spool, "denied")
    server = start_server()
    out = sync(spool, server.url, "iml_000000000000_nope")
    assert out.returncode == 1 and "401" in out.stderr and "intact" in out.stderr
    assert (
        len(segments.list_segments(spool)) == 1
        and segments.read_acked(segments.list_segments(spool)[0]) == 0
    )
    assert sync(spool, server.url, server.admin_key).returncode == 0


BACKGROUND = """
import sys, instantml as im
run = im.init(project="bg", run_id=sys.argv[2], upload_mode="spool", spool_dir=sys.argv[1],
              spool_uploader=True)
for step in range(50):
    run.log_rank_metrics({"loss": float(step)}, step=step, rank=0, world_size=1)
run.finish()
"""


def test_background_uploader_outlives_training(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    server = start_server()
    spool, run_id = tmp_path / "spool", f"bg-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "INSTANTML_API_BASE_URL": server.url,
        "INSTANTML_API_KEY": server.admin_key,
    }
    subprocess.run(
        [sys.executable, "-c", BACKGROUND, str(spool), run_id], env=env, check=True, timeout=60
    )
    deadline = time.monotonic() + 30
    with admin_client(server) as api:
        while time.monotonic() < deadline and len(stored_rank_points(api, run_id, "loss")) < 50:
            time.sleep(0.1)
        assert len(stored_rank_points(api, run_id, "loss")) == 50
        assert api.get(f"/runs/{run_id}").json()["run"]["status"] == "finished"
    while time.monotonic() < deadline and segments.list_segments(spool):
        time.sleep(0.1)
    assert segments.list_segments(spool) == []
    assert "events delivered" in (spool / "uploader.log").read_text()


def test_spool_mode_makes_no_network_call(tmp_path: Path) -> None:
    # No server, an unreachable address, and no exception: init and logging only write files.
    _log(tmp_path / "spool", "offline")
    assert len(segments.list_segments(tmp_path / "spool")) == 1


def test_bad_fsync_policy_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="fsync"):
        im.init(project="p", upload_mode="spool", spool_dir=str(tmp_path), spool_fsync="sometimes")


def test_unwritable_spool_counts_and_warns(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.warns(RuntimeWarning, match="spool"):
        run = im.init(project="p", upload_mode="spool", spool_dir=str(blocker / "spool"))
    for step in range(5):
        run.log_rank_metrics({"x": 1.0}, step=step, rank=0, world_size=1)
    assert run.dropped_events == 6  # the run creation and five points
    run.finish()


def test_stored_keys_after_sync(tmp_path: Path, start_server: Callable[..., ServerProcess]) -> None:
    spool = tmp_path / "spool"
    _log(spool, "keys")
    server = start_server()
    sync(spool, server.url, server.admin_key)
    with admin_client(server) as api:
        assert [k["key"] for k in stored_keys(api, "keys")] == ["loss"]
