"""What run health costs ingest, and how soon an alert reaches a webhook under load.

    .venv/bin/python bench/bench_health.py [--trials 5] [--batches 6] [--probes 5]

1. ``/api/ingest`` points/s (10,000-event batches of 3 keys, one a timing key, 512 ranks,
   2 senders) against two servers side by side: detectors on (the default) and off
   (``INSTANTML_HEALTH={"enabled": false}``), alternated, medians. Target: on costs <= 10%.
2. Alert latency: while 2 senders keep ingesting 10,000-event batches into another run,
   a probe run of 8 ranks (its ``lag_seconds`` set to ``--lag``) loses rank 3; from the
   moment the server acknowledged rank 3's last points to the webhook's POST arriving at
   a receiver on loopback. ``rank_missing`` needs the rank quiet ``lag_seconds`` (and
   outpaced by 3 steps, which the other ranks' next batch makes it): target <= lag + 2 s.

The load generator shares this machine's cores with the server.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from instantml.server.process import ServerProcess

sys.path.insert(0, str(Path(__file__).parent))
from bench_write_path import ingest, new_run


class Receiver:
    """Arrival time of each posted alert, by its run."""

    def __init__(self) -> None:
        self.arrived: dict[str, float] = {}
        self.event = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                receiver.arrived.setdefault(body["run"]["id"], time.perf_counter())
                receiver.event.set()
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def probe(http: httpx.Client, server: ServerProcess, receiver: Receiver, lag: float) -> float:
    """Seconds from rank 3's last acknowledged points to its webhook post."""
    run_id = new_run(server)
    health = [{"path": "health/lag_seconds", "type": "health", "value": lag}]
    http.post(f"/api/runs/{run_id}/attributes", json={"attributes": health}).raise_for_status()
    acknowledged = 0.0
    for step in range(13):
        events = [
            {"event_id": f"{run_id}-{step}-{rank}", "request": {"method": "POST",
             "path": f"/runs/{run_id}/rank-metrics",
             "body": {"metrics": {"loss": 1.0}, "step": step, "rank": rank, "world_size": 8}}}
            for rank in range(8) if rank != 3 or step < 10
        ]  # fmt: skip
        http.post("/api/ingest", json={"events": events}).raise_for_status()
        if step == 9:
            acknowledged = time.perf_counter()
    deadline = time.monotonic() + 60
    while run_id not in receiver.arrived:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no alert for {run_id} within 60 s")
        receiver.event.wait(0.05)
        receiver.event.clear()
    return receiver.arrived[run_id] - acknowledged


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--batches", type=int, default=6, help="10,000-event batches a trial")
    parser.add_argument("--probes", type=int, default=5)
    parser.add_argument("--lag", type=float, default=2.0, help="the probe runs' lag_seconds")
    args = parser.parse_args()
    print(f"cores: {os.cpu_count()}")
    receiver = Receiver()
    with tempfile.TemporaryDirectory() as tmp:
        off_env = {"HOME": tmp, "INSTANTML_HEALTH": '{"enabled": false}'}
        with (
            ServerProcess(Path(tmp) / "on", env={"HOME": tmp}) as on,
            ServerProcess(Path(tmp) / "off", env=off_env) as off,
        ):
            for server in (on, off):  # start the decoding processes: one untimed batch
                ingest(server.url, server.admin_key, new_run(server), 10_000, 1, 1)
            time.sleep(2)
            ons, offs = [], []
            for _ in range(args.trials):
                ons.append(ingest(on.url, on.admin_key, new_run(on), 10_000, args.batches))
                offs.append(ingest(off.url, off.admin_key, new_run(off), 10_000, args.batches))

            headers = {"Authorization": f"Bearer {on.admin_key}"}
            with httpx.Client(base_url=on.url, headers=headers, timeout=60) as http:
                http.post("/api/webhooks", json={"url": receiver.url}).raise_for_status()
                stop = threading.Event()

                def load() -> None:
                    while not stop.is_set():
                        ingest(on.url, on.admin_key, new_run(on), 10_000, 2)

                loader = threading.Thread(target=load)
                loader.start()
                time.sleep(1)
                try:
                    latencies = [probe(http, on, receiver, args.lag) for _ in range(args.probes)]
                finally:
                    stop.set()
                    loader.join()
    med = statistics.median
    print("\n/api/ingest, 10,000-event batches x 3 keys (one perf/*_ms), 512 ranks, 2 senders:")
    print(
        f"  detectors on : {med(ons):9,.0f} points/s  (trials: {', '.join(f'{x:,.0f}' for x in ons)})"
    )
    print(
        f"  detectors off: {med(offs):9,.0f} points/s  (trials: {', '.join(f'{x:,.0f}' for x in offs)})"
    )
    print(f"  cost of the detectors: {1 - med(ons) / med(offs):+.1%} (target <= 10%)")
    print(
        f"\nalert latency under ingest load, {args.probes} probes (rank's last acknowledged"
        f" points -> webhook POST, lag_seconds {args.lag:g}):"
    )
    print(f"  median {med(latencies):.2f} s, max {max(latencies):.2f} s"
          f" ({', '.join(f'{x:.2f}' for x in latencies)}; target <= {args.lag + 2:g} s)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
