"""The write path against its floors, side by side in one run.

    .venv/bin/python bench/bench_write_path.py [--seconds 4] [--trials 3] [--batch 10000]
        [--batches 8] [--sync-events 200000] [--parts singles,ingest,stores,sync]
        [--server-src DIR]

1. **Single events**: ``POST /runs/{id}/rank-metrics`` (3 keys, as the public SDK's sync
   mode and async uploader send them) from 64 raw keep-alive clients (``http.client``,
   4 processes x 16 threads, one connection each), against
   - a bare uvicorn + Starlette endpoint on the same uvicorn that reads and parses the
     JSON body (the floor any server on this stack has), and
   - a null endpoint (asyncio, answers each request without parsing it), whose rate is
     the client's own limit: a ratio to the bare endpoint means something only while
     the client drives the null endpoint far faster than this server.
   Trials alternated; requests/s, p50 and p99 latency, medians over trials.
2. **Batches**: ``POST /api/ingest`` with --batch-event batches of 1 and of 3 keys from
   one sender with two batches in flight (as the uploader pipelines): events/s and
   points/s, against the floor: the store's own bulk write of the same points and
   answers, in this process, one unit per batch, no HTTP.
3. **Per process on the scale-out stores**: the same ingest (3 keys) and an
   ``instantml sync`` drain of --sync-events events on PostgreSQL + chdb next to the
   embedded store: each ratio to the embedded store's; and the CPU an event of the
   server's processes, PostgreSQL's and the client (from /proc, Linux), with the cores
   that 0.8 of the embedded store's rate would take at that cost.
4. **Sync drain**: ``instantml sync`` draining --sync-events events (8 ranks' spool
   segments) into the embedded server: events/s as it reports.

``--server-src DIR`` runs the servers from another checkout's ``src`` (a before/after
of the server; the floors and clients stay this tree's). The load generator shares the
machine's cores with the server: figures are for both.
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing
import os
import resource
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
from typing import Any

import httpx
import numpy as np
import orjson

from instantml.server.process import ServerProcess, free_port
from instantml.server.write.commands import Envelope
from instantml.server.write.service import WriteService
from instantml.storage import open_stores
from instantml.storage.records import RANK, Keys, RunSpec

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))  # tests/: the PostgreSQL cluster
from bench_spool import drain, fill_spool, pct

PROCESSES, THREADS = 4, 16
METRICS = ("train/loss", "optimizer/grad_norm", "perf/step_ms")

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

# Answers every request on a keep-alive connection without parsing more than its length.
NULL_APP = textwrap.dedent(
    """
    import asyncio, sys
    import uvloop

    ANSWER = (b"HTTP/1.1 200 OK\\r\\ncontent-type: application/json\\r\\n"
              b"content-length: 14\\r\\n\\r\\n{\\"accepted\\":3}")

    class Null(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport, self.buffer = transport, b""

        def data_received(self, data):
            self.buffer += data
            while (end := self.buffer.find(b"\\r\\n\\r\\n")) >= 0:
                head = self.buffer[:end].lower()
                at = head.find(b"content-length:")
                size = int(head[at + 15:].split(b"\\r\\n", 1)[0]) if at >= 0 else 0
                if len(self.buffer) < end + 4 + size:
                    return
                self.buffer = self.buffer[end + 4 + size:]
                self.transport.write(ANSWER)

    async def main():
        server = await asyncio.get_running_loop().create_server(Null, "127.0.0.1", int(sys.argv[1]))
        await server.serve_forever()

    uvloop.run(main())
    """
)


def body(step: int, rank: int, keys: int = 3) -> dict[str, Any]:
    metrics = {"train/loss": 1.0 / (step + 1), "optimizer/grad_norm": 2.5, "perf/step_ms": 31.0}
    return {
        "metrics": dict(list(metrics.items())[:keys]),
        "step": step, "rank": rank, "world_size": 512, "local_rank": rank % 8, "weight": 1024,
    }  # fmt: skip


def _connect(url: str) -> http.client.HTTPConnection:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    conn.connect()
    assert conn.sock is not None
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def _post(conn: http.client.HTTPConnection, path: str, payload: bytes, headers: dict) -> bytes:
    conn.request("POST", path, body=payload, headers=headers)
    response = conn.getresponse()
    answer = response.read()
    if response.status != 200:
        raise RuntimeError(f"{path}: {response.status} {answer[:200]!r}")
    return answer


def _client_process(
    url: str, key: str, run_id: str, start_at: float, seconds: float, first: int, out: Any
) -> None:
    path = f"/runs/{run_id}/rank-metrics"
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    end_at = start_at + seconds
    latencies: list[float] = []
    lock = threading.Lock()

    def client(rank: int) -> None:
        mine: list[float] = []
        conn = _connect(url)
        time.sleep(max(0.0, start_at - time.time()))
        step = 0
        while time.time() < end_at:
            payload = orjson.dumps(body(step, rank))
            began = time.perf_counter()
            _post(conn, path, payload, headers)
            if time.time() <= end_at:
                mine.append(time.perf_counter() - began)
            step += 1
        conn.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client, args=(first + t,)) for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.put(latencies)


def single_posts(url: str, key: str, run_id: str, seconds: float) -> tuple[float, float, float]:
    """(requests/s, p50 ms, p99 ms) of 64 raw keep-alive clients, counted over the same
    wall-clock window in every process (their start-up outside it)."""
    queue: multiprocessing.Queue[list[float]] = multiprocessing.Queue()
    start_at = time.time() + 1.0
    procs = [
        multiprocessing.Process(
            target=_client_process,
            args=(url, key, run_id, start_at, seconds, p * THREADS, queue),
        )
        for p in range(PROCESSES)
    ]
    for p in procs:
        p.start()
    latencies = [x for _ in procs for x in queue.get()]
    for p in procs:
        p.join()
    return len(latencies) / seconds, pct(latencies, 0.5) * 1000, pct(latencies, 0.99) * 1000


class Endpoint:
    """A comparison endpoint in its own process: the bare uvicorn app or the null one."""

    def __init__(self, tmp: Path, kind: str) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        if kind == "bare":
            (tmp / "bare_app.py").write_text(BARE_APP)
            argv = ["-m", "uvicorn", "bare_app:app", "--port", str(port), "--log-level", "warning"]
        else:
            (tmp / "null_app.py").write_text(NULL_APP)
            argv = ["null_app.py", str(port)]
        self.proc = subprocess.Popen([sys.executable, *argv], cwd=tmp)
        for _ in range(200):
            try:
                httpx.post(f"{self.url}/runs/x/rank-metrics", content=b"{}")
                return
            except httpx.HTTPError:
                time.sleep(0.05)
        raise RuntimeError(f"the {kind} endpoint did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()


def batches_of(run_id: str, batch: int, batches: int, keys: int) -> list[bytes]:
    path = f"/runs/{run_id}/rank-metrics"
    payloads = []
    for b in range(batches):
        events = [
            {"event_id": f"{run_id}-{n}", "request": {"method": "POST", "path": path,
             "body": body(n // 512, n % 512, keys)}}
            for n in range(b * batch, (b + 1) * batch)
        ]  # fmt: skip
        payloads.append(orjson.dumps({"events": events}))
    return payloads


def ingest(url: str, key: str, payloads: list[bytes], in_flight: int = 2) -> float:
    """Seconds to send ``payloads`` through /api/ingest with ``in_flight`` batches at once
    from one sender (each on its own keep-alive connection, as the uploader pipelines);
    the batches are built before the clock starts."""
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    conns = [_connect(url) for _ in range(in_flight)]

    def send(conn: http.client.HTTPConnection, mine: list[bytes]) -> None:
        for payload in mine:
            _post(conn, "/api/ingest", payload, headers)

    start = time.perf_counter()
    threads = [
        threading.Thread(target=send, args=(conn, payloads[i::in_flight]))
        for i, conn in enumerate(conns)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    for conn in conns:
        conn.close()
    return elapsed


def new_run(server: ServerProcess) -> str:
    run_id = f"bench-{uuid.uuid4().hex[:10]}"
    httpx.post(f"{server.url}/runs", json={"project": "bench", "id": run_id},
               headers={"Authorization": f"Bearer {server.admin_key}"}).raise_for_status()  # fmt: skip
    return run_id


def store_floor(path: Path, batch: int, batches: int, keys: int) -> float:
    """Events/s of the embedded store's own bulk write of the same batches, in this
    process: the points of ``keys`` keys, the run's extent and one stored answer per
    event, one unit (one COMMIT) per batch, columns built before the clock starts. What
    /api/ingest costs on top of this is HTTP, decoding, checking, hashing and deciding."""
    stores = open_stores(f"duckdb://{path}")
    try:
        org, _ = stores.tenancy.ensure_org("bench")
        WriteService(stores).apply([Envelope(RunSpec(org, "floor", "bench", None, {}, [], {}))])
        run = stores.runs.resolve(org, ["floor"])["floor"]
        assert run is not None
        with stores.unit():
            sids = stores.runs.series_ids(run, RANK, list(METRICS[:keys]))
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
            hashes = rng.integers(-(2**62), 2**62, size=(3, batch))
            # Each rank a writer's keys "<prefix>-<n>", n its step + 1, as the spool names them.
            sequence = (writers[n % 512], n // 512 + 1)
            prepared.append((columns, hashes, sequence, int(n[-1] // 512)))
        start = time.perf_counter()
        for columns, hashes, sequence, last in prepared:
            with stores.unit():
                for sid in sids:
                    stores.points.write_rank(sid, dict(columns, value=rng.random(batch)))
                stores.runs.extend({run.seq: (512, last)})
                stores.ledger.record(
                    Keys(np.full(batch, org), hashes[0], hashes[1], *sequence), hashes[2],
                    np.full(batch, 200, np.int16), ['{"accepted":3}'] * batch, time.time(),
                )  # fmt: skip
        return batches * batch / (time.perf_counter() - start)
    finally:
        stores.close()


def _ingest_rate(server: ServerProcess, args: argparse.Namespace, keys: int) -> float:
    payloads = batches_of(new_run(server), args.batch, args.batches, keys)
    return args.batch * args.batches / ingest(server.url, server.admin_key, payloads)


def _warm(server: ServerProcess, args: argparse.Namespace) -> None:
    """The first large batch starts the decoding process: one untimed batch."""
    ingest(server.url, server.admin_key, batches_of(new_run(server), args.batch, 1, 3), 1)
    time.sleep(1)


def part_singles(args: argparse.Namespace, tmp: Path, env: dict[str, str]) -> None:
    null, bare = Endpoint(tmp, "null"), Endpoint(tmp, "bare")
    rows: dict[str, list[tuple[float, float, float]]] = {"ours": [], "bare": [], "null": []}
    try:
        with ServerProcess(tmp / "singles", env=env) as server:
            for _ in range(args.trials):
                rows["ours"].append(
                    single_posts(server.url, server.admin_key, new_run(server), args.seconds)
                )
                rows["bare"].append(single_posts(bare.url, "none", "x", args.seconds))
                rows["null"].append(single_posts(null.url, "none", "x", args.seconds))
    finally:
        null.stop()
        bare.stop()
    med = statistics.median
    rate = {name: med(r[0] for r in found) for name, found in rows.items()}
    print(
        f"\nsingle-event POSTs, {PROCESSES * THREADS} raw keep-alive clients, medians of {args.trials}:"
    )
    for name, label in (("ours", "this server   "), ("bare", "bare endpoint "),
                        ("null", "null endpoint ")):  # fmt: skip
        found = rows[name]
        trials = ", ".join(f"{r[0]:,.0f}" for r in found)
        print(f"  {label}: {rate[name]:8,.0f} req/s  p50 {med(r[1] for r in found):6.1f} ms"
              f"  p99 {med(r[2] for r in found):6.1f} ms  (trials: {trials})")  # fmt: skip
    print(f"  this server / bare endpoint: {rate['ours'] / rate['bare']:.3f};"
          f" client limit (null endpoint) / this server: {rate['null'] / rate['ours']:.1f}x")  # fmt: skip


def part_ingest(args: argparse.Namespace, tmp: Path, env: dict[str, str]) -> None:
    med = statistics.median
    rates: dict[int, list[float]] = {1: [], 3: []}
    floors: dict[int, list[float]] = {1: [], 3: []}
    with ServerProcess(tmp / "ingest", env=env) as server:
        _warm(server, args)
        for trial in range(args.trials):
            for keys in (1, 3):
                rates[keys].append(_ingest_rate(server, args, keys))
                floors[keys].append(
                    store_floor(tmp / f"floor{keys}-{trial}.duckdb", args.batch, args.batches, keys)
                )
    print(f"\n/api/ingest, {args.batch:,}-event batches, one sender with 2 in flight,"
          f" medians of {args.trials}:")  # fmt: skip
    for keys in (1, 3):
        ours, floor = med(rates[keys]), med(floors[keys])
        trials = ", ".join(f"{x:,.0f}" for x in rates[keys])
        print(f"  {keys} key{'s' if keys > 1 else ' '}: {ours:9,.0f} events/s ({ours * keys:9,.0f}"
              f" points/s; trials {trials}) | store's bulk write {floor:9,.0f} events/s"
              f" | ratio {ours / floor:.2f}")  # fmt: skip


def tree_cpu(root: int | None) -> float:
    """CPU seconds (user + system) that the live processes of the tree under ``root`` have
    used, from /proc (Linux; 0 elsewhere)."""
    if root is None or not Path("/proc/self/stat").exists():
        return 0.0
    parents, used = {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone since listed
            continue
        pid = int(stat.parent.name)
        parents[pid] = int(fields[1])
        used[pid] = int(fields[11]) + int(fields[12])  # utime, stime (ticks)
    tree, grew = {root}, True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= more
        grew = bool(more)
    return sum(used.get(pid, 0) for pid in tree) / os.sysconf("SC_CLK_TCK")


class Cpu:
    """CPU seconds of the server's processes, PostgreSQL's and the client (this process and
    the commands it waited for), over a ``with`` block."""

    def __init__(self, server: ServerProcess, postgres: int | None) -> None:
        self.roots = {"server": server.proc.pid, "PostgreSQL": postgres}
        self.used: dict[str, float] = {}

    def _now(self) -> dict[str, float]:
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        now = {name: tree_cpu(pid) for name, pid in self.roots.items()}
        now["client"] = time.process_time() + children.ru_utime + children.ru_stime
        return now

    def __enter__(self) -> Cpu:
        self._start = self._now()
        return self

    def __exit__(self, *_: object) -> None:
        end = self._now()
        for name, value in end.items():
            self.used[name] = self.used.get(name, 0.0) + value - self._start[name]


def part_stores(args: argparse.Namespace, tmp: Path, env: dict[str, str]) -> None:
    from tests.postgres import Cluster

    med = statistics.median
    cluster = Cluster()
    postmaster = int((cluster.data / "postmaster.pid").read_text().split()[0])
    try:
        configs = {
            "embedded (DuckDB)": {},
            "PostgreSQL + chdb": {
                "INSTANTML_METADATA_URL": cluster.new_database(),
                "INSTANTML_POINTS_URL": f"chdb://{tmp / 'points'}",
            },
        }
        rows, cpu = {}, {}
        for name, stores in configs.items():
            data = tmp / f"stores-{len(rows)}"
            with ServerProcess(data, env={**env, **stores}) as server:
                _warm(server, args)
                ingests, syncs = [], []
                spent = {"ingest": Cpu(server, postmaster), "sync": Cpu(server, postmaster)}
                for trial in range(args.trials):
                    with spent["ingest"]:
                        ingests.append(_ingest_rate(server, args, 3))
                    spool = data.parent / f"spool-{len(rows)}-{trial}"
                    fill_spool(spool, args.sync_events, new_run(server))
                    with spent["sync"]:
                        syncs.append(drain(spool, server)[1])
            rows[name] = (med(ingests), med(syncs))
            cpu[name] = {
                what: {k: v / (args.trials * events) for k, v in c.used.items()}
                for what, c, events in (
                    ("ingest", spent["ingest"], args.batch * args.batches),
                    ("sync", spent["sync"], args.sync_events),
                )
            }
    finally:
        cluster.stop()
    print(f"\nper process, PostgreSQL + chdb against the embedded store, medians of {args.trials}:")
    for name, (ingested, synced) in rows.items():
        print(
            f"  {name:<18}: ingest {ingested:9,.0f} events/s (3 keys) | sync {synced:9,.0f} events/s"
        )
    (a, b), (c, d) = rows.values()
    print(f"  ratio: ingest {c / a:.2f}, sync {d / b:.2f}")
    # What 0.8 of the embedded store's rate would take in CPU at these costs an event: the
    # floor a faster pipeline cannot go under without less CPU an event.
    print("  CPU an event (µs: server processes + PostgreSQL + client) and the cores that")
    print("  0.8 of the embedded store's rate would take at that cost:")
    for what, embedded_rate in (("ingest", a), ("sync", b)):
        for name in rows:
            used = cpu[name][what]
            total = sum(used.values())
            parts = " + ".join(f"{used[k] * 1e6:.1f}" for k in ("server", "PostgreSQL", "client"))
            print(
                f"    {what:<6} {name:<18}: {parts} = {total * 1e6:6.1f} µs"
                f" -> {total * 0.8 * embedded_rate:4.2f} cores (this machine: {os.cpu_count()})"
            )


def part_sync(args: argparse.Namespace, tmp: Path, env: dict[str, str]) -> None:
    rates = []
    with ServerProcess(tmp / "sync", env=env) as server:
        for trial in range(args.trials):
            spool = tmp / f"spool-sync-{trial}"
            fill_spool(spool, args.sync_events, new_run(server))
            rates.append(drain(spool, server)[1])
    trials = ", ".join(f"{x:,.0f}" for x in rates)
    print(f"\ninstantml sync drain of {args.sync_events:,} events (8 ranks' segments):"
          f" {statistics.median(rates):,.0f} events/s (trials: {trials})")  # fmt: skip


PARTS = {"singles": part_singles, "ingest": part_ingest, "stores": part_stores, "sync": part_sync}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--batch", type=int, default=10_000, help="events per /api/ingest batch")
    parser.add_argument("--batches", type=int, default=8, help="batches per ingest trial")
    parser.add_argument("--sync-events", type=int, default=200_000)
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--server-src", type=Path, help="run the servers from this checkout's src")
    args = parser.parse_args()
    print(f"cores: {os.cpu_count()}; servers from {args.server_src or 'this tree'}")
    with tempfile.TemporaryDirectory() as tmp_name:
        # No per-key request rate: 64 clients on one key pass the default's 2,000 a second.
        env = {"HOME": tmp_name, "INSTANTML_RATE_LIMIT": "0"}
        if args.server_src is not None:
            env["PYTHONPATH"] = str(args.server_src.resolve())
        for part in args.parts.split(","):
            PARTS[part](args, Path(tmp_name), env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
