"""False and true alerts of real multi-process jobs, counted: what
``tests/health/test_real_jobs.py`` checks once, repeated, on the server's default thresholds.

    .venv/bin/python bench/health_jobs.py [--repeat 5] [--world 6] [--modes async,spool]
        [--faulty 5] [--src DIR]

Each healthy job: ``--world`` rank processes started 0.4 s apart, 150 steps of 20-60 ms
with 5% noise on the loss, in async mode or spool mode (the background uploader); its
alerts (open or resolved, read while it runs and ``lag_seconds`` + 2 s after it ends) and
its webhook posts are counted. Each faulty job (6 ranks: rank 1's forward 3x slower, rank
2 NaN from step 40, rank 3 ``os._exit`` at step 60): the alerts it got, and the time from
rank 3's exit to its ``rank_missing`` post. ``--src`` runs the server and the ranks from
another checkout's ``src`` (the code before a change), by PYTHONPATH.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.health.test_real_jobs import LAG, STEPS, alerts, launch, summary  # noqa: E402
from tests.health.test_run_health import Receiver  # noqa: E402

from instantml.server.process import ServerProcess  # noqa: E402


def healthy(server: ServerProcess, api: httpx.Client, receiver: Receiver, mode: str,
            world: int, spool: Path) -> tuple[int, int, float]:  # fmt: skip
    """(alerts, webhook posts, seconds) of one healthy job."""
    run_id = f"bench-{mode}-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    procs = launch(server, run_id, world, mode, spool / run_id if mode == "spool" else None)
    seen: dict[str, dict[str, object]] = {}
    while any(p.poll() is None for p in procs):
        seen.update({a["id"]: a for a in alerts(api, run_id)})
        time.sleep(0.5)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # spool: until the uploader delivered everything
        got = summary(api, run_id)
        if got and got["coverage"]["full_steps"] == STEPS:
            break
        seen.update({a["id"]: a for a in alerts(api, run_id)})
        time.sleep(0.5)
    time.sleep(LAG + 2)
    seen.update({a["id"]: a for a in alerts(api, run_id)})
    for a in seen.values():
        print(f"    false alert: {a['kind']} rank {a['rank']} {a['key']} - {a['message']}")
    return len(seen), len(receiver.alerts(run_id)), time.monotonic() - started


def faulty(server: ServerProcess, api: httpx.Client, receiver: Receiver,
           tmp: Path) -> tuple[list[str], float | None]:  # fmt: skip
    """(the alerts' kind/rank/key, exit-to-post seconds) of one faulty job."""
    run_id = f"bench-faulty-{uuid.uuid4().hex[:8]}"
    exit_file = tmp / f"{run_id}.exit"
    faults = {1: ["--slow", "3"], 2: ["--nan-from", "40"],
              3: ["--exit-at", "60", "--exit-file", str(exit_file)]}  # fmt: skip
    for proc in launch(server, run_id, 6, extra=faults):
        proc.wait(timeout=300)
    deadline = time.monotonic() + LAG + 60
    posted = None
    while time.monotonic() < deadline and posted is None:
        with receiver.lock:
            posts = list(zip(receiver.times, receiver.posts, strict=True))
        posted = next((t for t, (_, body) in posts
                       if run_id.encode() in body and b'"rank_missing"' in body), None)  # fmt: skip
        time.sleep(0.2)
    time.sleep(3)
    found = sorted(f"{a['kind']}:{a['rank']}:{a['key']}" for a in alerts(api, run_id))
    delay = None if posted is None else posted - float(exit_file.read_text())
    return found, delay


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--world", type=int, default=6)
    parser.add_argument("--modes", default="async,spool")
    parser.add_argument("--faulty", type=int, default=5)
    parser.add_argument("--src", help="another checkout's src directory, for the server and ranks")
    args = parser.parse_args()
    if args.src:
        os.environ["PYTHONPATH"] = str(Path(args.src).resolve())
    tmp = Path(tempfile.mkdtemp())
    receiver = Receiver()
    with ServerProcess(tmp / "data", env={"HOME": str(tmp)}) as server:
        headers = {"Authorization": f"Bearer {server.admin_key}"}
        with httpx.Client(base_url=server.url, headers=headers, timeout=60) as api:
            api.post("/api/webhooks", json={"url": receiver.url}).raise_for_status()
            for mode in [m for m in args.modes.split(",") if m]:
                counts = []
                for i in range(args.repeat):
                    found, posts, took = healthy(server, api, receiver, mode, args.world, tmp)
                    print(f"{mode} healthy job {i + 1}: {found} alerts, {posts} webhook posts"
                          f" ({took:.0f} s)", flush=True)  # fmt: skip
                    counts.append(found)
                print(f"{mode}: false alerts per healthy job {counts}, mean"
                      f" {statistics.mean(counts):.1f}", flush=True)  # fmt: skip
            delays = []
            for i in range(args.faulty):
                found, delay = faulty(server, api, receiver, tmp)
                print(f"faulty job {i + 1}: {found}; exit -> rank_missing post"
                      f" {'-' if delay is None else f'{delay:.1f} s'}", flush=True)  # fmt: skip
                if delay is not None:
                    delays.append(delay)
            if delays:
                print(f"exit -> post: median {statistics.median(delays):.1f} s,"
                      f" max {max(delays):.1f} s (lag_seconds {LAG:g})")  # fmt: skip
    receiver.close()


if __name__ == "__main__":
    main()
