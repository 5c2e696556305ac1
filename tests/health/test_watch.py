"""``instantml watch``: the alerts of a run as they open and resolve, and exit codes a job
script can act on (3 fired, 0 finished healthy, 1 ended failed, 2 timeout or error)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable

import httpx

from instantml.server.process import ServerProcess
from tests.health.test_run_health import QUICK, WORLD, _api, _open, _run, _step, _wait


def _watch(server: ServerProcess, *args: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "INSTANTML_API_BASE_URL": server.url,
        "INSTANTML_API_KEY": server.admin_key,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "instantml", "watch", *args, "--interval", "0.2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _missing(api: httpx.Client, run: str, rank: int, steps: range) -> None:
    for step in steps:
        _step(api, run, step, {r: {"loss": 1.0} for r in range(WORLD) if r != rank})


def test_watch_prints_alerts_as_they_come_and_exits_as_a_script_needs(
    start_server: Callable[..., ServerProcess],
) -> None:
    server = start_server(env=QUICK)
    with _api(server) as api:
        # Watching a live run that only ever fails on stragglers: a rank goes missing and
        # comes back (printed both times), then the run finishes: exit 0.
        live = _run(api, "watch")
        _step(api, live, 0, {r: {"loss": 1.0} for r in range(WORLD)})
        watcher = _watch(server, live, "--fail-on", "straggler", "--timeout", "60")
        _missing(api, live, 2, range(1, 5))
        _wait("rank_missing", lambda: _open(api, live, "rank_missing"))
        time.sleep(0.6)  # the watcher looks every 0.2 s
        _step(api, live, 5, {r: {"loss": 1.0} for r in range(WORLD)})
        _wait("resolution", lambda: not _open(api, live, "rank_missing"))
        time.sleep(0.6)
        api.patch(f"/runs/{live}", json={"status": "finished"}).raise_for_status()
        out, err = watcher.communicate(timeout=30)
        assert watcher.returncode == 0, (out, err)
        lines = out.splitlines()
        assert any("OPEN" in x and "rank_missing rank 2 since step 1" in x for x in lines), out
        assert any("RESOLVED" in x and "rank_missing rank 2" in x for x in lines), out
        assert "finished healthy" in err

        # The same kind named in --fail-on: exit 3 as soon as it is open.
        fired = _run(api, "fired")
        _missing(api, fired, 6, range(4))
        _wait("rank_missing", lambda: _open(api, fired, "rank_missing"))
        watcher = _watch(server, fired, "--fail-on", "rank_missing,straggler")
        out, err = watcher.communicate(timeout=30)
        assert watcher.returncode == 3, (out, err)
        assert "rank_missing rank 6" in out and "failing" in err

        # Still running with no alert of the named kinds: timeout, exit 2.
        watcher = _watch(server, fired, "--fail-on", "straggler", "--timeout", "1")
        out, err = watcher.communicate(timeout=30)
        assert watcher.returncode == 2 and "still running" in err, (out, err)

        # A run that ended failed: 1. No such run, a bad kind: 2.
        failed = _run(api, "failed")
        api.patch(f"/runs/{failed}", json={"status": "failed"}).raise_for_status()
        watcher = _watch(server, failed)
        _, err = watcher.communicate(timeout=30)
        assert watcher.returncode == 1 and "ended failed" in err
        watcher = _watch(server, "no-such-run", "--timeout", "1")
        _, err = watcher.communicate(timeout=30)
        assert watcher.returncode == 2 and "not created within 1 s" in err, err
        watcher = _watch(server, fired, "--fail-on", "rank_gone")
        _, err = watcher.communicate(timeout=30)
        assert watcher.returncode == 2 and "unknown kind rank_gone" in err


def test_watch_started_before_its_run_waits_for_it(
    start_server: Callable[..., ServerProcess],
) -> None:
    """A job script starts the watch, then the job: the run is created seconds later."""
    server = start_server(env=QUICK)
    with _api(server) as api:
        later = "later-" + str(time.time_ns())
        watcher = _watch(server, later, "--fail-on", "rank_missing", "--timeout", "60")
        time.sleep(2.0)
        assert watcher.poll() is None  # still waiting, not "404"
        assert api.post("/runs", json={"project": "health", "id": later}).status_code == 201
        _missing(api, later, 3, range(4))
        out, err = watcher.communicate(timeout=30)
        assert watcher.returncode == 3, (out, err)
        assert "does not exist yet" in err and "rank_missing rank 3" in out
