"""What the monthly guardrail and the Idempotency-Key checks cost on the ingest path.

    .venv/bin/python bench/bench_guardrail.py [--events 100000] [--trials 3]

1. Over HTTP: rank points/s through POST /api/ingest (1,000-event batches, 3 keys each) on
   a server with a monthly limit (the guardrail checks every event) and on one without
   (unlimited: no check), side by side. Every ingest event carries its Idempotency-Key, as
   the contract requires, so this part cannot switch the idempotency check off.
2. In the write service over the stores (the same engine and write path, no HTTP): groups of 1,000 rank
   writes with and without Idempotency-Keys, and with and without a limit.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from instantml.server.process import ServerProcess
from instantml.server.write.commands import CreateRun, Envelope, Idempotency, WriteRankPoints
from instantml.server.write.guardrail import UsagePolicy
from instantml.server.write.service import WriteService
from instantml.storage import open_stores

METRICS = {"train/loss": 0.5, "optimizer/grad_norm": 2.5, "perf/step_ms": 31.0}


async def http_rate(server: ServerProcess, events: int) -> float:
    headers = {"Authorization": f"Bearer {server.admin_key}"}
    async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=300) as http:
        run = f"g-{time.time_ns()}"
        (await http.post("/runs", json={"project": "bench", "id": run})).raise_for_status()
        batches = [
            [
                {
                    "event_id": f"{run}-{b}-{i}",
                    "request": {
                        "method": "POST",
                        "path": f"/runs/{run}/rank-metrics",
                        "body": {
                            "metrics": METRICS,
                            "step": (b * 1000 + i) // 512,
                            "rank": (b * 1000 + i) % 512,
                            "world_size": 512,
                        },
                    },
                }
                for i in range(1000)
            ]
            for b in range(events // 1000)
        ]
        start = time.perf_counter()
        queue = list(batches)

        async def sender() -> None:
            while queue:
                (await http.post("/api/ingest", json={"events": queue.pop()})).raise_for_status()

        await asyncio.gather(sender(), sender())
        return events * len(METRICS) / (time.perf_counter() - start)


def _key(n: int) -> tuple[int, int]:
    # As the server makes them: a 128-bit BLAKE2b digest of the key, as two signed halves.
    digest = hashlib.blake2b(str(n).encode(), digest_size=16).digest()
    return int.from_bytes(digest[:8], "big", signed=True), int.from_bytes(
        digest[8:], "big", signed=True
    )


def store_rate(tmp: Path, events: int, idempotency: bool, limit: int | None) -> float:
    stores = open_stores(f"duckdb://{tmp / f's-{time.time_ns()}.duckdb'}")
    service = WriteService(stores, UsagePolicy(default_limit=limit))
    org, _ = stores.tenancy.ensure_org("o")
    service.apply([Envelope(CreateRun(org, "r", "p", None, {}, [], {}))])
    groups = [
        [
            Envelope(
                WriteRankPoints(
                    org,
                    "r",
                    (g * 1000 + i) // 512,
                    (g * 1000 + i) % 512,
                    512,
                    None,
                    1.0,
                    METRICS,
                    0.0,
                ),
                Idempotency(*_key(g * 1000 + i), 1) if idempotency else None,
            )
            for i in range(1000)
        ]
        for g in range(events // 1000)
    ]
    start = time.perf_counter()
    for group in groups:
        service.apply(group)
    elapsed = time.perf_counter() - start
    stores.close()
    return events * len(METRICS) / elapsed


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    med = statistics.median
    with tempfile.TemporaryDirectory() as tmp:
        limited = ServerProcess(
            Path(tmp) / "a", env={"HOME": tmp, "INSTANTML_MONTHLY_METRIC_POINTS": str(10**12)}
        ).start()
        unlimited = ServerProcess(Path(tmp) / "b", env={"HOME": tmp}).start()
        try:
            on, off = [], []
            for _ in range(args.trials):
                on.append(asyncio.run(http_rate(limited, args.events)))
                off.append(asyncio.run(http_rate(unlimited, args.events)))
        finally:
            limited.stop()
            unlimited.stop()
        print(f"POST /api/ingest, {args.events:,} events x 3 keys, median of {args.trials} trials:")
        print(f"  guardrail on : {med(on):10,.0f} rank points/s")
        print(
            f"  guardrail off: {med(off):10,.0f} rank points/s   (cost {100 * (1 - med(on) / med(off)):+.1f} %)"
        )
        results = {}
        for idem in (True, False):
            for limit in (10**12, None):
                results[(idem, limit)] = med(
                    store_rate(Path(tmp), args.events, idem, limit) for _ in range(args.trials)
                )
        both, neither = results[(True, 10**12)], results[(False, None)]
        print("In the store, groups of 1,000 writes:")
        for (idem, limit), rate in results.items():
            label = f"idempotency {'on ' if idem else 'off'}, guardrail {'on ' if limit else 'off'}"
            print(f"  {label}: {rate:10,.0f} rank points/s")
        print(f"  both checks cost {100 * (1 - both / neither):.1f} % (target < 20 %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
