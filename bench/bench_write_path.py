"""The write path against its floor, side by side in one run.

    .venv/bin/python bench/bench_write_path.py [--seconds 5] [--trials 3] [--batches 10000]
                                               [--sync-events 200000]

1. Single-event POSTs (``POST /runs/{id}/rank-metrics``, 3 keys, as the public SDK's sync
   mode and async uploader send them) from 64 keep-alive clients (4 processes x 16
   threads, one connection each): requests/s, p50 and p99 latency, against this server
   and against a bare uvicorn + Starlette endpoint on the same uvicorn settings that only
   reads and parses the JSON body (the floor any Python server on this stack has).
   Alternated trials, medians.
2. ``POST /api/ingest`` with --batches-event batches of 3 keys (2 senders): points/s.
3. ``instantml sync`` draining a spool of --sync-events events: events/s as it reports.

The load generator shares this machine's cores with the server: figures are for both.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path

import httpx
import orjson

from instantml.server.process import ServerProcess

sys.path.insert(0, str(Path(__file__).parent))
from bench_spool import drain, fill_spool, pct

PROCESSES, THREADS = 4, 16

BARE_APP = textwrap.dedent(
    """
    import orjson
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    async def write(request):
        orjson.loads(await request.body())
        return Response(b'{"accepted":3}', media_type="application/json")

    app = Starlette(routes=[Route("/runs/{run_id}/rank-metrics", write, methods=["POST"])])
    """
)


def body(step: int, rank: int) -> bytes:
    return orjson.dumps({
        "metrics": {"train/loss": 1.0 / (step + 1), "optimizer/grad_norm": 2.5, "perf/step_ms": 31.0},
        "step": step, "rank": rank, "world_size": 512, "local_rank": rank % 8, "weight": 1024,
    })  # fmt: skip


def _client_process(
    url: str, key: str, run_id: str, seconds: float, first_rank: int, out: object
) -> None:
    latencies: list[float] = []
    lock = threading.Lock()
    deadline = time.perf_counter() + seconds
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    def client(rank: int) -> None:
        mine = []
        with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
            step = 0
            while time.perf_counter() < deadline:
                start = time.perf_counter()
                response = http.post(f"/runs/{run_id}/rank-metrics", content=body(step, rank))
                mine.append(time.perf_counter() - start)
                response.raise_for_status()
                step += 1
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client, args=(first_rank + t,)) for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.put(latencies)  # type: ignore[attr-defined]


def single_posts(url: str, key: str, run_id: str, seconds: float) -> tuple[float, float, float]:
    """(requests/s, p50 ms, p99 ms) of 64 keep-alive clients."""
    queue: multiprocessing.Queue[list[float]] = multiprocessing.Queue()
    procs = [
        multiprocessing.Process(
            target=_client_process, args=(url, key, run_id, seconds, p * THREADS, queue)
        )
        for p in range(PROCESSES)
    ]
    start = time.perf_counter()
    for p in procs:
        p.start()
    latencies = [x for _ in procs for x in queue.get()]
    for p in procs:
        p.join()
    elapsed = time.perf_counter() - start
    return len(latencies) / elapsed, pct(latencies, 0.5) * 1000, pct(latencies, 0.99) * 1000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Bare:
    """The bare endpoint in its own uvicorn process."""

    def __init__(self, tmp: Path) -> None:
        (tmp / "bare_app.py").write_text(BARE_APP)
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "bare_app:app",
                "--port",
                str(port),
                "--log-level",
                "warning",
            ],
            cwd=tmp,
        )
        for _ in range(200):
            try:
                httpx.post(f"{self.url}/runs/x/rank-metrics", content=b"{}")
                return
            except httpx.HTTPError:
                time.sleep(0.05)
        raise RuntimeError("the bare endpoint did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()


def ingest(url: str, key: str, run_id: str, batch: int, batches: int) -> float:
    """Points/s through /api/ingest, ``batches`` batches of ``batch`` events x 3 keys, 2
    senders (the batches are built before the clock starts)."""
    path = f"/runs/{run_id}/rank-metrics"
    payloads = []
    for b in range(batches):
        events = []
        for i in range(batch):
            n = b * batch + i
            events.append({"event_id": f"{run_id}-{n}", "request": {"method": "POST", "path": path,
                           "body": orjson.loads(body(n // 512, n % 512))}})  # fmt: skip
        payloads.append(orjson.dumps({"events": events}))
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    start = time.perf_counter()

    def sender(mine: list[bytes]) -> None:
        with httpx.Client(base_url=url, headers=headers, timeout=300) as http:
            for payload in mine:
                http.post("/api/ingest", content=payload).raise_for_status()

    threads = [threading.Thread(target=sender, args=(payloads[w::2],)) for w in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return batches * batch * 3 / (time.perf_counter() - start)


def new_run(server: ServerProcess) -> str:
    run_id = f"bench-{uuid.uuid4().hex[:10]}"
    httpx.post(f"{server.url}/runs", json={"project": "bench", "id": run_id},
               headers={"Authorization": f"Bearer {server.admin_key}"}).raise_for_status()  # fmt: skip
    return run_id


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--batches", type=int, default=10_000, help="events per /api/ingest batch")
    parser.add_argument("--sync-events", type=int, default=200_000)
    args = parser.parse_args()
    print(
        f"cores: {os.cpu_count()}; {PROCESSES} processes x {THREADS} threads of keep-alive clients"
    )
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        bare = Bare(tmp)
        ours_rows, bare_rows = [], []
        try:
            with ServerProcess(tmp / "data", env={"HOME": tmp_name}) as server:
                for _ in range(args.trials):
                    ours_rows.append(
                        single_posts(server.url, server.admin_key, new_run(server), args.seconds)
                    )
                    bare_rows.append(single_posts(bare.url, "none", "x", args.seconds))
                ingests = [
                    ingest(server.url, server.admin_key, new_run(server), args.batches, 6)
                    for _ in range(args.trials)
                ]
                spool = tmp / "spool"
                fill_spool(spool, args.sync_events, new_run(server))
                _, synced = drain(spool, server)
        finally:
            bare.stop()
    med = statistics.median

    def column(rows: list[tuple[float, float, float]], i: int) -> float:
        return med(r[i] for r in rows)

    ours, floor = column(ours_rows, 0), column(bare_rows, 0)
    print("\nsingle-event POSTs, 64 clients (medians over trials):")
    print(
        f"  this server : {ours:8,.0f} req/s  p50 {column(ours_rows, 1):6.1f} ms  p99 {column(ours_rows, 2):6.1f} ms"
    )
    print(
        f"  bare endpoint: {floor:8,.0f} req/s  p50 {column(bare_rows, 1):6.1f} ms  p99 {column(bare_rows, 2):6.1f} ms"
    )
    print(f"  ratio        : {ours / floor:.3f} of bare")
    print(f"\n/api/ingest, {args.batches:,}-event batches x 3 keys: {med(ingests):,.0f} points/s"
          f" (trials: {', '.join(f'{x:,.0f}' for x in ingests)})")  # fmt: skip
    print(f"instantml sync drain of {args.sync_events:,} events: {synced:,.0f} events/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
