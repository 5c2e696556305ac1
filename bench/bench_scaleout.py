"""The scale-out stores next to the embedded one, in one run, and ingest from 1 to 2
server processes.

    .venv/bin/python bench/bench_scaleout.py [--seconds 3] [--trials 3] [--events 100000]
                                              [--steps 10000]

Per configuration, a real server on loopback: DuckDB (the embedded default), PostgreSQL +
chdb (ClickHouse's engine in the server process), and PostgreSQL + ClickHouse over HTTP
(tests/clickhouse_http.py: chdb behind ClickHouse's HTTP protocol, one statement at a time,
so a stand-in for a ClickHouse server, slower than one). Medians over trials of:
  1. POST /api/ingest, 1,000-event batches x 3 keys, 2 senders: rank points/s;
  2. ``instantml sync`` draining a spool of --events events (8 ranks): events/s;
  3. single-event POST /runs/{id}/rank-metrics with 64 concurrent clients: requests/s;
  4. the default Distributed summary of 512 ranks x --steps steps (loaded through the
     stores, as bench_summary.py --load store does): warm median ms.
Then ingest (1) through PostgreSQL + ClickHouse over HTTP with ``--workers 1`` and
``--workers 2``, 4 senders. PostgreSQL is a throwaway cluster (tests/postgres.py). The load
generator, the servers, PostgreSQL and the endpoint share this machine's cores.

``--before DIR`` (a checkout of an earlier commit) measures PostgreSQL + chdb only, for
this tree and that one alternated ``--rounds`` times, each first in every other round (the
servers run from each tree's
``src``; the stores are loaded by this tree's code, so the trees must share their
format), and prints each tree's medians and the ratios this / before.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))  # tests/: the engines' fixtures
from tests.clickhouse_http import Endpoint
from tests.postgres import Cluster

from bench_ingest import _new_run, ingest_batches, single_requests
from bench_spool import drain, fill_spool
from bench_summary import RUN, load_store
from instantml.server.process import ServerProcess


def _summary_ms(server: ServerProcess, repeats: int) -> float:
    headers = {"Authorization": f"Bearer {server.admin_key}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=600) as http:
        http.get(f"/api/runs/{RUN}/distributed").raise_for_status()  # aggregates up to date
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            http.get(f"/api/runs/{RUN}/distributed").raise_for_status()
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def measure(
    name: str,
    stores: Callable[[Path], dict[str, str]],
    args: argparse.Namespace,
    src: Path | None = None,
) -> dict[str, float]:
    med = statistics.median
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        env = stores(Path(tmp))
        started = time.perf_counter()
        load_store(data, args.steps, env=env)
        load_s = time.perf_counter() - started
        tree = {"PYTHONPATH": str(src)} if src is not None else {}
        with ServerProcess(data, env={"HOME": tmp, **env, **tree}) as server:
            key = server.admin_key
            api = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {key}"})
            summary = _summary_ms(server, args.repeats)
            ingest, singles, syncs = [], [], []
            for trial in range(args.trials):
                ingest.append(
                    asyncio.run(ingest_batches(server.url, key, _new_run(api), args.seconds))
                )
                singles.append(
                    asyncio.run(single_requests(server.url, key, _new_run(api), args.seconds, 64))
                )
                spool = Path(tmp) / f"spool{trial}"
                fill_spool(spool, args.events, f"sync-{trial}")
                syncs.append(drain(spool, server)[1])
            api.close()
    row = {
        "ingest_points": med(ingest) * 3,
        "sync_events": med(syncs),
        "singles_64": med(singles),
        "summary_ms": summary,
        "load_s": load_s,
    }
    print(
        f"{name:<28} ingest {row['ingest_points']:>9,.0f} points/s | sync {row['sync_events']:>7,.0f}"
        f" events/s | 64 clients {row['singles_64']:>5,.0f} POSTs/s | summary 512x{args.steps:,}"
        f" {row['summary_ms']:>6.1f} ms (stores loaded in {load_s:.0f} s)",
        flush=True,
    )
    return row


def processes(env: dict[str, str], workers: int, args: argparse.Namespace, tmp: Path) -> float:
    data = tmp / "data"  # the admin key is in the first one's data dir
    with ServerProcess(data, env={"HOME": str(tmp), "INSTANTML_WORKERS": str(workers), **env}) as s:
        key = s.admin_key
        with httpx.Client(base_url=s.url, headers={"Authorization": f"Bearer {key}"}) as api:
            rates = [
                asyncio.run(ingest_batches(s.url, key, _new_run(api), args.seconds, senders=4))
                for _ in range(args.trials)
            ]
    return statistics.median(rates) * 3


def ab(cluster: Cluster, args: argparse.Namespace) -> int:
    trees = {"before": args.before.resolve() / "src", "this": Path(__file__).parent.parent / "src"}
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for round_ in range(args.rounds):
        # Each tree goes first in every other round: the second of a pair measured lower
        # (the machine warmer, or busier) often enough to read as a difference of code.
        order = list(trees.items())
        for name, src in order if round_ % 2 == 0 else order[::-1]:
            rows[name].append(
                measure(
                    f"{name}: PostgreSQL + chdb",
                    lambda tmp: {
                        "INSTANTML_METADATA_URL": cluster.new_database(),
                        "INSTANTML_POINTS_URL": f"chdb://{tmp / 'points'}",
                    },
                    args,
                    src,
                )
            )
    med = {
        name: {k: statistics.median(r[k] for r in found) for k in found[0]}
        for name, found in rows.items()
    }
    print(f"\nmedians over {args.rounds} alternated rounds (this / before):")
    for key, unit in (("ingest_points", "points/s"), ("sync_events", "events/s"),
                      ("singles_64", "POSTs/s"), ("summary_ms", "ms")):  # fmt: skip
        before, this = med["before"][key], med["this"][key]
        print(f"  {key:<14} before {before:>10,.1f}  this {this:>10,.1f} {unit:<9}"
              f" this/before {this / before:.2f}")  # fmt: skip
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--before", type=Path, help="an older checkout: A/B on PostgreSQL + chdb")
    parser.add_argument("--rounds", type=int, default=2, help="A/B rounds (with --before)")
    args = parser.parse_args()
    print(f"cores: {os.cpu_count()}; medians over {args.trials} trials of {args.seconds:g} s")
    cluster = Cluster()
    if args.before is not None:
        try:
            return ab(cluster, args)
        finally:
            cluster.stop()
    endpoint = Endpoint(Path(tempfile.mkdtemp()) / "clickhouse")
    try:
        rows = {
            "duckdb": measure("DuckDB (embedded)", lambda tmp: {}, args),
            "postgres+chdb": measure(
                "PostgreSQL + chdb",
                lambda tmp: {
                    "INSTANTML_METADATA_URL": cluster.new_database(),
                    "INSTANTML_POINTS_URL": f"chdb://{tmp / 'points'}",
                },
                args,
            ),
            "postgres+clickhouse": measure(
                "PostgreSQL + ClickHouse/HTTP",
                lambda tmp: {
                    "INSTANTML_METADATA_URL": cluster.new_database(),
                    "INSTANTML_POINTS_URL": endpoint.url(),
                },
                args,
            ),
        }
        base = rows["duckdb"]
        for name in ("postgres+chdb", "postgres+clickhouse"):
            row = rows[name]
            print(
                f"  {name} / duckdb: ingest {row['ingest_points'] / base['ingest_points']:.2f}x,"
                f" sync {row['sync_events'] / base['sync_events']:.2f}x, 64 clients"
                f" {row['singles_64'] / base['singles_64']:.2f}x, summary"
                f" {row['summary_ms'] / base['summary_ms']:.2f}x the time"
            )
        with tempfile.TemporaryDirectory() as tmp:
            env = {
                "INSTANTML_METADATA_URL": cluster.new_database(),
                "INSTANTML_POINTS_URL": endpoint.url(),
            }
            one = processes(env, 1, args, Path(tmp))
            two = processes(env, 2, args, Path(tmp))
        print(
            f"ingest, PostgreSQL + ClickHouse/HTTP, 4 senders: 1 process {one:,.0f} points/s,"
            f" 2 processes {two:,.0f} points/s ({two / one:.2f}x) on {os.cpu_count()} cores"
        )
    finally:
        endpoint.stop()
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
