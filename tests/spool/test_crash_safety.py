"""Real processes, real signals: what a returned log call wrote is delivered exactly once."""

from __future__ import annotations

import re
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from instantml.server.process import ServerProcess
from instantml.spool import segments
from tests.helpers import admin_client, stored_rank_points
from tests.spool.conftest import returned_steps, spawn_rank, sync, sync_process


def _stored(server: ServerProcess, run_id: str, key: str = "loss") -> dict[int, list[int]]:
    with admin_client(server) as api:
        points = stored_rank_points(api, run_id, key)
    by_rank: dict[int, list[int]] = {}
    for step, rank, *_ in points:
        by_rank.setdefault(rank, []).append(step)
    return by_rank


def test_eight_ranks_one_killed_server_down_then_sync(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    spool, run_id = tmp_path / "spool", f"crash-{uuid.uuid4().hex[:8]}"
    records = [tmp_path / f"rank{r}.txt" for r in range(8)]
    procs = [spawn_rank(spool, run_id, 400, records[r], r, 8, slow=(r == 3)) for r in range(8)]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(returned_steps(records[3])) < 50:
        time.sleep(0.01)
    procs[3].send_signal(signal.SIGKILL)  # mid-loop
    for p in procs:
        p.wait(timeout=120)
    assert procs[3].returncode == -signal.SIGKILL
    assert all(p.returncode == 0 for i, p in enumerate(procs) if i != 3), [
        r.with_suffix(".err").read_text() for r in records
    ]
    returned = {r: returned_steps(records[r]) for r in range(8)}
    assert 50 <= len(returned[3]) < 400

    server = start_server()
    out = sync(spool, server.url, server.admin_key)
    assert out.returncode == 0, out.stderr
    stored = _stored(server, run_id)
    for rank in range(8):
        if rank == 3:
            # Every call that returned is stored; at most the one in flight at the kill more.
            got = stored[3]
            assert got[: len(returned[3])] == returned[3]
            assert len(got) - len(returned[3]) in (0, 1)
        else:
            assert stored[rank] == list(range(400))
    # Each point once: one stored value per (step, rank), and each event delivered once.
    delivered = int(re.search(r"([\d,]+) events delivered", out.stdout).group(1).replace(",", ""))  # type: ignore[union-attr]
    lines = sum(len(v) for v in stored.values()) + 8 + 7  # points + 8 run creations + 7 finishes
    assert delivered == lines
    assert segments.list_segments(spool) == []  # every segment delivered and removed


def test_uploader_killed_mid_batch_then_restarted(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    spool, run_id = tmp_path / "spool", f"ukill-{uuid.uuid4().hex[:8]}"
    procs = [spawn_rank(spool, run_id, 3000, tmp_path / f"r{r}.txt", r, 4) for r in range(4)]
    for p in procs:
        assert p.wait(timeout=120) == 0
    server = start_server()
    uploader = sync_process(spool, server.url, server.admin_key, "--batch-events", "200")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait until some, not all, is acknowledged
        if any(segments.read_acked(s) for s in segments.list_segments(spool)):
            break
        time.sleep(0.005)
    uploader.send_signal(signal.SIGKILL)
    uploader.communicate()
    assert segments.list_segments(spool), "the uploader finished before it could be killed"
    out = sync(spool, server.url, server.admin_key)
    assert out.returncode == 0, out.stderr
    stored = _stored(server, run_id)
    assert {r: len(v) for r, v in stored.items()} == {r: 3000 for r in range(4)}
    assert segments.list_segments(spool) == []


def test_server_stopped_during_sync_then_started(tmp_path: Path) -> None:
    spool, run_id = tmp_path / "spool", f"down-{uuid.uuid4().hex[:8]}"
    procs = [spawn_rank(spool, run_id, 4000, tmp_path / f"r{r}.txt", r, 4) for r in range(4)]
    for p in procs:
        assert p.wait(timeout=120) == 0
    data, env = tmp_path / "data", {"HOME": str(tmp_path)}
    server = ServerProcess(data, env=env).start()
    key, port = server.admin_key, server.port
    uploader = sync_process(spool, server.url, key, "--batch-events", "100")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(
        segments.read_acked(s) for s in segments.list_segments(spool)
    ):
        time.sleep(0.005)
    server.stop()
    time.sleep(1.0)  # the uploader meets a closed port and backs off
    assert uploader.poll() is None
    server = ServerProcess(data, port=port, env=env).start()
    try:
        out, err = uploader.communicate(timeout=120)
        assert "events delivered" in out
        assert uploader.returncode == 0, err
        assert {r: len(v) for r, v in _stored(server, run_id).items()} == {
            r: 4000 for r in range(4)
        }
    finally:
        server.stop()
