"""The embedded store's write path as a run grows: each unit's write, the background
upkeep after it, and a summary read, at growing step counts.

    .venv/bin/python bench/bench_upkeep.py [--marks 1000,10000,20000,40000] [--keys 1]

Writes 512 ranks x 20 steps a unit (one uploader batch a key, as the soak sends them)
straight through the stores, in one process, and after each unit runs the upkeep a
server runs when idle (blocks of the new steps; DuckDBPoints.maintain) until it has none
left. At each mark it prints, over the last 100 units: the median write unit, the median
upkeep, and the median of 5 default summaries (``summary_rows``: max_points=500,
heatmap_steps=200) read twice: right after a unit, its blocks still stale, as a
dashboard poll under load reads them; and after the upkeep. The last line gives each
one's ratio at the last mark to the first: the cost's growth with the run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench_summary import new_run
from instantml.rankmath.params import SummaryParams
from instantml.server.bootstrap import bootstrap
from instantml.settings import ServerSettings
from instantml.storage import open_stores
from instantml.storage.protocols import Stores

RANKS, PER_UNIT, RUN = 512, 20, "bench-upkeep"


def _series(stores: Stores, keys: int) -> list[int]:
    return new_run(stores, RUN, [f"k{i}" for i in range(keys)])[1]


def _columns(
    unit: int, rng: np.random.Generator, ranks: int = RANKS, steps: int = PER_UNIT
) -> dict[str, np.ndarray]:
    """Unit ``unit``'s points of one key: ``steps`` steps from ``unit * steps``, every rank."""
    step = np.repeat(np.arange(unit * steps, (unit + 1) * steps, dtype=np.int64), ranks)
    rank = np.tile(np.arange(ranks), steps)
    n = len(step)
    return {
        "step": step,
        "rank": rank.astype(np.int16),
        "world_size": np.full(n, RANKS, dtype=np.int16),
        "local_rank": (rank % 8).astype(np.int16),
        "value": rng.normal(1.0, 0.1, n),
        "weight": np.ones(n),
        "ts": np.zeros(n),
        "seq": unit * n + np.arange(n, dtype=np.int64),
    }


def _ms(seconds: list[float]) -> float:
    return statistics.median(seconds) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--marks", default="1000,10000,20000,40000")
    parser.add_argument("--keys", type=int, default=1)
    args = parser.parse_args()
    marks = sorted(int(m) for m in args.marks.split(","))
    params = SummaryParams()
    rng = np.random.default_rng(7)
    rows: list[tuple[int, float, float, float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        settings = ServerSettings.from_env({}, data_dir=Path(tmp))
        stores = open_stores(settings.metadata_url, settings.points_url)
        bootstrap(settings, stores.tenancy)
        sids = _series(stores, args.keys)
        points = stores.points
        print(
            f"{RANKS} ranks x {PER_UNIT} steps a unit, {args.keys} key(s); medians over the"
            " last 100 units (summaries: 5 reads)",
            flush=True,
        )
        unit = 0
        for mark in marks:
            writes: list[float] = []
            upkeeps: list[float] = []
            stale_reads: list[float] = []
            reads: list[float] = []
            while (unit + 1) * PER_UNIT <= mark:
                columns = _columns(unit, rng)
                started = time.perf_counter()
                with stores.unit():
                    for sid in sids:
                        points.write_rank(sid, columns)
                writes.append(time.perf_counter() - started)
                unit += 1
                last = (unit + 1) * PER_UNIT > mark
                if last:  # a poll that finds the newest blocks stale
                    for _ in range(5):
                        started = time.perf_counter()
                        points.summary_rows(sids[0], params)
                        stale_reads.append(time.perf_counter() - started)
                started = time.perf_counter()
                while True:
                    with stores.unit():
                        if not points.maintain():
                            break
                upkeeps.append(time.perf_counter() - started)
            for _ in range(5):
                started = time.perf_counter()
                points.summary_rows(sids[0], params)
                reads.append(time.perf_counter() - started)
            figures = (
                _ms(writes[-100:]),
                _ms(upkeeps[-100:]),
                _ms(stale_reads),
                _ms(reads),
            )
            rows.append((mark, *figures))
            print(
                f"{mark:>7,} steps: write {figures[0]:6.1f} ms  upkeep {figures[1]:6.1f} ms"
                f"  summary with stale blocks {figures[2]:6.1f} ms  after upkeep"
                f" {figures[3]:6.1f} ms",
                flush=True,
            )
        stores.close()
    first, final = rows[0], rows[-1]
    ratios = [final[i] / first[i] for i in range(1, 5)]
    print(
        f"ratio {final[0]:,} / {first[0]:,} steps: write {ratios[0]:.2f}x  upkeep"
        f" {ratios[1]:.2f}x  summary with stale blocks {ratios[2]:.2f}x  after upkeep"
        f" {ratios[3]:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
