"""The Distributed summary's read path of two source trees side by side in one run: this
one and a ``--before`` tree (a checkout of an earlier commit), on the same data.

    .venv/bin/python bench/bench_summary_ab.py --before /path/to/old/checkout
        [--growth 2000,20000,100000] [--repeats 9]

Per run length: 512 ranks loaded once through this tree's stores (``bench_summary``), the
data dir copied, one server per tree on its copy (run from that tree's ``src`` through
PYTHONPATH), then the same requests alternated between the two: the default summary, a
zoom to 1,000 steps, a non-default z (a scan of the points). Prints each tree's warm
medians, the ratio this / before, and each server's RSS. The trees must share the store's
format (the same schema), which is what an A/B of a refactor needs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from bench_summary import load_store, rss_mb, timed_get
from instantml.server.process import ServerProcess

KINDS = ("default", "zoom", "z=2.5")


def compare(steps: int, trees: dict[str, Path], repeats: int) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        loaded = Path(tmp) / "loaded"
        load_store(loaded, steps)
        servers: dict[str, ServerProcess] = {}
        clients: dict[str, httpx.Client] = {}
        try:
            for name, src in trees.items():
                data = Path(tmp) / name
                shutil.copytree(loaded, data)
                home = Path(tmp) / f"home-{name}"
                home.mkdir()
                env = {"PYTHONPATH": str(src), "HOME": str(home)}
                servers[name] = ServerProcess(data, env=env).start()
                clients[name] = httpx.Client(
                    base_url=servers[name].url,
                    timeout=600,
                    headers={"Authorization": f"Bearer {servers[name].admin_key}"},
                )
            zoom = {"step_min": steps // 2, "step_max": steps // 2 + 999}
            asks = {"default": {}, "zoom": zoom, "z=2.5": {"z": 2.5}}
            for http in clients.values():  # warm: a first answer of each kind
                for params in asks.values():
                    timed_get(http, params)
            times: dict[str, dict[str, list[float]]] = {n: {k: [] for k in KINDS} for n in trees}
            for _ in range(repeats):
                for kind, params in asks.items():
                    for name, http in clients.items():
                        times[name][kind].append(timed_get(http, params)[0])
            out = {
                name: {
                    **{kind: statistics.median(t) * 1000 for kind, t in times[name].items()},
                    "rss": rss_mb(servers[name].proc.pid),  # type: ignore[union-attr]
                }
                for name in trees
            }
        finally:
            for http in clients.values():
                http.close()
            for server in servers.values():
                server.stop()
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", type=Path, required=True, help="an older checkout")
    parser.add_argument("--growth", default="2000,20000,100000")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    trees = {"before": args.before.resolve() / "src", "this": Path(__file__).parent.parent / "src"}
    print(f"cores: {os.cpu_count()}; warm medians over {args.repeats} alternated requests")
    for steps in [int(s) for s in args.growth.split(",") if s]:
        found = compare(steps, trees, args.repeats)
        print(f"\n512 ranks x {steps:,} steps")
        for kind in KINDS:
            before, this = found["before"][kind], found["this"][kind]
            print(
                f"  {kind:8} before {before:8.1f} ms  this {this:8.1f} ms"
                f"  this/before {this / before:.2f}"
            )
        print(
            f"  RSS      before {found['before']['rss']:6.0f} MB  this {found['this']['rss']:6.0f} MB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
