"""The ClickHouse store's refresh as a unit writes more keys: the points of K keys (8 ranks
x 40 steps each, one unit, as one batch of rank events brings them), then the refresh of
their steps (reducers, scores, blocks of every level, outlier rows), timed alone.

    .venv/bin/python bench/bench_refresh_keys.py [--keys 1,10,150] [--trials 5]

On ClickHouse's engine in this process (chdb), the stores opened as a server opens them.
Prints the median refresh per K, per key, and the ratio of the largest K's per-key cost to
the smallest's (1.0: a key costs the same however many share the unit).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from instantml.storage import open_stores
from instantml.storage.records import RANK, RunSpec

sys.path.insert(0, str(Path(__file__).parent))
from bench_upkeep import _columns

RANKS, STEPS = 8, 40


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", default="1,10,150")
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    counts = [int(k) for k in args.keys.split(",")]
    rng = np.random.default_rng(7)
    per_key: dict[int, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        stores = open_stores(f"duckdb://{tmp}/meta.duckdb", f"chdb://{tmp}/points")
        org, _ = stores.tenancy.ensure_org("bench")
        print(f"{RANKS} ranks x {STEPS} steps a key, one unit; median of {args.trials} refreshes")
        for keys in counts:
            times = []
            for trial in range(args.trials):
                run_id = f"k{keys}-{trial}"
                with stores.unit():
                    stores.runs.create(RunSpec(org, run_id, "bench", None, {}, [], {}))
                    run = stores.runs.resolve(org, [run_id])[run_id]
                    assert run is not None
                    sids = stores.runs.series_ids(run, RANK, [f"k{i}" for i in range(keys)])
                with stores.unit():
                    for sid in sids:
                        stores.points.write_rank(sid, _columns(0, rng, RANKS, STEPS))
                started = time.perf_counter()
                with stores.unit():
                    for sid in sids:
                        stores.points.refresh(sid)
                times.append(time.perf_counter() - started)
                assert not any(stores.points.needs_refresh(sid) for sid in sids)
            median = statistics.median(times)
            per_key[keys] = median / keys
            print(
                f"{keys:>5} keys: refresh {median * 1000:8.1f} ms, {median / keys * 1000:7.2f} ms a key",
                flush=True,
            )
        stores.close()
    lo, hi = min(counts), max(counts)
    print(f"ratio, per key, {hi} keys / {lo}: {per_key[hi] / per_key[lo]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
