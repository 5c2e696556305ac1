"""Getting a large run out, and deleting it: export rate and memory, delete time.

    .venv/bin/python bench/bench_export.py [--steps 20000] [--stores duckdb,postgres+chdb]
                                           [--repeats 3]

For each store it writes one run of 512 ranks x ``--steps`` steps of one key straight
through the stores (``bench_summary.load_store``: 10.2M points at the default), starts a
real server on it, and measures:
  * ``GET /api/runs/{id}/rank-points?format=parquet|csv|arrow`` of every point, read by a
    plain streaming client that throws the bytes away: points/s (median of ``--repeats``),
    the body's size, and the server's peak RSS while it streams (sampled every 20 ms) beside
    its RSS before;
  * ``DELETE /api/runs/{id}``: the time until it answers, which is when the run's points
    are gone from the point store.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))  # tests/: the PostgreSQL fixture
from tests.postgres import Cluster

from bench_summary import KEY, RANKS, RUN, load_store, rss_mb
from instantml.server.process import ServerProcess


def _peak_rss(pid: int, stop: threading.Event, peaks: list[float]) -> None:
    while not stop.is_set():
        peaks.append(rss_mb(pid))
        time.sleep(0.02)


def export_once(server: ServerProcess, fmt: str) -> tuple[float, int, float]:
    """(seconds, bytes, peak RSS in MB) of one export of every point of the run."""
    assert server.proc is not None
    peaks: list[float] = []
    stop = threading.Event()
    sampler = threading.Thread(target=_peak_rss, args=(server.proc.pid, stop, peaks))
    sampler.start()
    size = 0
    headers = {"Authorization": f"Bearer {server.admin_key}"}
    start = time.perf_counter()
    with httpx.Client(base_url=server.url, headers=headers, timeout=600) as http:
        params = {"key": KEY, "format": fmt}
        with http.stream("GET", f"/api/runs/{RUN}/rank-points", params=params) as response:
            response.raise_for_status()
            for chunk in response.iter_raw(1 << 20):
                size += len(chunk)
    elapsed = time.perf_counter() - start
    stop.set()
    sampler.join()
    return elapsed, size, max(peaks)


def measure(name: str, env: dict[str, str], args: argparse.Namespace, tmp: Path) -> None:
    data = tmp / "data"
    started = time.perf_counter()
    load_store(data, args.steps, env=env)
    points = RANKS * args.steps - (args.steps - 1 - int(args.steps * 0.6))  # rank 300 stops
    print(f"\n== {name}: {points:,} points loaded in {time.perf_counter() - started:.0f} s")
    with ServerProcess(data, env={"HOME": str(tmp), **env}) as server:
        assert server.proc is not None
        headers = {"Authorization": f"Bearer {server.admin_key}"}
        with httpx.Client(base_url=server.url, headers=headers, timeout=900) as http:
            keys = http.get(f"/api/runs/{RUN}/keys").json()["keys"]
            assert keys[0]["points"] == points, keys
        before = rss_mb(server.proc.pid)
        print(f"server RSS before: {before:.0f} MB")
        print(f"{'format':<8} {'points/s':>12} {'MB':>8} {'peak RSS MB':>12}")
        for fmt in args.formats.split(","):
            runs = [export_once(server, fmt) for _ in range(args.repeats)]
            seconds = statistics.median(r[0] for r in runs)
            print(
                f"{fmt:<8} {points / seconds:>12,.0f} {runs[0][1] / 1e6:>8.1f}"
                f" {max(r[2] for r in runs):>12.0f}"
            )
        with httpx.Client(base_url=server.url, headers=headers, timeout=900) as http:
            start = time.perf_counter()
            response = http.delete(f"/api/runs/{RUN}")
            took = time.perf_counter() - start
            assert response.status_code == 204, response.text
            assert http.get(f"/api/runs/{RUN}/keys").status_code == 404
        print(f"DELETE of the run ({points:,} points): {took:.2f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--stores", default="duckdb,postgres+chdb")
    parser.add_argument("--formats", default="parquet,csv,arrow")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"cores: {os.cpu_count()}; {RANKS} ranks x {args.steps} steps; medians of {args.repeats}")
    cluster: Cluster | None = None
    try:
        for name in args.stores.split(","):
            with tempfile.TemporaryDirectory() as raw:
                tmp = Path(raw)
                env: dict[str, str] = {}
                if name == "postgres+chdb":
                    cluster = cluster or Cluster()
                    env = {
                        "INSTANTML_METADATA_URL": cluster.new_database(),
                        "INSTANTML_POINTS_URL": f"chdb://{tmp / 'points'}",
                    }
                elif name != "duckdb":
                    raise SystemExit(f"--stores: unknown {name!r} (duckdb, postgres+chdb)")
                measure(name, env, args, tmp)
    finally:
        if cluster is not None:
            cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
