"""Ranks grouped by node on a real job: 16 rank processes on two named nodes
(``INSTANTML_NODE``), node-b's eight ranks slower, then node-b stopping as a whole: the
node's straggler score names node-b, and its loss is one ``node_missing`` alert (one
webhook post), never eight ``rank_missing`` ones. And the detector on its own."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable

from instantml.health.detectors import Finding, node_missing
from instantml.server.process import ServerProcess
from instantml.storage.records import RankActivity
from tests.health.test_real_jobs import JOB, LAG, alerts, summary
from tests.health.test_run_health import Receiver, _api, _wait

WORLD = 16
STOP = 100  # node-b's ranks end here (os._exit, as a host that dies)


def _activity(nodes: dict[int, str | None]) -> dict[int, RankActivity]:
    return {rank: RankActivity(0.0, 1.0, None, node) for rank, node in nodes.items()}


def _missing(rank: int, since: int = 10) -> Finding:
    return Finding("rank_missing", rank, None, since, 5.0, f"rank {rank} is missing")


def launch_on_nodes(
    server: ServerProcess, run_id: str, stop: int | None = None
) -> list[subprocess.Popen[bytes]]:
    """WORLD rank processes of one job: ranks 0-7 on node-a, 8-15 on node-b, node-b's
    forward three times as slow and, with ``stop``, its ranks ending at that step."""
    procs = []
    for rank in range(WORLD):
        node = "node-a" if rank < 8 else "node-b"
        env = {
            **os.environ,
            "RANK": str(rank), "WORLD_SIZE": str(WORLD), "LOCAL_RANK": str(rank % 8),
            "INSTANTML_RUN_ID": run_id, "INSTANTML_API_BASE_URL": server.url,
            "INSTANTML_API_KEY": server.admin_key, "INSTANTML_NODE": node,
        }  # fmt: skip
        extra = ["--slow", "3"] if node == "node-b" else []
        if node == "node-b" and stop is not None:
            extra += ["--exit-at", str(stop)]
        args = [sys.executable, str(JOB), "--steps", "150", "--delay", str(0.1 * rank),
                *extra]  # fmt: skip
        procs.append(subprocess.Popen(args, env=env))
    return procs


def test_a_whole_node_missing_is_one_finding() -> None:
    activity = _activity({r: "a" if r < 4 else "b" for r in range(8)})
    found = node_missing([_missing(r, 10 + r) for r in (4, 5, 6, 7)], set(), activity, 8)
    (one,) = found
    assert (one.kind, one.rank, one.since_step) == ("node_missing", 4, 14)
    assert "node b" in one.message and "ranks (4-7)" in one.message


def test_part_of_a_node_missing_stays_per_rank_or_waits() -> None:
    activity = _activity({r: "a" if r < 4 else "b" for r in range(8)})
    # Rank 5 missing, its node-mates sending: a rank's problem.
    assert [f.kind for f in node_missing([_missing(5)], set(), activity, 8)] == ["rank_missing"]
    # Ranks 4 and 5 missing, 6 and 7 behind and about to be: wait for them.
    assert node_missing([_missing(4), _missing(5)], {6, 7}, activity, 8) == []
    # A rank that said no node, or a node of one rank, stays a rank.
    lone = _activity({0: "a", 1: "a", 2: None, 3: "c"})
    assert [f.rank for f in node_missing([_missing(2), _missing(3)], set(), lone, 4)] == [2, 3]


def test_a_slow_node_then_a_dead_node(
    start_server: Callable[..., ServerProcess], receiver: Receiver
) -> None:
    server = start_server()
    run_id = f"nodes-{uuid.uuid4().hex[:8]}"
    with _api(server) as api:
        hook = {"url": receiver.url, "kinds": ["rank_missing", "node_missing"]}
        assert api.post("/api/webhooks", json=hook).status_code == 201
        procs = launch_on_nodes(server, run_id, stop=STOP)
        for proc in procs:
            proc.wait(timeout=180)
        assert [p.returncode for p in procs] == [0] * 8 + [1] * 8

        # The slow node, by its slowest rank's score.
        straggling = api.get(
            f"/api/runs/{run_id}/stragglers", params={"key": "perf/forward_ms"}
        ).json()
        by_node = {n["node"]: n for n in straggling["nodes"]}
        assert by_node["node-b"]["straggler"] and by_node["node-b"]["score"] < 0.75
        assert by_node["node-a"]["score"] > 0.75 and not by_node["node-a"]["straggler"]
        assert straggling["nodes"][0]["node"] == "node-b"  # slowest first
        got = summary(api, run_id)
        nodes = {n["node"]: n for n in got["nodes"]}
        assert nodes["node-a"]["ranks"] == list(range(8))
        assert nodes["node-b"]["ranks"] == list(range(8, 16))
        assert all(r["node"] == ("node-a" if r["rank"] < 8 else "node-b") for r in got["ranks"])

        # The dead node: one alert naming it, one post, no alert per rank.
        _wait("node_missing", lambda: any(a["kind"] == "node_missing" for a in alerts(api, run_id)),
              seconds=LAG + 40)  # fmt: skip
        time.sleep(4)  # another alert, if any, would have opened by now
        missing = [a for a in alerts(api, run_id) if a["kind"] in ("rank_missing", "node_missing")]
        (alert,) = missing
        assert alert["kind"] == "node_missing" and "node-b" in alert["message"]
        assert "8-15" in alert["message"] and not alert["resolved"]
        assert {m["rank"] for m in summary(api, run_id)["coverage"]["missing"]} == set(range(8, 16))
        nodes = {n["node"]: n for n in summary(api, run_id)["nodes"]}
        assert nodes["node-b"]["missing_ranks"] == list(range(8, 16))
        assert nodes["node-a"]["missing_ranks"] == []
        _wait("its post", lambda: receiver.alerts(run_id))
        time.sleep(1.0)
        (post,) = receiver.alerts(run_id)
        assert post["alert"]["kind"] == "node_missing"
