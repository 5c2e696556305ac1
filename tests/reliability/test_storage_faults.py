"""Storage faults on the embedded store: the data disk full (the server's file-size limit
lowered to 1 byte with prlimit, then lifted: every write past it fails as on a full disk),
and a torn or garbled write-ahead log found at restart."""

from __future__ import annotations

import os
import resource
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from instantml.server.process import ServerProcess, StartFailed
from tests.conftest import STORES
from tests.helpers import stored_rank_points
from tests.summary.compare import assert_matches
from tests.summary.reference import Point, reference

WORLD = 4
pytestmark = pytest.mark.skipif(
    STORES != "duckdb", reason="faults of the embedded store's own files (the WAL, its disk)"
)


def _batch(run_id: str, steps: range, tag: str) -> dict[str, Any]:
    return {
        "events": [
            {
                "event_id": f"{run_id}-{tag}-{step}-{rank}",
                "request": {
                    "method": "POST",
                    "path": f"/runs/{run_id}/rank-metrics",
                    "body": {"metrics": {"loss": step + 0.1 * rank}, "step": step, "rank": rank,
                             "world_size": WORLD},
                },
            }
            for step in steps
            for rank in range(WORLD)
        ]
    }  # fmt: skip


def _stored(api: httpx.Client, run_id: str) -> dict[tuple[int, int], float]:
    # [] when the run itself was in what was lost
    return {(p[0], p[1]): p[2] for p in stored_rank_points(api, run_id, "loss")}  # type: ignore[misc]


def _api(server: ServerProcess) -> httpx.Client:
    headers = {"Authorization": f"Bearer {server.admin_key}"}
    return httpx.Client(base_url=server.url, headers=headers, timeout=60)


@pytest.mark.skipif(not hasattr(resource, "prlimit"), reason="needs Linux's prlimit")
def test_a_full_disk_answers_503_then_serves_again(
    start_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    server = start_server(data)
    assert server.proc is not None
    pid = server.proc.pid
    with _api(server) as api:
        run = f"full-{uuid.uuid4().hex[:8]}"
        assert api.post("/runs", json={"project": "faults", "id": run}).status_code == 201
        first = api.post("/api/ingest", json=_batch(run, range(0, 20), "a"))
        assert first.status_code == 200
        _, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (1, hard))  # the disk is full
        try:
            full = api.post("/api/ingest", json=_batch(run, range(20, 40), "b"))
            single = api.post(f"/runs/{run}/rank-metrics", json={
                "metrics": {"loss": 1.0}, "step": 99, "rank": 0, "world_size": WORLD})  # fmt: skip
            reads = api.get(f"/api/runs/{run}/distributed", params={"key": "loss"})
        finally:
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (hard, hard))  # space freed
        # While full: each write refused as retryable, reads still served.
        assert full.status_code == 200
        results = full.json()["results"]
        assert {r["status"] for r in results} == {503}
        assert "retry" in results[0]["body"]["error"]
        assert single.status_code == 503 and "retry" in single.json()["error"]
        assert reads.status_code == 200
        # After: the same batch goes through, as new (nothing of it was kept).
        again = api.post("/api/ingest", json=_batch(run, range(20, 40), "b"))
        assert [r["status"] for r in again.json()["results"]] == [200] * len(results)
        assert not any(r.get("replayed") for r in again.json()["results"])
        assert len(_stored(api, run)) == 40 * WORLD
    server.stop()
    restarted = start_server(data)
    with _api(restarted) as api:
        stored = _stored(api, run)
        assert stored == {(s, r): s + 0.1 * r for s in range(40) for r in range(WORLD)}
        assert api.get("/api/usage").json()["used"] == 40 * WORLD  # each point charged once
        got = api.get(f"/api/runs/{run}/distributed", params={"key": "loss"}).json()
        assert_matches(
            got, reference([Point(s, r, v, 1.0, None, WORLD) for (s, r), v in stored.items()]), 40.0
        )


@pytest.mark.parametrize("damage", ["truncated", "garbled"])
def test_a_damaged_wal_at_restart(
    start_server: Callable[..., ServerProcess], tmp_path: Path, damage: str
) -> None:
    """A torn log (a crash mid-write): the server starts, keeping the units the log holds
    whole before the tear. A damaged entry in the middle: the server says, in one line, to
    move the log aside, and doing so starts it from the last checkpoint. Either way what is
    kept is a prefix of what was sent, batch by batch, consistent, and writes go on."""
    data = tmp_path / "data"
    server = start_server(data)
    assert server.proc is not None
    run = f"wal-{uuid.uuid4().hex[:8]}"
    with _api(server) as api:
        assert api.post("/runs", json={"project": "faults", "id": run}).status_code == 201
        for batch in range(30):  # one unit each
            steps = range(batch * 5, batch * 5 + 5)
            assert api.post("/api/ingest", json=_batch(run, steps, "w")).status_code == 200
    server.proc.kill()
    server.proc.wait()
    wal = data / "instantml.duckdb.wal"
    size = wal.stat().st_size
    assert size > 10_000, "the units should still be in the log"
    with wal.open("r+b") as handle:
        if damage == "truncated":
            handle.truncate(size * 6 // 10)
        else:
            handle.seek(size * 6 // 10)
            handle.write(os.urandom(256))
    if damage == "garbled":
        with pytest.raises(StartFailed) as refused:
            start_server(data)
        reason = refused.value.reason
        assert "write-ahead log" in reason and f"mv {wal} {wal}.damaged" in reason
        assert "Traceback" not in refused.value.args[0]
        wal.rename(wal.with_name(wal.name + ".damaged"))
    restarted = start_server(data)
    with _api(restarted) as api:
        stored = _stored(api, run)
        kept = len(stored) // (5 * WORLD)
        assert (0 < kept < 30) if damage == "truncated" else (0 <= kept < 30)
        assert stored == {(s, r): s + 0.1 * r for s in range(kept * 5) for r in range(WORLD)}
        if stored:
            got = api.get(f"/api/runs/{run}/distributed", params={"key": "loss"}).json()
            writes = [Point(s, r, v, 1.0, None, WORLD) for (s, r), v in stored.items()]
            assert_matches(got, reference(writes), 150.0)
        assert api.post("/runs", json={"project": "faults", "id": run}).status_code in (200, 201)
        # Writes go on; the lost batches can be sent again (their keys were lost with them).
        for batch in range(kept, 30):
            steps = range(batch * 5, batch * 5 + 5)
            again = api.post("/api/ingest", json=_batch(run, steps, "w")).json()["results"]
            assert {r["status"] for r in again} == {200}
        assert len(_stored(api, run)) == 150 * WORLD
