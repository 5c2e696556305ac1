"""The monthly metric-point guardrail: exact limits, no trace of a refused write, replays
free, no overshoot under concurrency, rollover, and a re-sent spool counted once."""

from __future__ import annotations

import asyncio
import calendar
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx

from instantml.server.process import ServerProcess
from instantml.server.write.commands import CreateRun, Envelope, Idempotency, WriteScalars
from instantml.server.write.guardrail import UsagePolicy, usage
from instantml.server.write.service import WriteService
from instantml.spool import segments
from instantml.storage import open_stores
from tests.helpers import admin_client, rank_body, stored_keys, stored_rank_points
from tests.spool.conftest import spawn_rank, sync, sync_process


def _used(api: httpx.Client) -> int:
    return int(api.get("/api/usage").json()["used"])


def test_limit_reached_exactly_then_passed_by_one(
    start_server: Callable[..., ServerProcess],
) -> None:
    server = start_server(env={"INSTANTML_MONTHLY_METRIC_POINTS": "10"})
    with admin_client(server) as api:
        api.post("/runs", json={"project": "p", "id": "g"}).raise_for_status()
        two = rank_body(metrics={"a": 1.0, "b": 2.0})
        for rank in range(3):  # 6 rank points
            assert api.post("/runs/g/rank-metrics", json={**two, "rank": rank}).status_code == 200
        three = {"metrics": {"x": 1.0, "y": 2.0, "z": 3.0}, "step": 0}
        assert api.post("/runs/g/metrics", json=three).status_code == 200  # 9 points
        refused = api.post("/runs/g/rank-metrics", json={**two, "rank": 5})  # would make 11
        assert refused.status_code == 429
        assert refused.headers["x-instantml-ratelimit-scope"] == "monthly"
        error = refused.json()["error"]
        assert "limit 10" in error and "used 9" in error and "resets at" in error
        assert [p[1] for p in stored_rank_points(api, "g", "a")] == [0, 1, 2]  # no trace of it
        # One point lands exactly on the limit: accepted.
        assert (
            api.post("/runs/g/metrics", json={"metrics": {"last": 1.0}, "step": 1}).status_code
            == 200
        )
        assert _used(api) == 10
        assert (
            api.post("/runs/g/metrics", json={"metrics": {"more": 1.0}, "step": 2}).status_code
            == 429
        )
        assert "more" not in [k["key"] for k in stored_keys(api, "g")]
        usage = api.get("/api/usage").json()
        assert (usage["used"], usage["limit"]) == (10, 10)
        # In a batch each event is counted and refused on its own.
        events = [
            {
                "event_id": f"e{i}",
                "request": {
                    "method": "POST",
                    "path": "/runs/g/metrics",
                    "body": {"metrics": {"q": 1.0}, "step": i},
                },
            }
            for i in range(2)
        ]
        results = api.post("/api/ingest", json={"events": events}).json()["results"]
        assert [r["status"] for r in results] == [429, 429]
        assert results[0]["body"]["scope"] == "monthly"


def test_replays_count_nothing_and_rewrites_count(
    start_server: Callable[..., ServerProcess],
) -> None:
    server = start_server(env={"INSTANTML_MONTHLY_METRIC_POINTS": "5"})
    with admin_client(server) as api:
        api.post("/runs", json={"project": "p", "id": "r"}).raise_for_status()
        headers = {"Idempotency-Key": "k1"}
        for _ in range(5):
            assert (
                api.post("/runs/r/rank-metrics", json=rank_body(), headers=headers).status_code
                == 200
            )
        assert _used(api) == 1
        for _ in range(4):  # a rewrite of the same point is an accepted value: it counts
            assert api.post("/runs/r/rank-metrics", json=rank_body()).status_code == 200
        assert _used(api) == 5
        assert (
            api.post("/runs/r/rank-metrics", json=rank_body(), headers=headers).status_code == 200
        )


def test_concurrent_writers_never_overshoot(start_server: Callable[..., ServerProcess]) -> None:
    server = start_server(env={"INSTANTML_MONTHLY_METRIC_POINTS": "1000"})
    with admin_client(server) as api:
        api.post("/runs", json={"project": "p", "id": "race"}).raise_for_status()
        events = [
            {
                "event_id": f"f{i}",
                "request": {
                    "method": "POST",
                    "path": "/runs/race/metrics",
                    "body": {"metrics": {f"m{j}": 1.0 for j in range(100)}, "step": i},
                },
            }
            for i in range(9)
        ]
        api.post("/api/ingest", json={"events": events}).raise_for_status()
        assert _used(api) == 900

    async def race() -> list[int]:
        headers = {"Authorization": f"Bearer {server.admin_key}"}
        async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=30) as c:
            responses = await asyncio.gather(
                *[
                    c.post(
                        "/runs/race/rank-metrics",
                        json=rank_body(
                            metrics={f"k{j}": 1.0 for j in range(10)},
                            step=1,
                            rank=i % 8,
                            local_rank=None,
                        ),
                    )
                    for i in range(32)
                ]
            )
        return [r.status_code for r in responses]

    statuses = asyncio.run(race())
    assert statuses.count(200) == 10 and statuses.count(429) == 22
    with admin_client(server) as api:
        assert _used(api) == 1000
        stored = sum(len(stored_rank_points(api, "race", f"k{j}")) for j in range(10))
    # 10 writes of 10 keys were accepted; a later write of the same rank replaces a point.
    # Which 10 of the 32 won depends on arrival order, so count the ranks they wrote.
    ranks = {i % 8 for i, status in enumerate(statuses) if status == 200}
    assert stored == 10 * len(ranks)


def test_month_rollover(tmp_path: Path) -> None:
    now = [float(calendar.timegm((2026, 11, 30, 23, 59, 0)))]  # 23:59 UTC
    stores = open_stores(f"duckdb://{tmp_path / 's.duckdb'}")
    policy = UsagePolicy(default_limit=3, clock=lambda: now[0])
    service = WriteService(stores, policy)
    org, _ = stores.tenancy.ensure_org("o")
    service.apply([Envelope(CreateRun(org, "r", "p", None, {}, [], {}))])

    def write(step: int, n: int, key: int | None = None) -> int:
        metrics = {f"m{i}": 1.0 for i in range(n)}
        idem = Idempotency(key, key, 1) if key is not None else None
        return service.apply([Envelope(WriteScalars(org, "r", step, metrics, 0.0), idem)])[0].status

    assert write(0, 3, key=1) == 200
    assert write(1, 1) == 429
    assert usage(stores, policy, org)["reset_at"] == "2026-12-01T00:00:00Z"
    now[0] += 120  # December, 00:01 UTC
    assert usage(stores, policy, org) == {
        "month": "2026-12",
        "used": 0,
        "limit": 3,
        "reset_at": "2027-01-01T00:00:00Z",
    }
    assert write(1, 3) == 200
    assert write(0, 3, key=1) == 200  # a replay of November's write: still free
    assert write(2, 1) == 429
    stores.tenancy.set_monthly_limit(org, 4)
    assert write(2, 1) == 200
    stores.tenancy.set_monthly_limit(org, None)
    assert usage(stores, policy, org)["limit"] == 3
    stores.close()


def test_a_spool_resent_after_an_uploader_kill_is_counted_once(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    spool, run_id = tmp_path / "spool", f"count-{uuid.uuid4().hex[:6]}"
    for p in [spawn_rank(spool, run_id, 2000, tmp_path / f"r{r}.txt", r, 2) for r in range(2)]:
        assert p.wait(timeout=120) == 0
    server = start_server()
    uploader = sync_process(spool, server.url, server.admin_key, "--batch-events", "100")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(
        segments.read_acked(s) for s in segments.list_segments(spool)
    ):
        time.sleep(0.005)
    uploader.send_signal(signal.SIGKILL)
    uploader.communicate()
    out = sync(spool, server.url, server.admin_key)
    assert out.returncode == 0, out.stderr
    with admin_client(server) as api:
        assert _used(api) == 2 * 2000 * 3  # 3 metrics a call, every point once


def test_usage_cli(start_server: Callable[..., ServerProcess]) -> None:
    server = start_server(env={"INSTANTML_MONTHLY_METRIC_POINTS": "100"})
    env = {
        **os.environ,
        "INSTANTML_API_BASE_URL": server.url,
        "INSTANTML_API_KEY": server.admin_key,
    }

    def run(*args: str) -> str:
        out = subprocess.run(
            [sys.executable, "-m", "instantml", *args], env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        return out.stdout

    assert "0 metric points used of 100" in run("usage")
    assert "limit set to 7 points a month" in run("usage", "set-limit", "7")
    assert "used of 7" in run("usage")
    assert "server default" in run("usage", "set-limit", "none")
    assert "used of 100" in run("usage")
