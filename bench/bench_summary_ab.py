"""The Distributed summary's read path of two source trees side by side in one run: this
one and a ``--before`` tree (a checkout of an earlier commit), on the same data.

    .venv/bin/python bench/bench_summary_ab.py --before /path/to/old/checkout
        [--growth 2000,20000,100000] [--repeats 9]
    .venv/bin/python bench/bench_summary_ab.py --nodes 64 [--growth 20000]

Per run length: 512 ranks loaded once through this tree's stores (``bench_summary``), the
data dir copied, one server per tree on its copy (run from that tree's ``src`` through
PYTHONPATH), then the same requests alternated between the two: the default summary, a
zoom to 1,000 steps, a non-default z (a scan of the points). Prints each tree's warm
medians, the ratio this / before, and each server's RSS. The trees must share the store's
format (the same schema), which is what an A/B of a refactor needs.

``--nodes N`` compares this tree with itself instead: the same run whose ranks said no
node ("before") against the run whose 512 ranks said N nodes of 512/N ranks ("this"),
both with every rank's activity stored, as a job on our SDK and on the public one.
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
from bench_summary import RANKS, RUN, load_store, rss_mb, timed_get
from instantml.server.process import ServerProcess
from instantml.settings import ServerSettings
from instantml.storage import open_stores

KINDS = ("default", "zoom", "z=2.5")


def said_nodes(data: Path, nodes: int) -> None:
    """Every rank of the run seen, on ``nodes`` nodes of RANKS / nodes ranks (0: none)."""
    settings = ServerSettings.from_env({}, data_dir=data)
    stores = open_stores(settings.metadata_url, settings.points_url)
    org = stores.tenancy.org_id("default")
    assert org is not None
    per = max(1, RANKS // nodes) if nodes else 0
    with stores.unit():
        ref = stores.runs.resolve(org, [RUN])[RUN]
        assert ref is not None
        names = {ref.seq: {r: f"node-{r // per:03d}" for r in range(RANKS)}} if nodes else None
        stores.runs.saw_ranks({ref.seq: range(RANKS)}, 1.0, names)
    stores.close()


def compare(
    steps: int, trees: dict[str, Path], repeats: int, nodes: dict[str, int] | None = None
) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        loaded = Path(tmp) / "loaded"
        load_store(loaded, steps)
        servers: dict[str, ServerProcess] = {}
        clients: dict[str, httpx.Client] = {}
        try:
            for name, src in trees.items():
                data = Path(tmp) / name
                shutil.copytree(loaded, data)
                if nodes is not None:
                    said_nodes(data, nodes[name])
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
    parser.add_argument("--before", type=Path, help="an older checkout")
    parser.add_argument("--nodes", type=int, help="instead: this tree with N nodes vs none")
    parser.add_argument("--growth", default="2000,20000,100000")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    this = Path(__file__).parent.parent / "src"
    nodes = None
    if args.nodes:
        trees = {"before": this, "this": this}
        nodes = {"before": 0, "this": args.nodes}
        print(f"without nodes (before) against {args.nodes} nodes (this)")
    elif args.before is not None:
        trees = {"before": args.before.resolve() / "src", "this": this}
    else:
        parser.error("--before or --nodes")
    print(f"cores: {os.cpu_count()}; warm medians over {args.repeats} alternated requests")
    for steps in [int(s) for s in args.growth.split(",") if s]:
        found = compare(steps, trees, args.repeats, nodes)
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
