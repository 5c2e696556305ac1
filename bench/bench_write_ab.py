"""The write path of two source trees side by side in one run: this one and a ``--before``
tree (a checkout of an earlier commit), alternated trial by trial on the same machine.

    .venv/bin/python bench/bench_write_ab.py --before /path/to/old/checkout
        [--seconds 3] [--trials 5] [--events 100000]

Per tree, medians over trials: POST /api/ingest rank points/s (1,000-event batches x 3
keys, 2 senders) and ``instantml sync`` events/s (a spool of 8 ranks), each against a fresh
server on the embedded store, run from that tree's ``src`` (PYTHONPATH).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from bench_ingest import _new_run, ingest_batches
from bench_spool import drain, fill_spool
from instantml.server.process import ServerProcess


def trial(src: Path, args: argparse.Namespace) -> tuple[float, float]:
    env = {"PYTHONPATH": str(src), "HOME": ""}
    with tempfile.TemporaryDirectory() as tmp:
        env["HOME"] = tmp
        with ServerProcess(Path(tmp) / "data", env=env) as server:
            key = server.admin_key
            with httpx.Client(
                base_url=server.url, headers={"Authorization": f"Bearer {key}"}
            ) as api:
                ingest = asyncio.run(ingest_batches(server.url, key, _new_run(api), args.seconds))
            spool = Path(tmp) / "spool"
            fill_spool(spool, args.events, "ab")
            sync = drain(spool, server)[1]
    return ingest * 3, sync


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", type=Path, required=True, help="an older checkout")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--events", type=int, default=100_000)
    args = parser.parse_args()
    trees = {"before": args.before.resolve() / "src", "this": Path(__file__).parent.parent / "src"}
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
    for _ in range(args.trials):
        for name, src in trees.items():
            results[name].append(trial(src, args))
    print(f"cores: {os.cpu_count()}; medians over {args.trials} alternated trials")
    med = {name: [statistics.median(c) for c in zip(*rows)] for name, rows in results.items()}
    for name in trees:
        print(
            f"  {name:<6}: /api/ingest {med[name][0]:>9,.0f} points/s | sync {med[name][1]:>7,.0f} events/s"
        )
    print(
        f"  this / before: ingest {med['this'][0] / med['before'][0]:.3f}x,"
        f" sync {med['this'][1] / med['before'][1]:.3f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
