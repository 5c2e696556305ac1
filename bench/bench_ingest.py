"""Write-path throughput and SDK call cost, measured side by side in one run.

    .venv/bin/python bench/bench_ingest.py [--seconds 3] [--trials 5]

Starts a real server (embedded DuckDB store) in a child process on loopback and reports, as
medians over trials:
  1. requests/s of single-event POST /runs/{id}/rank-metrics (1 client, and 16 concurrent);
  2. events/s and rank points/s through POST /api/ingest, batches of 1,000 events x 3 keys;
  3. the training-side cost of one log_rank_metrics call (3 keys): async mode (median, p99
     microseconds) next to sync mode, against the same live server.
The load generator shares this machine's cores with the server: figures are for both.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from instantml.server.process import ServerProcess

sys.path.insert(0, str(Path(__file__).parent))
from bench_spool import call_costs, pct


def _body(step: int, rank: int) -> dict[str, object]:
    return {
        "metrics": {
            "train/loss": 1.0 / (step + 1),
            "optimizer/grad_norm": 2.5,
            "perf/step_ms": 31.0,
        },
        "step": step,
        "rank": rank,
        "world_size": 512,
        "local_rank": rank % 8,
        "weight": 1024,
    }


def _new_run(api: httpx.Client) -> str:
    run_id = f"bench-{uuid.uuid4().hex[:10]}"
    api.post("/runs", json={"project": "bench", "id": run_id}).raise_for_status()
    return run_id


async def single_requests(
    url: str, key: str, run_id: str, seconds: float, concurrency: int
) -> float:
    headers = {"Authorization": f"Bearer {key}"}
    done = 0
    # The clients are made before the clock starts: each builds an SSL context (even for
    # http://), which on some machines takes longer than a trial's requests.
    clients = [
        httpx.AsyncClient(base_url=url, headers=headers, limits=httpx.Limits(max_connections=1))
        for _ in range(concurrency)
    ]
    deadline = time.perf_counter() + seconds

    async def client(worker: int) -> None:
        nonlocal done
        async with clients[worker] as http:
            step = 0
            while time.perf_counter() < deadline:
                response = await http.post(f"/runs/{run_id}/rank-metrics", json=_body(step, worker))
                response.raise_for_status()
                step += 1
                done += 1

    start = time.perf_counter()
    await asyncio.gather(*(client(w) for w in range(concurrency)))
    return done / (time.perf_counter() - start)


async def ingest_batches(
    url: str, key: str, run_id: str, seconds: float, senders: int = 2
) -> float:
    headers = {"Authorization": f"Bearer {key}"}
    path = f"/runs/{run_id}/rank-metrics"
    events = 0
    base = uuid.uuid4().hex
    clients = [
        httpx.AsyncClient(base_url=url, headers=headers, timeout=120) for _ in range(senders)
    ]  # before the clock starts, as in single_requests
    deadline = time.perf_counter() + seconds

    async def sender(worker: int) -> None:
        nonlocal events
        async with clients[worker] as http:
            batch_no = 0
            while time.perf_counter() < deadline:
                first = (worker * 1_000_000 + batch_no) * 1000
                batch = [
                    {
                        "event_id": f"{base}-{first + i}",
                        "request": {
                            "method": "POST",
                            "path": path,
                            "body": _body((first + i) // 512, (first + i) % 512),
                        },
                    }
                    for i in range(1000)
                ]
                response = await http.post("/api/ingest", json={"events": batch})
                response.raise_for_status()
                batch_no += 1
                events += 1000

    start = time.perf_counter()
    await asyncio.gather(*(sender(w) for w in range(senders)))
    return events / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, ServerProcess(Path(tmp) / "data") as server:
        key = server.admin_key
        api = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {key}"})
        seq, conc, ingest, async_med, async_p99, sync_med = [], [], [], [], [], []
        for _ in range(args.trials):
            seq.append(
                asyncio.run(single_requests(server.url, key, _new_run(api), args.seconds, 1))
            )
            conc.append(
                asyncio.run(single_requests(server.url, key, _new_run(api), args.seconds, 16))
            )
            ingest.append(asyncio.run(ingest_batches(server.url, key, _new_run(api), args.seconds)))
            costs = call_costs(20_000, upload_mode="async", base_url=server.url, api_key=key)
            async_med.append(statistics.median(costs))
            async_p99.append(pct(costs, 0.99))
            sync_med.append(
                statistics.median(
                    call_costs(300, upload_mode="sync", base_url=server.url, api_key=key)
                )
            )
        api.close()
    med = statistics.median
    print(f"trials: {args.trials}, {args.seconds:.0f} s each; medians over trials")
    print(f"POST /runs/{{id}}/rank-metrics, 1 client      : {med(seq):9.0f} requests/s")
    print(
        f"POST /runs/{{id}}/rank-metrics, 16 concurrent : {med(conc):9.0f} requests/s"
        f"  ({med(conc) * 3:.0f} points/s)"
    )
    print(
        f"POST /api/ingest, 1,000-event batches, 2 senders: {med(ingest):9.0f} events/s"
        f"  = {med(ingest) * 3:.0f} rank points/s"
    )
    print(
        f"  ratio ingest events/s : single-route requests/s (16 concurrent) = {med(ingest) / med(conc):.1f}x"
    )
    print(
        f"log_rank_metrics (3 keys), async mode: median {med(async_med):.1f} us, p99 {med(async_p99):.1f} us"
    )
    print(
        f"log_rank_metrics (3 keys), sync mode : median {med(sync_med):.1f} us"
        f"  (async is {med(sync_med) / med(async_med):.0f}x cheaper)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
