"""The write path against its floor, side by side in one run.

    .venv/bin/python bench/bench_write_path.py [--seconds 5] [--trials 3] [--batches 10000]
                                               [--sync-events 200000]

1. Single-event POSTs (``POST /runs/{id}/rank-metrics``, 3 keys, as the public SDK's sync
   mode and async uploader send them) from 64 keep-alive clients (4 processes x 16
   threads, one connection each): requests/s, p50 and p99 latency, against this server
   and against a bare uvicorn + Starlette endpoint on the same uvicorn settings that only
   reads and parses the JSON body (the floor any Python server on this stack has).
   Alternated trials, medians.
2. ``POST /api/ingest`` with --batches-event batches of 3 keys (2 senders): points/s,
   against a second server that decodes batches in its own process
   (INSTANTML_DECODE_PROCESSES=0), and against the floor: the store's own bulk write of
   the same points and answers, in this process, no HTTP.
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
import numpy as np
import orjson

from instantml.server.process import ServerProcess
from instantml.server.write.commands import Envelope
from instantml.server.write.service import WriteService
from instantml.storage import open_stores
from instantml.storage.records import RANK, Keys, RunSpec

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


METRICS = ("train/loss", "optimizer/grad_norm", "perf/step_ms")


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


def ingest(url: str, key: str, run_id: str, batch: int, batches: int, senders: int = 2) -> float:
    """Points/s through /api/ingest, ``batches`` batches of ``batch`` events x 3 keys,
    ``senders`` at once (as the uploader's 2 pipelined batches; the batches are built
    before the clock starts)."""
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

    threads = [
        threading.Thread(target=sender, args=(payloads[w::senders],)) for w in range(senders)
    ]
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


def store_floor(path: Path, batch: int, batches: int) -> float:
    """Points/s of the store's own bulk write of the same batches, in this process: the
    points of 3 keys, the runs' extents and one stored answer per event, one unit (one
    COMMIT) per batch, columns built before the clock starts. What /api/ingest costs on
    top of this is HTTP, decoding, checking, hashing and deciding."""
    stores = open_stores(f"duckdb://{path}")
    try:
        org, _ = stores.tenancy.ensure_org("bench")
        WriteService(stores).apply([Envelope(RunSpec(org, "floor", "bench", None, {}, [], {}))])
        run = stores.runs.resolve(org, ["floor"])["floor"]
        assert run is not None
        with stores.unit():
            sids = stores.runs.series_ids(run, RANK, list(METRICS))
        rng = np.random.default_rng(0)
        writers = rng.integers(-(2**62), 2**62, size=512)
        prepared = []
        for b in range(batches):
            n = b * batch + np.arange(batch)
            columns = {
                "step": n // 512, "rank": (n % 512).astype(np.int16),
                "world_size": np.full(batch, 512, np.int16), "local_rank": (n % 8).astype(np.int16),
                "weight": np.full(batch, 1024.0), "ts": np.full(batch, time.time()),
                "seq": np.arange(batch),
            }  # fmt: skip
            keys = rng.integers(-(2**62), 2**62, size=(3, batch))
            # Each rank a writer's keys "<prefix>-<n>", n its step + 1, as the spool names them.
            sequence = (writers[n % 512], n // 512 + 1)
            prepared.append((columns, keys, sequence, int(n[-1] // 512)))
        start = time.perf_counter()
        for columns, keys, sequence, last in prepared:
            with stores.unit():
                for sid in sids:
                    stores.points.write_rank(sid, dict(columns, value=rng.random(batch)))
                stores.runs.extend({run.seq: (512, last)})
                stores.ledger.record(
                    Keys(np.full(batch, org), keys[0], keys[1], *sequence), keys[2],
                    np.full(batch, 200, np.int16), ['{"accepted":3}'] * batch, time.time(),
                )  # fmt: skip
        return batches * batch * len(sids) / (time.perf_counter() - start)
    finally:
        stores.close()


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
        inline_env = {"HOME": tmp_name, "INSTANTML_DECODE_PROCESSES": "0"}
        try:
            with (
                ServerProcess(tmp / "data", env={"HOME": tmp_name}) as server,
                ServerProcess(tmp / "inline", env=inline_env) as inline,
            ):
                for _ in range(args.trials):
                    ours_rows.append(
                        single_posts(server.url, server.admin_key, new_run(server), args.seconds)
                    )
                    bare_rows.append(single_posts(bare.url, "none", "x", args.seconds))
                # The first large batch starts the decoding process: one untimed batch.
                ingest(server.url, server.admin_key, new_run(server), args.batches, 1, 1)
                time.sleep(2)
                ingests, inlines, floors = [], [], []
                for trial in range(args.trials):
                    ingests.append(
                        ingest(server.url, server.admin_key, new_run(server), args.batches, 6)
                    )
                    inlines.append(
                        ingest(inline.url, inline.admin_key, new_run(inline), args.batches, 6)
                    )
                    floors.append(store_floor(tmp / f"floor{trial}.duckdb", args.batches, 6))
                fill_spool(tmp / "spool", args.sync_events, new_run(server))
                _, synced = drain(tmp / "spool", server)
                fill_spool(tmp / "spool-inline", args.sync_events, new_run(inline))
                _, synced_inline = drain(tmp / "spool-inline", inline)
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
    print(
        f"\n/api/ingest, {args.batches:,}-event batches x 3 keys, 2 senders (medians over trials):"
    )

    def line(label: str, values: list[float]) -> None:
        trials = ", ".join(f"{x:,.0f}" for x in values)
        print(f"  {label}: {med(values):9,.0f} points/s  (trials: {trials})")

    line("decoded in a decoding process (default)", ingests)
    line("decoded in the server process          ", inlines)
    line("store's bulk write, no HTTP (the floor) ", floors)
    print(f"  ratio to the floor: {med(ingests) / med(floors):.2f};"
          f" decoding process vs in-server: {med(ingests) / med(inlines):.2f}x")  # fmt: skip
    print(f"\ninstantml sync drain of {args.sync_events:,} events:")
    print(f"  decoded in a decoding process (default): {synced:9,.0f} events/s")
    print(f"  decoded in the server process          : {synced_inline:9,.0f} events/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
