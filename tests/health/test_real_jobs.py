"""Run health under real timing (docs/reference.md, "Run health"): real multi-process jobs, each
rank its own process started seconds apart, logging through the SDK as users do, with
20-60 ms steps and per-batch noise on the loss, on the server's default thresholds.

- A healthy 6-rank job in async mode, and the same in spool mode with the background
  uploader (which drains the ranks' segments in turn), get no alert, open or resolved,
  and no webhook post.
- A faulty job (one rank 3x slower in its forward, one logging NaN from a known step, one
  that ``os._exit``s at a known step) gets exactly those alerts, once each, with the
  missing rank's ``since_step`` equal to the summary's ``first_missing_step``; its webhook
  post comes about ``lag_seconds`` after the exit, and the run lists the rank as lost."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from instantml.server.process import ServerProcess
from tests.health.test_run_health import Receiver, _api, _hook, _wait

JOB = Path(__file__).with_name("rank_job.py")
STEPS = 150
LAG = 15.0  # the default lag_seconds: these jobs run on the server's defaults


def launch(
    server: ServerProcess,
    run_id: str,
    world: int,
    mode: str = "async",
    spool: Path | None = None,
    extra: dict[int, list[str]] | None = None,
) -> list[subprocess.Popen[bytes]]:
    """``world`` rank processes of one job, rank r starting 0.4 r seconds after rank 0."""
    procs = []
    for rank in range(world):
        env = {
            **os.environ,
            "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
            "INSTANTML_RUN_ID": run_id, "INSTANTML_API_BASE_URL": server.url,
            "INSTANTML_API_KEY": server.admin_key,
        }  # fmt: skip
        args = [sys.executable, str(JOB), "--steps", str(STEPS), "--mode", mode,
                "--delay", str(0.4 * rank), *(extra or {}).get(rank, [])]  # fmt: skip
        if spool is not None:
            args += ["--spool-dir", str(spool)]
        procs.append(subprocess.Popen(args, env=env))
    return procs


def alerts(api: httpx.Client, run_id: str) -> list[dict[str, Any]]:
    response = api.get(f"/api/runs/{run_id}/health")
    if response.status_code == 404:
        return []
    return list(response.json()["alerts"])


def summary(api: httpx.Client, run_id: str) -> dict[str, Any]:
    response = api.get(f"/api/runs/{run_id}/distributed", params={"key": "train/loss"})
    return dict(response.json()) if response.status_code == 200 else {}


def _healthy(
    start_server: Callable[..., ServerProcess], receiver: Receiver, tmp_path: Path, mode: str
) -> None:
    server = start_server()
    with _api(server) as api:
        _hook(api, receiver.url)
        run_id = f"healthy-{mode}-{uuid.uuid4().hex[:8]}"
        spool = tmp_path / "spool" if mode == "spool" else None
        procs = launch(server, run_id, 6, mode, spool)
        seen: list[dict[str, Any]] = []
        while any(p.poll() is None for p in procs):  # watched while it runs
            seen += alerts(api, run_id)
            time.sleep(0.5)
        assert [p.returncode for p in procs] == [0] * 6
        full = _wait(
            "every point delivered",
            lambda: (s := summary(api, run_id)) and s["coverage"]["full_steps"] == STEPS,
            seconds=120,
        )
        assert full and summary(api, run_id)["coverage"]["missing"] == []
        time.sleep(LAG + 2)  # anything the end of the job could raise is raised by now
        seen += alerts(api, run_id)
        assert seen == [], seen
        assert receiver.alerts(run_id) == []
        run = api.get(f"/runs/{run_id}").json()["run"]
        assert run["status"] == "finished" and run["ranks_lost"] == []


def test_a_healthy_async_job_gets_no_alert(
    start_server: Callable[..., ServerProcess], receiver: Receiver, tmp_path: Path
) -> None:
    _healthy(start_server, receiver, tmp_path, "async")


def test_a_healthy_spool_job_gets_no_alert(
    start_server: Callable[..., ServerProcess], receiver: Receiver, tmp_path: Path
) -> None:
    _healthy(start_server, receiver, tmp_path, "spool")


def test_a_faulty_job_gets_exactly_its_alerts(
    start_server: Callable[..., ServerProcess], receiver: Receiver, tmp_path: Path
) -> None:
    server = start_server()
    exit_file = tmp_path / "exit-time"
    with _api(server) as api:
        _hook(api, receiver.url)
        run_id = f"faulty-{uuid.uuid4().hex[:8]}"
        faults = {
            1: ["--slow", "3"],
            2: ["--nan-from", "40"],
            3: ["--exit-at", "60", "--exit-file", str(exit_file)],
        }
        procs = launch(server, run_id, 6, extra=faults)
        for proc in procs:
            proc.wait(timeout=120)
        assert [p.returncode for p in procs] == [0, 0, 0, 1, 0, 0]
        _wait("rank_missing", lambda: any(a["kind"] == "rank_missing" for a in alerts(api, run_id)),
              seconds=LAG + 30)  # fmt: skip
        time.sleep(3)  # a second alert, if any, would have opened by now
        found = alerts(api, run_id)
        kinds = {(a["kind"], a["rank"], a["key"]) for a in found}
        # The slow rank is also slow, and a true outlier, in its step time (no all-reduce
        # makes the ranks wait for one another here).
        timing = ("perf/forward_ms", "perf/step_time_ms")
        also = {(kind, 1, key) for kind in ("outlier_burst", "straggler") for key in timing}
        expected = {
            ("straggler", 1, "perf/forward_ms"),
            ("non_finite", 2, "train/loss"),
            ("rank_missing", 3, None),
        }
        assert expected <= kinds and kinds - expected <= also, found
        by_kind = {a["kind"]: a for a in found if a["rank"] in (2, 3)}
        assert by_kind["non_finite"]["since_step"] == 40
        (gone,) = summary(api, run_id)["coverage"]["missing"]
        # Its last step is what reached the server: an async batch still queued at the
        # os._exit is lost with the process.
        last = gone["last_seen_step"]
        assert gone["rank"] == 3 and last <= 59
        assert by_kind["rank_missing"]["since_step"] == gone["first_missing_step"] == last + 1
        assert all(not a["resolved"] for a in found)
        # One post per alert (each delivered by the outbox's thread, which a loaded machine
        # may hold up for a moment); the missing rank's came about lag_seconds after its exit.
        _wait("a post per alert", lambda: len(receiver.alerts(run_id)) >= len(found))
        time.sleep(1.0)  # a second post of one, if any, would have come by now
        posted = receiver.alerts(run_id)
        assert sorted(p["alert"]["id"] for p in posted) == sorted(a["id"] for a in found)
        (when,) = [t for t, (_, body) in zip(receiver.times, receiver.posts, strict=True)
                   if b'"rank_missing"' in body]  # fmt: skip
        # Lag counts from the rank's last event's arrival, which precedes the exit by up
        # to one async flush interval (0.5 s) and its upload: the post can come that much
        # sooner than LAG after the exit, never sooner than that.
        delay = when - float(exit_file.read_text())
        assert LAG - 1.0 <= delay <= LAG + 10, delay
        run = api.get(f"/runs/{run_id}").json()["run"]
        assert run["ranks_lost"] == [{"rank": 3, "last_step": last}]
