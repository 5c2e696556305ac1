"""One key's Distributed summary on a store of many keys: the rows interleaved as a live run
writes them, against the same rows grouped by key.

    .venv/bin/python bench/bench_layout.py [--keys 30] [--steps 4000] [--repeats 3]

Both stores hold the same run (512 ranks, ``--keys`` keys, ``--steps`` steps each),
written through the embedded store's write path in units of 20 steps, the aggregates
brought up to date after each unit as the server's writer does when idle:
  * interleaved: each unit holds 20 steps of every key (the soak's layout, and any run that
    logs several keys a step);
  * grouped: each unit holds 20 steps of one key, key after key (the same rows, each key's
    together in the tables).
Then the first key's default summary rows (``summary_rows``) are read in a new process,
cold (the process's first read) and warm (the next two), ``--repeats`` processes per
store, alternating. Prints the medians and the interleaved/grouped ratios. What it tells:
whether a summary's cost follows its own key or every key's rows around it
(docs/reliability.md, the soak).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench_summary import RANKS, open_run, value

UNIT_STEPS = 20

READ = r"""
import json, sys, time
from pathlib import Path
from instantml.settings import ServerSettings
from instantml.storage import open_stores
from instantml.rankmath.params import SummaryParams
settings = ServerSettings.from_env({}, data_dir=Path(sys.argv[1]))
stores = open_stores(settings.metadata_url, settings.points_url)
org = stores.tenancy.org_id("default")
sid = next(i for i, _, name in stores.runs.series(org, "r") if name == "k00")
took = []
for _ in range(3):
    began = time.perf_counter()
    stores.points.summary_rows(sid, SummaryParams("k00"))
    took.append(time.perf_counter() - began)
stores.close()
print("TOOK", json.dumps(took))
"""


def build(data: Path, keys: int, steps: int, grouped: bool) -> None:
    stores, sids = open_run(data, "r", [f"k{i:02d}" for i in range(keys)], steps)
    rng = np.random.default_rng(7)
    ranks = np.arange(RANKS)
    seq = 0
    starts = range(0, steps, UNIT_STEPS)
    units = [(k, s) for k in range(keys) for s in starts] if grouped else [(-1, s) for s in starts]
    for key, start in units:
        block = range(start, min(steps, start + UNIT_STEPS))
        step = np.repeat(np.array(block, dtype=np.int64), RANKS)
        rank = np.tile(ranks, len(block))
        n = len(step)
        columns = {
            "step": step,
            "rank": rank.astype(np.int16),
            "world_size": np.full(n, RANKS, dtype=np.int16),
            "local_rank": (rank % 8).astype(np.int16),
            "value": np.concatenate([value(s, rng) for s in block]),
            "weight": np.ones(n),
            "ts": np.zeros(n),
            "seq": seq + np.arange(n, dtype=np.int64),
        }
        seq += n
        with stores.unit():
            for i, sid in enumerate(sids):
                if key in (-1, i):
                    stores.points.write_rank(sid, {**columns, "value": columns["value"] + i})
        while True:  # the writer's idle upkeep
            with stores.unit():
                if not stores.points.maintain():
                    break
    stores.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=30)
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    layouts = ("interleaved", "grouped")
    cold: dict[str, list[float]] = {name: [] for name in layouts}
    warm: dict[str, list[float]] = {name: [] for name in layouts}
    with tempfile.TemporaryDirectory() as tmp:
        for name in layouts:
            began = time.perf_counter()
            build(Path(tmp) / name, args.keys, args.steps, grouped=name == "grouped")
            print(f"{name}: {args.keys} keys x {args.steps:,} steps x {RANKS} ranks written"
                  f" in {time.perf_counter() - began:.0f} s", flush=True)  # fmt: skip
        for _ in range(args.repeats):
            for name in layouts:
                out = subprocess.run(
                    [sys.executable, "-c", READ, str(Path(tmp) / name)],
                    capture_output=True, text=True, check=True,
                )  # fmt: skip
                took = json.loads(out.stdout.rsplit("TOOK", 1)[1])  # after any progress bar
                cold[name].append(took[0])
                warm[name].extend(took[1:])
    for label, seen in (("cold", cold), ("warm", warm)):
        a, b = (statistics.median(seen[name]) * 1000 for name in layouts)
        print(f"{label}: interleaved {a:.0f} ms, grouped {b:.0f} ms (median), ratio {a / b:.2f}x"
              f"  [{', '.join(f'{t * 1000:.0f}' for t in seen['interleaved'])} |"
              f" {', '.join(f'{t * 1000:.0f}' for t in seen['grouped'])}]")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
