"""Every rule of the contract across server processes (docs/architecture.md): three
``instantml server`` processes on one PostgreSQL and one ClickHouse, as on three hosts."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import psycopg

import instantml as im
from instantml.spool.uploader import Uploader
from tests.helpers import rank_body, stored_rank_points
from tests.scaleout.conftest import Fleet
from tests.scaleout.roundrobin import round_robin


def _client(url: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60)


def _new_run(url: str, key: str) -> str:
    run_id = f"s-{uuid.uuid4().hex[:10]}"
    with _client(url, key) as api:
        api.post("/runs", json={"project": "scale", "id": run_id}).raise_for_status()
    return run_id


def test_processes_starting_at_once_create_one_admin_key(
    start_fleet: Callable[..., Fleet],
) -> None:
    fleet = start_fleet(3)
    key = fleet.admin_key  # exactly one data dir holds it
    with psycopg.connect(fleet.env["INSTANTML_METADATA_URL"]) as con:
        row = con.execute("SELECT count(*) FROM api_keys").fetchone()
    assert row is not None and row[0] == 1
    for url in fleet.urls:  # and every process takes it
        with _client(url, key) as api:
            assert api.get("/api/runs").status_code == 200


def test_one_idempotency_key_sent_to_two_processes_at_once_is_applied_once(
    start_fleet: Callable[..., Fleet],
) -> None:
    fleet = start_fleet(3)
    key = fleet.admin_key
    run_id = _new_run(fleet.urls[0], key)
    path = f"/runs/{run_id}/rank-metrics"

    async def race(step: int) -> list[httpx.Response]:
        headers = {"Authorization": f"Bearer {key}", "Idempotency-Key": uuid.uuid4().hex}
        body = rank_body(metrics={"a": float(step), "b": 1.0}, step=step, rank=0)
        async with httpx.AsyncClient(headers=headers, timeout=60) as client:
            return await asyncio.gather(
                *[client.post(url + path, json=body) for url in fleet.urls[:2] for _ in range(2)]
            )

    async def all_races() -> list[list[httpx.Response]]:
        return await asyncio.gather(*[race(step) for step in range(20)])

    for responses in asyncio.run(all_races()):
        statuses = [r.status_code for r in responses]
        assert set(statuses) <= {200, 409}, [r.text for r in responses]
        assert statuses.count(200) >= 1
        assert all(r.json() == {"accepted": 2} for r in responses if r.status_code == 200)
    with _client(fleet.urls[2], key) as api:
        points = stored_rank_points(api, run_id, "a")
        assert len(points) == 20 and {p[0] for p in points} == set(range(20))  # once per step
        assert api.get("/api/usage").json()["used"] == 40  # each key's 2 points counted once


def test_clients_racing_the_monthly_limit_across_processes_never_overshoot(
    start_fleet: Callable[..., Fleet],
) -> None:
    limit = 300
    fleet = start_fleet(3, env={"INSTANTML_MONTHLY_METRIC_POINTS": str(limit)})
    key = fleet.admin_key
    run_id = _new_run(fleet.urls[0], key)
    accepted: list[int] = []
    refused: list[int] = []
    other: list[str] = []
    go = threading.Barrier(32)

    def client(n: int) -> None:
        clients = [_client(url, key) for url in fleet.urls]
        go.wait()
        for i in range(10):  # 32 x 10 x 3 = 960 points asked for, 300 allowed
            answer = clients[(n + i) % 3].post(
                f"/runs/{run_id}/metrics",
                json={"metrics": {"a": 1.0, "b": 2.0, "c": 3.0}, "step": n * 100 + i},
            )
            if answer.status_code == 200:
                accepted.append(n)
            elif answer.status_code == 429:
                refused.append(n)
            else:
                other.append(answer.text)
        for c in clients:
            c.close()

    threads = [threading.Thread(target=client, args=(n,)) for n in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert other == []
    assert len(accepted) * 3 == limit and len(refused) == 320 - len(accepted)
    with _client(fleet.urls[1], key) as api:
        assert api.get("/api/usage").json()["used"] == limit
        stored = api.get(f"/api/runs/{run_id}/metrics", params={"metric": "a"}).json()["points"]
        assert len(stored) == len(accepted)


def test_a_key_revoked_on_one_process_is_refused_by_all_within_5_s(
    start_fleet: Callable[..., Fleet],
) -> None:
    fleet = start_fleet(3)
    with _client(fleet.urls[0], fleet.admin_key) as admin:
        made = admin.post("/api/keys", json={"scopes": ["ingest", "read"]}).json()
    clients = [_client(url, made["key"]) for url in fleet.urls]
    try:
        for api in clients:  # every process has verified (and cached) the key
            assert api.get("/api/runs").status_code == 200
        with _client(fleet.urls[0], fleet.admin_key) as admin:
            assert admin.delete(f"/api/keys/{made['key_id']}").status_code == 200
        revoked_at = time.monotonic()
        assert clients[0].get("/api/runs").status_code == 401  # where it was revoked: at once
        refused_after: list[float] = []
        for api in clients[1:]:
            while api.get("/api/runs").status_code == 200:
                assert time.monotonic() - revoked_at < 5.0, "still accepted after 5 s"
                time.sleep(0.05)
            refused_after.append(time.monotonic() - revoked_at)
        assert all(api.get("/api/runs").status_code == 401 for api in clients)
    finally:
        for api in clients:
            api.close()


def test_a_spool_of_8_ranks_drained_through_a_round_robin_lands_once_in_order(
    start_fleet: Callable[..., Fleet], tmp_path: Path
) -> None:
    fleet = start_fleet(3)
    key = fleet.admin_key
    spool, run_id = tmp_path / "spool", f"rr-{uuid.uuid4().hex[:8]}"
    world, steps, rewrites = 8, 40, 15
    runs = [  # eight "rank processes": eight segments of one run
        im.init(project="spool", run_id=run_id, upload_mode="spool", spool_dir=str(spool))
        for _ in range(world)
    ]
    for rank, run in enumerate(runs):
        for step in range(steps):
            run.log_rank_metrics({"loss": float(step)}, step=step, rank=rank, world_size=world)
        for step in range(rewrites):  # later writes of the same points: the last one wins
            run.log_rank_metrics({"loss": 100.0 + step}, step=step, rank=rank, world_size=world)
        run.finish()
    with (
        round_robin(fleet.urls) as proxy,
        Uploader(spool, proxy.url, key, batch_events=16, pipeline=2) as uploader,
    ):
        stats = uploader.run()
    assert len(proxy.sent) == 3 and min(proxy.sent.values()) >= 5  # all took batches
    per_rank = 1 + steps + rewrites + 1
    assert (stats.delivered, stats.replayed, stats.dead_lettered) == (world * per_rank, 0, 0)
    with _client(fleet.urls[2], key) as api:
        points = stored_rank_points(api, run_id, "loss")
        values = {(step, rank): value for step, rank, value, *_ in points}
        assert len(points) == len(values) == world * steps
        for rank in range(world):
            assert [values[(s, rank)] for s in range(steps)] == [
                100.0 + s for s in range(rewrites)
            ] + [float(s) for s in range(rewrites, steps)]
        assert api.get(f"/runs/{run_id}").json()["run"]["status"] == "finished"
        assert api.get("/api/usage").json()["used"] == world * (steps + rewrites)
    assert not list((spool / "segments").glob("*.jsonl"))
