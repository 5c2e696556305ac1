"""Soak: steady ingest at a fixed rate for a long time, the dashboard's summary polled
every 5 s; the server's memory and the write latency, interval by interval.

    .venv/bin/python bench/soak.py [--minutes 30] [--rate 90000] [--interval 300]

``--rate`` is in points/s (3 keys an event, 512 ranks, 10,000-event batches from 2
senders, as the uploader sends them, each event named as its rank's spool writer names
it). The campaign runs at half the most this harness gets through, measured unpaced on
the same machine (``--minutes 4 --rate 1e9 --interval 60``: the server with its summary
polls and health monitor, the load generator on the same cores): 184,500 points/s in the
first minute on a 2-core machine, so 90,000. Each interval prints: the points/s
achieved, the server's RSS (its decoding process included) at the interval's end and its
median and max over the interval (sampled every 5 s), the
write latency p50/p99, the summary latency p50/p99, and any failed request.
``--no-poll`` leaves the summary polls out (the memory is still sampled every 5 s): what
the write latency does without them. ``--preload N`` writes the run's first N steps
through the stores before the server starts (~3 minutes for 110,000 steps, the length of
a 30-minute run at 96,000 points/s), and the soak goes on from step N: a late interval's
store in a few minutes, to compare changes at the size where they matter (its points and
aggregates; not the Idempotency-Keys that the soak's own events would have left).
``--keys K`` spreads the same points/s over K keys (a multiple of 3; each event holds
three, a rank's step one event per three keys): the polled key's series grows K/3 times
slower, which tells the latencies' rise with time apart from their rise with the run's
length. ``tests/reliability/test_soak.py`` runs a short form.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson

from bench_summary import load_store
from instantml.server.process import ServerProcess

BATCH, WORLD = 10_000, 512
KEYS = ("train/loss", "optimizer/grad_norm", "perf/step_ms")


def key_names(keys: int) -> list[list[str]]:
    """``keys`` metric keys in events of three: ``KEYS`` first, then ``g<i>/...`` alike."""
    if keys < 3 or keys % 3:
        raise ValueError("--keys must be a multiple of 3")
    return [list(KEYS)] + [[f"g{g}/{k.split('/')[1]}" for k in KEYS] for g in range(1, keys // 3)]


def rss_mb(pid: int) -> float:
    """Resident memory of a process and its children, in MB."""
    total = 0
    pids = [pid]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    pids.append(int(entry.name))
            except (OSError, ValueError):
                continue
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


@dataclass
class Interval:
    start: float
    writes: list[float] = field(default_factory=list)  # seconds per batch
    reads: list[float] = field(default_factory=list)  # seconds per summary
    points: int = 0
    failures: int = 0
    rss: float = 0.0  # at the interval's end
    rss_seen: list[float] = field(default_factory=list)  # every 5 s, with each summary poll


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def soak(
    workdir: Path,
    seconds: float,
    rate: float,
    interval: float,
    log: bool = True,
    stores: dict[str, str] | None = None,
    polls: bool = True,
    preload: int = 0,
    keys: int = 3,
) -> list[Interval]:
    intervals: list[Interval] = []
    run_id = f"soak-{uuid.uuid4().hex[:8]}"
    groups = key_names(keys)  # a rank's step is one event per group of three keys
    if preload:  # the run as long as the soak would have made it, written before the start
        names = [name for group in groups for name in group]
        load_store(workdir / "data", preload, env=stores, run_id=run_id, names=names)
    lock = threading.Lock()
    stop = threading.Event()
    env = {"HOME": str(workdir), **(stores or {})}
    with ServerProcess(workdir / "data", env=env) as server:
        assert server.proc is not None
        headers = {"Authorization": f"Bearer {server.admin_key}"}
        pid = server.proc.pid
        if not preload:
            httpx.post(f"{server.url}/runs", json={"project": "soak", "id": run_id},
                       headers=headers).raise_for_status()  # fmt: skip
        path = f"/runs/{run_id}/rank-metrics"
        batches_per_second = rate / (3 * BATCH)
        start = time.monotonic()
        intervals.append(Interval(start))
        first = -(-preload * len(groups) * WORLD // BATCH)  # the first batch past the preload
        counter = iter(range(first, 10**12))
        # Each rank a spool writer: its events named "<its prefix>-<n>", n counting from 1.
        writers = [uuid.uuid4().hex for _ in range(WORLD)]
        next_lock = threading.Lock()

        def current() -> Interval:
            return intervals[-1]

        def sender() -> None:
            with httpx.Client(base_url=server.url, headers=headers, timeout=120) as http:
                while not stop.is_set():
                    with next_lock:
                        b = next(counter)
                    due = start + (b - first) / batches_per_second
                    if due > time.monotonic():
                        time.sleep(due - time.monotonic())
                    events = [
                        {"event_id": f"{writers[n % WORLD]}-{n // WORLD + 1}", "request": {"method": "POST", "path": path,
                         "body": {"metrics": dict(zip(groups[(n // WORLD) % len(groups)],
                                                      (1.0 / (n // WORLD // len(groups) + 1),
                                                       2.5 + (n % 7) * 0.1, 31.0 + (n % WORLD) * 0.01))),
                                  "step": n // WORLD // len(groups), "rank": n % WORLD, "world_size": WORLD}}}
                        for n in range(b * BATCH, (b + 1) * BATCH)
                    ]  # fmt: skip
                    payload = orjson.dumps({"events": events})
                    began = time.perf_counter()
                    try:
                        answer = http.post("/api/ingest", content=payload)
                        ok = answer.status_code == 200 and all(
                            r["status"] == 200 for r in answer.json()["results"]
                        )
                    except httpx.HTTPError:
                        ok = False
                    took = time.perf_counter() - began
                    with lock:
                        now = current()
                        now.writes.append(took)
                        now.points += 3 * BATCH if ok else 0
                        now.failures += 0 if ok else 1

        def reader() -> None:
            with httpx.Client(base_url=server.url, headers=headers, timeout=120) as http:
                while not stop.wait(5.0):
                    if not polls:  # memory still sampled every 5 s
                        with lock:
                            current().rss_seen.append(rss_mb(pid))
                        continue
                    began = time.perf_counter()
                    answer = http.get(f"/api/runs/{run_id}/distributed",
                                      params={"key": "train/loss"})  # fmt: skip
                    took = time.perf_counter() - began
                    rss = rss_mb(pid)
                    with lock:
                        current().rss_seen.append(rss)
                        current().reads.append(took)
                        current().failures += 0 if answer.status_code == 200 else 1

        threads = [threading.Thread(target=sender) for _ in range(2)]
        threads.append(threading.Thread(target=reader))
        for thread in threads:
            thread.start()
        try:
            while time.monotonic() - start < seconds:
                time.sleep(min(interval, seconds - (time.monotonic() - start)))
                with lock:
                    done, number = current(), len(intervals)
                    done.rss = rss_mb(server.proc.pid)
                    if time.monotonic() - start < seconds - 1:
                        intervals.append(Interval(time.monotonic()))
                if log:
                    print(line(done, number, interval), flush=True)
        finally:
            stop.set()
            for thread in threads:
                thread.join()
    return intervals


def line(iv: Interval, number: int, interval: float) -> str:
    return (
        f"interval {number:2d}: {iv.points / interval:9,.0f} points/s  RSS {iv.rss:5.0f} MB"
        f" (median {pct(iv.rss_seen, 0.5):5.0f}, max {pct(iv.rss_seen, 1.0):5.0f})"
        f"  write p50 {pct(iv.writes, 0.5) * 1000:6.0f} ms p99 {pct(iv.writes, 0.99) * 1000:6.0f} ms"
        f"  summary p50 {pct(iv.reads, 0.5) * 1000:5.0f} ms p99 {pct(iv.reads, 0.99) * 1000:5.0f} ms"
        f"  failures {iv.failures}"
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument(
        "--rate", type=float, default=90_000.0, help="points/s (1e9: as fast as it goes)"
    )
    parser.add_argument("--interval", type=float, default=300.0, help="seconds per report")
    parser.add_argument(
        "--no-poll", action="store_true", help="no summary polls (their cost's share of the rest)"
    )
    parser.add_argument(
        "--preload",
        type=int,
        default=0,
        help="steps of the run written before the start (a late interval's store, sooner)",
    )
    parser.add_argument(
        "--keys",
        type=int,
        default=3,
        help="metric keys, a multiple of 3 (the same points/s over more keys: shorter series)",
    )
    args = parser.parse_args()
    print(
        f"soak: {args.minutes:g} min at {args.rate:,.0f} points/s, report every {args.interval:g} s"
        + (f", {args.keys} keys" if args.keys != 3 else "")
        + (f", the run preloaded with {args.preload:,} steps" if args.preload else "")
    )
    with tempfile.TemporaryDirectory() as tmp:
        intervals = soak(
            Path(tmp),
            args.minutes * 60,
            args.rate,
            args.interval,
            polls=not args.no_poll,
            preload=args.preload,
            keys=args.keys,
        )
    first, last = intervals[0], intervals[-1]
    print(f"\nRSS after the first interval {first.rss:.0f} MB, at the end {last.rss:.0f} MB:"
          f" {last.rss / first.rss - 1:+.1%} after warm-up")  # fmt: skip
    for name, q in (("median", 0.5), ("max", 1.0)):
        was, now = pct(first.rss_seen, q), pct(last.rss_seen, q)
        print(f"RSS {name} in the first interval {was:.0f} MB, in the last {now:.0f} MB:"
              f" {now / was - 1:+.1%}")  # fmt: skip
    print(f"p99 write latency by interval (ms): "
          f"{', '.join(f'{pct(iv.writes, 0.99) * 1000:.0f}' for iv in intervals)}")  # fmt: skip
    print(f"failed requests: {sum(iv.failures for iv in intervals)}")
    print(
        f"median points/s: {statistics.median(iv.points for iv in intervals) / args.interval:,.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
