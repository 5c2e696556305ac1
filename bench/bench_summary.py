"""The Distributed summary on a 512-rank run: latency, memory, baselines, growth.

    .venv/bin/python bench/bench_summary.py [--steps 10000] [--growth 1000,10000,50000]
                                             [--load ingest|store] [--repeats 15]

For each run size it builds a run of 512 ranks x N steps x 1 key (a slow rank, a noisy rank,
a rank that stops at 60%, spikes on one shard), starts a real server on it and measures,
warm, median over --repeats (``--keys K``: the run logs K-1 more keys beside it, written in
the same units, as a run that logs several keys a step does; the summary is still of the
first):
  * the default summary (max_points=500, heatmap_steps=200), over HTTP;
  * a zoom into 1,000 steps, over HTTP;
  * the server's RSS while answering;
and, side by side on the same data: (a) loading the points into numpy and computing the same
summary there (the tests' reference definitions, vectorised), (b) one plain SQL
``GROUP BY step`` with the per-step reducers from raw points in DuckDB.

``--load ingest`` sends the points through POST /api/ingest (1,000-event batches, as the
SDK would); ``--load store`` writes them straight through the stores before the server
starts (same tables, same stale marks; used for the growth series, where ingesting 25M
points through HTTP would take most of an hour).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import duckdb
import httpx
import numpy as np

from instantml.server.bootstrap import bootstrap
from instantml.server.process import ServerProcess
from instantml.server.write.commands import CreateRun, Envelope
from instantml.server.write.service import WriteService
from instantml.settings import ServerSettings
from instantml.storage import open_stores
from instantml.storage.protocols import Stores
from instantml.storage.records import RANK

RANKS = 512
RUN = "bench-512"
KEY = "train/loss"


def value(step: int, rng: np.random.Generator) -> np.ndarray:
    """Every rank's value at a step: a decaying loss; rank 7 slower (+0.3), rank 11 noisy,
    shard 42 spiking every 97 steps (rank 300's stop is applied by the callers)."""
    r = np.arange(RANKS)
    noise = rng.uniform(-0.5, 0.5, RANKS)
    out = 2.0 / (1 + step / 1000) + (r % 13) * 0.001 + np.where(r == 7, 0.3, 0.0)
    out += np.where(r == 11, noise, noise * 0.02)
    out += np.where((r == 42) & (step % 97 == 0), 5.0, 0.0)
    return out


def open_run(
    data: Path, run_id: str, names: list[str], steps: int, env: dict[str, str] | None = None
) -> tuple[Stores, list[int]]:
    """The stores of a new data dir (bootstrapped) holding the run ``run_id`` of RANKS
    ranks x ``steps`` steps, with a rank series per key of ``names``: the stores and the
    series ids, for points written straight through them."""
    settings = ServerSettings.from_env(env or {}, data_dir=data)
    data.mkdir(parents=True, exist_ok=True)
    stores = open_stores(settings.metadata_url, settings.points_url)
    bootstrap(settings, stores.tenancy)
    seq, sids = new_run(stores, run_id, names)
    with stores.unit():
        stores.runs.extend({seq: (RANKS, steps - 1)})
    return stores, sids


def new_run(stores: Stores, run_id: str, names: list[str]) -> tuple[int, list[int]]:
    """The run ``run_id`` created in the default org, with a rank series per key of
    ``names``: the run's seq and the series ids."""
    org = stores.tenancy.org_id("default")
    assert org is not None
    WriteService(stores).apply([Envelope(CreateRun(org, run_id, "bench", None, {}, [], {}))])
    with stores.unit():
        run = stores.runs.resolve(org, [run_id])[run_id]
        assert run is not None
        return run.seq, list(stores.runs.series_ids(run, RANK, names))


def load_store(
    data: Path,
    steps: int,
    chunk: int = 200,
    env: dict[str, str] | None = None,
    keys: int = 1,
    run_id: str = RUN,
    names: list[str] | None = None,
) -> None:
    """The run written straight through the stores (the point store's write path, per-step
    aggregates computed as at ingest), without HTTP: for runs that would take most of an
    hour to send. ``env``: the server's store settings (default: the data dir's file);
    ``names``: the keys (default: ``KEY`` and ``keys - 1`` others)."""
    stores, sids = open_run(
        data, run_id, names or [KEY, *(f"other/k{i}" for i in range(1, keys))], steps, env
    )
    rng = np.random.default_rng(42)
    ranks = np.arange(RANKS)
    seq = 0
    for start in range(0, steps, chunk):
        block = range(start, min(steps, start + chunk))
        step = np.repeat(np.array(block, dtype=np.int64), RANKS)
        rank = np.tile(ranks, len(block))
        keep = ~((rank == 300) & (step > int(steps * 0.6)))
        values = np.concatenate([value(s, rng) for s in block])
        n = int(keep.sum())
        columns = {
            "step": step[keep],
            "rank": rank[keep].astype(np.int16),
            "world_size": np.full(n, RANKS, dtype=np.int16),
            "local_rank": (rank[keep] % 8).astype(np.int16),
            "value": values[keep],
            "weight": (1 + rank[keep] % 4).astype(np.float64),
            "ts": np.zeros(n),
            "seq": seq + np.arange(n, dtype=np.int64),
        }
        seq += n
        with stores.unit():
            for i, sid in enumerate(sids):
                stores.points.write_rank(sid, {**columns, "value": columns["value"] + i})
    # As a server's idle time would: bring the aggregates up to date.
    while True:
        with stores.unit():
            if not stores.points.maintain():
                break
    stores.close()


async def load_ingest(url: str, key: str, steps: int) -> float:
    headers = {"Authorization": f"Bearer {key}"}
    rng = np.random.default_rng(42)
    path = f"/runs/{RUN}/rank-metrics"
    start = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=300) as http:
        (await http.post("/runs", json={"project": "bench", "id": RUN})).raise_for_status()
        queue: asyncio.Queue[list[dict[str, object]] | None] = asyncio.Queue(maxsize=4)

        async def sender() -> None:
            while (batch := await queue.get()) is not None:
                (await http.post("/api/ingest", json={"events": batch})).raise_for_status()

        senders = [asyncio.create_task(sender()) for _ in range(2)]
        batch: list[dict[str, object]] = []
        for s in range(steps):
            noise = rng.uniform(-0.5, 0.5, RANKS)
            for r in range(RANKS):
                if r == 300 and s > int(steps * 0.6):
                    continue
                value = 2.0 / (1 + s / 1000) + (r % 13) * 0.001 + (0.3 if r == 7 else 0)
                value += noise[r] if r == 11 else noise[r] * 0.02
                value += 5 if (r == 42 and s % 97 == 0) else 0
                batch.append(
                    {
                        "event_id": f"{s}-{r}",
                        "request": {
                            "method": "POST",
                            "path": path,
                            "body": {
                                "metrics": {KEY: value},
                                "step": s,
                                "rank": r,
                                "world_size": RANKS,
                                "local_rank": r % 8,
                                "weight": 1 + r % 4,
                            },
                        },
                    }
                )
                if len(batch) == 1000:
                    await queue.put(batch)
                    batch = []
        if batch:
            await queue.put(batch)
        for _ in senders:
            await queue.put(None)
        await asyncio.gather(*senders)
    return time.perf_counter() - start


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def numpy_baseline(db: Path, steps: int) -> float:
    """Pull the key's points into numpy and compute the per-step reducers, MAD scores,
    per-rank rollup and heatmap there (vectorised)."""
    start = time.perf_counter()
    con = duckdb.connect(str(db), read_only=True)
    cols = con.execute(
        "SELECT step, rank, value, weight FROM rank_points ORDER BY step, rank"
    ).fetchnumpy()
    con.close()
    step, rank, v, w = cols["step"], cols["rank"].astype(np.int64), cols["value"], cols["weight"]
    starts = np.flatnonzero(np.r_[True, step[1:] != step[:-1]])
    counts = np.diff(np.r_[starts, len(step)])
    mean = np.add.reduceat(v, starts) / counts
    wmean = np.add.reduceat(w * v, starts) / np.add.reduceat(w, starts)
    mean_rep = np.repeat(mean, counts)
    std = np.sqrt(np.add.reduceat((v - mean_rep) ** 2, starts) / counts)
    grid = np.full((len(starts), RANKS), np.nan)
    grid[np.repeat(np.arange(len(starts)), counts), rank] = v
    p05, p50, p95 = np.nanpercentile(grid, [5, 50, 95], axis=1)
    ad = np.abs(grid - p50[:, None])
    mad = np.nanmedian(ad, axis=1)
    z = (grid - mean[:, None]) / np.where(std > 0, std, np.inf)[:, None]
    robust = 0.6745 * (grid - p50[:, None]) / np.where(mad > 0, mad, np.inf)[:, None]
    with warnings.catch_warnings():  # all-NaN cells (a rank that stopped) are expected
        warnings.simplefilter("ignore", RuntimeWarning)
        _ = (
            np.nanmean(np.abs(z), axis=0),
            np.nansum((np.abs(z) >= 3) | (np.abs(robust) >= 3.5), axis=0),
        )
        _ = (
            np.nanmean(grid[: (len(starts) // 200) * 200].reshape(200, -1, RANKS), axis=1),
            wmean,
            p05,
            p95,
        )
    return time.perf_counter() - start


def sql_group_by(db: Path) -> float:
    con = duckdb.connect(str(db), read_only=True)
    start = time.perf_counter()
    con.execute(
        "SELECT step, count(*), avg(value), sum(weight * value) / sum(weight), min(value), max(value),"
        " stddev_pop(value), quantile_cont(value, [0.05, 0.5, 0.95]) FROM rank_points"
        " GROUP BY step ORDER BY step"
    ).fetchall()
    elapsed = time.perf_counter() - start
    con.close()
    return elapsed


def timed_get(http: httpx.Client, params: dict[str, object]) -> tuple[float, int]:
    start = time.perf_counter()
    response = http.get(f"/api/runs/{RUN}/distributed", params=params)
    response.raise_for_status()
    return time.perf_counter() - start, len(response.content)


def measure(
    steps: int, load: str, repeats: int, baselines: bool = True, keys: int = 1
) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        ingest_s = float("nan")
        if load == "store":
            load_store(data, steps, keys=keys)
        server = ServerProcess(data, env={"HOME": tmp}).start()
        try:
            if load == "ingest":
                ingest_s = asyncio.run(load_ingest(server.url, server.admin_key, steps))
            http = httpx.Client(
                base_url=server.url,
                timeout=600,
                headers={"Authorization": f"Bearer {server.admin_key}"},
            )
            cold, _ = timed_get(http, {})  # brings the stale aggregates up to date
            zoom_lo = steps // 2
            default, zoom, other_z, rss = [], [], [], []
            size = 0
            for _ in range(repeats):
                elapsed, size = timed_get(http, {})
                default.append(elapsed)
                rss.append(rss_mb(server.proc.pid))  # type: ignore[union-attr]
                zoom.append(timed_get(http, {"step_min": zoom_lo, "step_max": zoom_lo + 999})[0])
            for _ in range(3):  # last: a non-default z scans the range's points
                other_z.append(timed_get(http, {"z": 2.5})[0])
            http.close()
        finally:
            server.stop()
        db = data / "instantml.duckdb"
        baseline_np = baseline_sql = float("nan")
        if baselines:
            baseline_np = statistics.median(numpy_baseline(db, steps) for _ in range(3))
            baseline_sql = statistics.median(sql_group_by(db) for _ in range(3))
    return {
        "steps": steps,
        "keys": keys,
        "points": steps * RANKS,
        "ingest_s": ingest_s,
        "cold_s": cold,
        "default_ms": statistics.median(default) * 1000,
        "zoom_ms": statistics.median(zoom) * 1000,
        "z_ms": statistics.median(other_z) * 1000,
        "rss_mb": max(rss),
        "answer_kb": size / 1024,
        "numpy_ms": baseline_np * 1000,
        "groupby_ms": baseline_sql * 1000,
    }


def report(row: dict[str, float]) -> None:
    keys = f" x {row['keys']} keys (each)" if row["keys"] > 1 else ""
    print(f"\n512 ranks x {row['steps']:,} steps = {row['points']:,} points{keys}")
    if row["ingest_s"] == row["ingest_s"]:
        print(
            f"  ingest through /api/ingest : {row['ingest_s']:.0f} s ({row['points'] / row['ingest_s']:,.0f} points/s)"
        )
    print(f"  first summary (aggregates brought up to date): {row['cold_s'] * 1000:,.0f} ms")
    print(
        f"  default summary, warm median : {row['default_ms']:7.1f} ms  ({row['answer_kb']:,.0f} KiB)"
    )
    print(f"  zoom to 1,000 steps, median  : {row['zoom_ms']:7.1f} ms")
    print(f"  default with z=2.5 (a scan)  : {row['z_ms']:7.1f} ms")
    print(f"  server RSS while answering   : {row['rss_mb']:7.0f} MB")
    if row["numpy_ms"] == row["numpy_ms"]:
        print(
            f"  baseline numpy (load + compute): {row['numpy_ms']:7.0f} ms  -> summary is {row['numpy_ms'] / row['default_ms']:.1f}x faster"
        )
        print(
            f"  baseline one SQL GROUP BY step : {row['groupby_ms']:7.0f} ms  -> summary is {row['groupby_ms'] / row['default_ms']:.1f}x faster"
        )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--load", choices=["ingest", "store"], default="ingest")
    parser.add_argument(
        "--growth", default="", help="comma-separated step counts, loaded through the stores"
    )
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--keys", type=int, default=1, help="keys the run logs (growth runs)")
    parser.add_argument(
        "--no-baselines", action="store_true", help="skip the numpy and GROUP BY baselines"
    )
    args = parser.parse_args()
    print(f"cores: {os.cpu_count()}; medians over {args.repeats} warm requests")
    rows = []
    if args.steps:
        rows.append(measure(args.steps, args.load, args.repeats, not args.no_baselines))
        report(rows[-1])
    for steps in [int(s) for s in args.growth.split(",") if s]:
        rows.append(measure(steps, "store", args.repeats, not args.no_baselines, args.keys))
        report(rows[-1])
    if len(rows) > 1:
        print("\ngrowth (default summary / zoom / server RSS, warm medians):")
        for row in rows:
            print(
                f"  {row['steps']:>7,} steps: {row['default_ms']:7.1f} ms"
                f" ({row['default_ms'] / rows[0]['default_ms']:.2f}x the first)"
                f" / {row['zoom_ms']:6.1f} ms / {row['rss_mb']:5.0f} MB"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
