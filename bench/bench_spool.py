"""Training-side cost of log_rank_metrics per upload mode, and the uploader's throughput.

    .venv/bin/python bench/bench_spool.py [--calls 50000] [--events 200000] [--trials 3]

1. Cost of one ``log_rank_metrics`` call with 3 keys, median and p99 in microseconds, in
   spool mode (fsync periodic, the default; and per event; and none), async mode and sync
   mode, all in one run against the same live server.
2. ``instantml sync`` draining a spool of --events events (8 rank processes' worth of
   segments) into the embedded server: events/s, median over trials.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import instantml as im
from instantml.server.process import ServerProcess

METRICS = {"train/loss": 0.5, "optimizer/grad_norm": 2.5, "perf/step_ms": 31.0}


def call_costs(calls: int, **init: object) -> list[float]:
    run = im.init(project="bench", **init)  # type: ignore[arg-type]
    costs = []
    for step in range(calls):
        start = time.perf_counter_ns()
        run.log_rank_metrics(METRICS, step=step, rank=3, world_size=8, local_rank=3, weight=64)
        costs.append((time.perf_counter_ns() - start) / 1000)
    run.finish(timeout=120)
    return costs


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


WRITER = """
import sys, instantml as im
run = im.init(project="bench", run_id=sys.argv[2], upload_mode="spool", spool_dir=sys.argv[1])
rank, n = int(sys.argv[3]), int(sys.argv[4])
for step in range(n):
    run.log_rank_metrics({"train/loss": 0.5, "optimizer/grad_norm": 2.5, "perf/step_ms": 31.0},
                         step=step, rank=rank, world_size=8, local_rank=rank, weight=64)
run.finish()
"""


def fill_spool(spool: Path, events: int, run_id: str) -> None:
    per_rank = events // 8
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(spool), run_id, str(r), str(per_rank)])
        for r in range(8)
    ]
    for p in procs:
        p.wait()


def drain(spool: Path, server: ServerProcess) -> tuple[float, float]:
    """(seconds the command took, events/s it reports for its own upload, startup aside)."""
    env = {
        **os.environ,
        "INSTANTML_API_BASE_URL": server.url,
        "INSTANTML_API_KEY": server.admin_key,
    }
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "instantml", "sync", "--spool-dir", str(spool)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - start
    reported = re.search(r"\(([\d,]+) events/s\)", done.stdout)
    assert reported, done.stdout
    return seconds, float(reported.group(1).replace(",", ""))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=50_000)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--drain-only", action="store_true", help="skip the per-call costs")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory() as tmp,
        ServerProcess(Path(tmp) / "data", env={"HOME": tmp}) as server,
    ):
        remote = {"base_url": server.url, "api_key": server.admin_key}
        modes = {
            "spool, fsync periodic (default)": {"upload_mode": "spool", "spool_dir": f"{tmp}/s1"},
            "spool, fsync per event": {
                "upload_mode": "spool",
                "spool_dir": f"{tmp}/s2",
                "spool_fsync": "event",
            },
            "spool, fsync none": {
                "upload_mode": "spool",
                "spool_dir": f"{tmp}/s3",
                "spool_fsync": "none",
            },
            "async": {"upload_mode": "async", **remote},
            "sync": {"upload_mode": "sync", **remote},
        }
        print(
            f"log_rank_metrics, 3 keys; medians over {args.trials} trials of {args.calls:,} calls"
            " (sync: 500 calls)"
        )
        results = {}
        for name, init in ({} if args.drain_only else modes).items():
            calls = 500 if name == "sync" else args.calls
            trials = [call_costs(calls, **init) for _ in range(args.trials)]
            results[name] = (
                statistics.median(statistics.median(t) for t in trials),
                statistics.median(pct(t, 0.99) for t in trials),
            )
        base = results["spool, fsync periodic (default)"][0] if results else 1.0
        for name, (med, p99) in results.items():
            print(
                f"  {name:32s} median {med:9.1f} us   p99 {p99:9.1f} us   ({med / base:6.1f}x the default)"
            )

        rates, own = [], []
        for trial in range(args.trials):
            spool = Path(tmp) / f"drain{trial}"
            fill_spool(spool, args.events, f"drain-{trial}")
            lines = sum(1 for seg in (spool / "segments").glob("*.jsonl") for _ in seg.open("rb"))
            seconds, reported = drain(spool, server)
            rates.append(lines / seconds)
            own.append(reported)
        print(
            f"instantml sync into the embedded server ({args.events:,} rank events + run events,"
            f" 3 keys each; median of {args.trials}):"
        )
        print(
            f"  the upload, as sync reports it:   {statistics.median(own):9,.0f} events/s"
            f"  (trials: {', '.join(f'{r:,.0f}' for r in own)})"
        )
        print(
            f"  the command, interpreter startup included: {statistics.median(rates):,.0f} events/s"
            f"  (trials: {', '.join(f'{r:,.0f}' for r in rates)})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
