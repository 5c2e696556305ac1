"""The uploader's contract: torn lines, dead letters, idempotent re-sync, one uploader per
spool, a refused key, and the background uploader started by init."""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest

import instantml as im
from instantml.server.process import ServerProcess, free_port
from instantml.spool import segments
from instantml.spool.uploader import DEAD_LETTER
from tests.helpers import admin_client, hung_peer, stored_keys, stored_rank_points
from tests.spool.conftest import sync, sync_process


def _log(spool: Path, run_id: str, steps: int = 10, world: int = 2) -> None:
    run = im.init(
        project="spool",
        run_id=run_id,
        upload_mode="spool",
        spool_dir=str(spool),
        base_url="http://127.0.0.1:9",
    )
    for step in range(steps):
        for rank in range(world):
            run.log_rank_metrics(
                {"loss": float(step + rank)}, step=step, rank=rank, world_size=world
            )
    run.finish()


@contextlib.contextmanager
def _peer(kind: str) -> Iterator[str]:
    """An address with nothing listening ("down"), or a peer that never answers ("hung")."""
    if kind == "down":
        yield f"http://127.0.0.1:{free_port()}"
        return
    with hung_peer() as url:
        yield url


def _event_line(run_id: str, event_id: str, body: dict[str, object]) -> bytes:
    return (
        orjson.dumps(
            {
                "version": 1,
                "event_id": event_id,
                "sequence": 1,
                "run_id": run_id,
                "timestamp": 0.0,
                "request": {"method": "POST", "path": f"/runs/{run_id}/rank-metrics", "body": body},
            }
        )
        + b"\n"
    )


def test_event_lines_have_the_documented_shape(tmp_path: Path) -> None:
    _log(tmp_path, "shape", steps=1, world=1)
    (segment,) = segments.list_segments(tmp_path)
    first, second, last = (orjson.loads(line) for line in segment.read_bytes().splitlines())
    assert first.keys() == {"version", "event_id", "sequence", "run_id", "timestamp", "request"}
    assert first["request"] == {
        "method": "POST",
        "path": "/runs",
        "body": {"project": "spool", "id": "shape"},
    }
    assert second["request"]["path"] == "/runs/shape/rank-metrics"
    assert [first["sequence"], second["sequence"], last["sequence"]] == [1, 2, 3]
    assert last["request"] == {  # the rank that finishes: the server tells lost ranks by it
        "method": "PATCH",
        "path": "/runs/shape",
        "body": {"status": "finished", "rank": 0},
    }


def test_torn_last_line_and_a_bad_event(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    spool = tmp_path / "spool"
    _log(spool, "torn", steps=5)
    (segment,) = segments.list_segments(spool)
    good = {"metrics": {"loss": 9.0}, "step": 99, "rank": 0, "world_size": 2}
    with segment.open("ab") as handle:  # as a writer killed mid-line would leave it
        handle.write(_event_line("torn", "bad-1", {**good, "weight": 0}))
        handle.write(_event_line("torn", "good-1", good))
        handle.write(_event_line("torn", "cut", good)[:60])
    server = start_server()
    out = sync(spool, server.url, server.admin_key)
    assert out.returncode == 0, out.stderr
    assert "1 refused" in out.stdout and "1 torn" in out.stdout
    with admin_client(server) as api:
        points = stored_rank_points(api, "torn", "loss")
    assert len(points) == 11 and points[-1][:3] == [99, 0, 9.0]
    dead = [orjson.loads(line) for line in (spool / DEAD_LETTER).read_bytes().splitlines()]
    assert [d["status"] for d in dead] == [422, None]
    assert "weight" in dead[0]["reason"] and dead[0]["event"]["event_id"] == "bad-1"
    assert "torn" in dead[1]["reason"]
    assert segments.list_segments(spool) == []


def test_the_same_spool_synced_twice_changes_nothing(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    spool, copy = tmp_path / "spool", tmp_path / "copy"
    _log(spool, "twice")
    shutil.copytree(spool, copy)
    server = start_server()
    first = sync(spool, server.url, server.admin_key)
    assert "22 events delivered, 0 already" in first.stdout, first.stdout
    again = sync(spool, server.url, server.admin_key)
    assert "0 events delivered, 0 already" in again.stdout
    replay = sync(copy, server.url, server.admin_key)  # the same events sent a second time
    assert "0 events delivered, 22 already delivered" in replay.stdout, replay.stdout
    with admin_client(server) as api:
        assert len(stored_rank_points(api, "twice", "loss")) == 20


def test_one_uploader_per_spool(tmp_path: Path, start_server: Callable[..., ServerProcess]) -> None:
    spool = tmp_path / "spool"
    _log(spool, "lock")
    server = start_server()
    follower = sync_process(spool, server.url, server.admin_key, "--follow")
    try:
        deadline = time.monotonic() + 30
        while segments.list_segments(spool) and time.monotonic() < deadline:
            time.sleep(0.05)
        second = sync(spool, server.url, server.admin_key)
        assert second.returncode == 3 and "another uploader" in second.stderr
    finally:
        follower.terminate()
        out, _ = follower.communicate(timeout=30)
    assert follower.returncode == 0 and "22 events delivered" in out
    # The lock dies with its holder: a new uploader may start at once.
    assert sync(spool, server.url, server.admin_key).returncode == 0


def test_a_refused_key_stops_the_upload_and_keeps_the_spool(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    spool = tmp_path / "spool"
    _log(spool, "denied")
    server = start_server()
    out = sync(spool, server.url, "iml_000000000000_nope")
    assert out.returncode == 1 and "401" in out.stderr and "intact" in out.stderr
    assert (
        len(segments.list_segments(spool)) == 1
        and segments.read_acked(segments.list_segments(spool)[0]) == 0
    )
    assert sync(spool, server.url, server.admin_key).returncode == 0


BACKGROUND = """
import sys, instantml as im
run = im.init(project="bg", run_id=sys.argv[2], upload_mode="spool", spool_dir=sys.argv[1],
              spool_uploader=True)
for step in range(50):
    run.log_rank_metrics({"loss": float(step)}, step=step, rank=0, world_size=1)
run.finish()
"""


def test_background_uploader_outlives_training(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    server = start_server()
    spool, run_id = tmp_path / "spool", f"bg-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "INSTANTML_API_BASE_URL": server.url,
        "INSTANTML_API_KEY": server.admin_key,
    }
    subprocess.run(
        [sys.executable, "-c", BACKGROUND, str(spool), run_id], env=env, check=True, timeout=60
    )
    deadline = time.monotonic() + 30
    with admin_client(server) as api:
        while time.monotonic() < deadline and len(stored_rank_points(api, run_id, "loss")) < 50:
            time.sleep(0.1)
        assert len(stored_rank_points(api, run_id, "loss")) == 50
        assert api.get(f"/runs/{run_id}").json()["run"]["status"] == "finished"
    while time.monotonic() < deadline and segments.list_segments(spool):
        time.sleep(0.1)
    assert segments.list_segments(spool) == []
    assert "events delivered" in (spool / "uploader.log").read_text()


def test_spool_mode_makes_no_network_call(tmp_path: Path) -> None:
    # No server, an unreachable address, and no exception: init and logging only write files.
    _log(tmp_path / "spool", "offline")
    assert len(segments.list_segments(tmp_path / "spool")) == 1


def test_bad_fsync_policy_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="fsync"):
        im.init(project="p", upload_mode="spool", spool_dir=str(tmp_path), spool_fsync="sometimes")


def test_unwritable_spool_counts_and_warns(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.warns(RuntimeWarning, match="spool"):
        run = im.init(project="p", upload_mode="spool", spool_dir=str(blocker / "spool"))
    for step in range(5):
        run.log_rank_metrics({"x": 1.0}, step=step, rank=0, world_size=1)
    assert run.dropped_events == 6  # the run creation and five points
    run.finish()


def test_stored_keys_after_sync(tmp_path: Path, start_server: Callable[..., ServerProcess]) -> None:
    spool = tmp_path / "spool"
    _log(spool, "keys")
    server = start_server()
    sync(spool, server.url, server.admin_key)
    with admin_client(server) as api:
        assert [k["key"] for k in stored_keys(api, "keys")] == ["loss"]


class _Stderr:
    """Collects a process's stderr on a thread (so a silent process never blocks a test)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        self._proc = proc
        self.lines: list[str] = []
        stream = proc.stderr
        self._thread = threading.Thread(target=lambda: self.lines.extend(stream), daemon=True)
        self._thread.start()

    def wait_for(self, text: str, timeout: float = 30) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(text in line for line in list(self.lines)):
                return True
            time.sleep(0.02)
        return False

    def text(self) -> str:
        """Everything it wrote (call once the process has exited); closes its pipes."""
        self._thread.join(10)
        for stream in (self._proc.stdout, self._proc.stderr):
            if stream is not None:
                stream.close()
        return "".join(self.lines)


def _intact(spool: Path, segments_count: int = 1) -> bool:
    found = segments.list_segments(spool)
    return len(found) == segments_count and all(segments.read_acked(s) == 0 for s in found)


def test_an_unreachable_server_is_said_once_retried_and_given_up(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    _log(spool, "away")
    url = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    out = sync(spool, url, "iml_000000000000_x", "--retry-for", "3")
    took = time.monotonic() - started
    assert out.returncode == 1
    assert 3 <= took < 20, took
    unreachable = [
        x for x in out.stderr.splitlines() if "server unreachable" in x and "error:" not in x
    ]
    # Said when the state changed, not at every try (there were several in 3 s).
    assert len(unreachable) == 1, out.stderr
    assert re.search(
        rf"server unreachable at {url}: ConnectError: .*; retrying in \d+\.\d s$", unreachable[0]
    ), unreachable[0]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: gave up after 3 s: server unreachable at {url}")
    assert "The spool is intact" in last and "Traceback" not in out.stderr
    assert _intact(spool)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("peer", ["down", "hung"])
def test_a_signal_stops_the_uploader_within_a_second(
    tmp_path: Path, sig: signal.Signals, peer: str
) -> None:
    spool = tmp_path / "spool"
    _log(spool, "stop")
    with _peer(peer) as url:
        proc = sync_process(spool, url, "iml_000000000000_x", "--follow")
        err = _Stderr(proc)
        try:
            if peer == "down":
                assert err.wait_for("server unreachable")
            else:
                time.sleep(1.5)  # its first request is in flight, and never answered
            proc.send_signal(sig)
            started = time.monotonic()
            proc.wait(timeout=10)
            took = time.monotonic() - started
        finally:
            proc.kill()
            proc.wait()
            err.text()
    assert took < 1.0, took
    assert proc.returncode == 0  # --follow ends by a signal: that is how it is stopped
    assert _intact(spool)


def test_an_interrupted_drain_says_the_rest_stays(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    _log(spool, "rest")
    url = f"http://127.0.0.1:{free_port()}"
    proc = sync_process(spool, url, "iml_000000000000_x")
    err = _Stderr(proc)
    try:
        assert err.wait_for("server unreachable")
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=10)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 1
    assert "stopped before" in err.text() and "the rest stays in it" in err.text()
    assert _intact(spool)


def test_the_background_uploader_logs_the_outage(tmp_path: Path) -> None:
    spool, port = tmp_path / "spool", free_port()
    env = {
        **os.environ,
        "INSTANTML_API_BASE_URL": f"http://127.0.0.1:{port}",
        "INSTANTML_API_KEY": "iml_000000000000_x",
    }
    subprocess.run(
        [sys.executable, "-c", BACKGROUND, str(spool), "bg-away"], env=env, check=True, timeout=60
    )
    log = spool / "uploader.log"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "server unreachable" not in _read(log):
        time.sleep(0.1)
    assert f"server unreachable at http://127.0.0.1:{port}: ConnectError" in _read(log)
    # A server appears there, refusing its key: the uploader stops, spool intact.
    with ServerProcess(tmp_path / "data", port=port, env={"HOME": str(tmp_path / "h")}):
        while time.monotonic() < deadline + 30 and segments.locked(spool / "uploader.lock"):
            time.sleep(0.1)
    assert not segments.locked(spool / "uploader.lock")
    assert "401" in _read(log) and _intact(spool)


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def test_a_run_refused_by_the_server_is_set_aside_whole(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    server = start_server()
    with admin_client(server) as api:
        assert api.post("/runs", json={"project": "newcomer", "id": "taken"}).status_code == 201
    spool = tmp_path / "spool"
    run = im.init(project="other", run_id="taken", upload_mode="spool", spool_dir=str(spool))
    for step in range(20):
        run.log_rank_metrics({"loss": 1.0}, step=step, rank=0, world_size=1)
    run.finish()
    _log(spool, "fine")  # another run in the same spool goes through
    out = sync(spool, server.url, server.admin_key)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "the server refused to create its run (409)" in out.stderr
    assert "already exists in another project ('newcomer')" in out.stderr
    assert "1 refused runs set aside" in out.stdout
    with admin_client(server) as api:
        assert stored_keys(api, "taken") == []  # nothing landed in newcomer's run
        assert len(stored_rank_points(api, "fine", "loss")) == 20
    (kept,) = (spool / "refused").glob("*.jsonl")
    assert len(kept.read_bytes().splitlines()) == 22  # creation, 20 points, status
    assert "409" in kept.with_name(kept.name + ".reason").read_text()
    assert segments.list_segments(spool) == []


def test_spool_dir_mistakes_are_one_line(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    server = start_server()
    a_file = tmp_path / "file"
    a_file.write_text("x")
    not_a_spool = tmp_path / "project"
    not_a_spool.mkdir()
    cases = [
        (a_file, f"error: --spool-dir {a_file} is a file, not a spool directory"),
        (tmp_path / "typo", f"error: no spool at {tmp_path / 'typo'}: nothing was spooled there"),
        (not_a_spool, f"error: {not_a_spool} is not a spool directory (it has no segments/"),
    ]
    for path, message in cases:
        out = sync(path, server.url, server.admin_key)
        assert out.returncode == 1, out
        assert out.stderr.strip().splitlines()[-1].startswith(message), out.stderr
        assert len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "typo").exists() and list(not_a_spool.iterdir()) == []


def test_hostile_lines_spliced_into_a_segment_are_dead_lettered(
    tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    """Random bytes, a 20 MB line, JSON of the wrong shapes and types spliced between good
    events: the uploader delivers every good event, dead-letters the rest, and finishes."""
    spool = tmp_path / "spool"
    _log(spool, "hostile", steps=5)
    (segment,) = segments.list_segments(spool)
    good = {"metrics": {"loss": 7.0}, "step": 50, "rank": 1, "world_size": 2}
    rng = random.Random(3)
    hostile = [
        bytes(rng.randrange(256) for _ in range(300)).replace(b"\n", b" ") + b"\n",  # noise
        b"\xff\xfe\x00 not utf-8 at all\n",
        b"[1, 2, 3]\n",  # JSON, not an event
        b"42\n",
        b'{"event_id": 7, "request": "POST"}\n',  # an event of the wrong types
        b'{"event_id": "x", "request": {"method": "POST", "path": 5, "body": []}}\n',
        b'{"event_id": "' + b"a" * (20 * 1024 * 1024) + b'"}\n',  # a 20 MB line
        _event_line("hostile", "wrong-metric", {**good, "metrics": {"loss": "high"}}),
        _event_line("hostile", "good-after", good),
    ]
    with segment.open("ab") as handle:
        for line in hostile:
            handle.write(line)
    server = start_server()
    out = sync(spool, server.url, server.admin_key)
    assert out.returncode == 0, out.stderr[-2000:]
    with admin_client(server) as api:
        points = stored_rank_points(api, "hostile", "loss")
    assert len(points) == 11 and [50, 1, 7.0] in [p[:3] for p in points]
    dead = (spool / DEAD_LETTER).read_bytes().splitlines()
    assert len(dead) == len(hostile) - 1  # everything but the good event
    assert segments.list_segments(spool) == []
    # The server took no harm from any of it.
    with admin_client(server) as api:
        assert api.get("/healthz").status_code == 200


def test_a_pass_while_a_writer_opens_its_segment_loses_nothing(
    tmp_path: Path, start_server: Callable[..., ServerProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An uploader pass that looks at the spool just as a writer creates its segment, after
    the file exists but before the writer holds its lock: the segment must not be taken for
    a finished one (and removed, its later events written to an unlinked file). Seen in the
    demo, under load, as one rank's points ending at step 11."""
    import fcntl

    from instantml.spool.uploader import Uploader

    spool = tmp_path / "spool"
    server = start_server()
    uploader = Uploader(spool, server.url, server.admin_key)
    passes: list[list[Path]] = []

    class _FlockAfterAPass:
        def __getattr__(self, name: str) -> object:
            return getattr(fcntl, name)

        @staticmethod
        def flock(fd: int, operation: int) -> None:
            if operation == fcntl.LOCK_EX:  # the writer's lock (the uploader's probe: NB)
                passes.append(segments.list_segments(spool))
                uploader.drain_once()  # the interleaving the scheduler can produce
            fcntl.flock(fd, operation)

    monkeypatch.setattr(segments, "fcntl", _FlockAfterAPass())
    with uploader:
        run = im.init(project="spool", run_id="opening", upload_mode="spool", spool_dir=str(spool))
        monkeypatch.undo()
        for step in range(20):
            run.log_rank_metrics({"loss": float(step)}, step=step, rank=0, world_size=1)
        run.finish()
        assert uploader.drain_once() == 0
    with admin_client(server) as api:
        assert [p[0] for p in stored_rank_points(api, "opening", "loss")] == list(range(20))
    assert passes == [[]]  # the segment was not there to be seen before it was locked


def test_until_done_drains_a_segment_made_as_it_finishes(
    tmp_path: Path, start_server: Callable[..., ServerProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The background uploader (``--until-done``) finishes the segments it saw just as
    another rank makes its own: that rank saw the lock held and started no uploader, so
    the one running must drain its segment before exiting. Seen in the demo under load:
    an uploader delivered the one finished segment it saw and exited, seven others stayed."""
    from instantml.spool.uploader import Uploader

    spool = tmp_path / "spool"
    server = start_server()
    uploader = Uploader(spool, server.url, server.admin_key)
    first = im.init(
        project="spool", run_id="first", upload_mode="spool", spool_dir=str(spool),
        spool_uploader=False,
    )  # fmt: skip
    first.log_rank_metrics({"loss": 1.0}, step=0, rank=0, world_size=2)
    first.finish()
    drain = uploader.drain_once
    late_started: list[bool] = []

    def a_pass_then_a_rank_starts() -> int:
        left = drain()
        if left == 0 and not late_started:  # the pass that would end the drain
            late_started.append(True)
            late = im.init(project="spool", run_id="late", upload_mode="spool",
                           spool_dir=str(spool))  # fmt: skip
            for step in range(5):
                late.log_rank_metrics({"loss": float(step)}, step=step, rank=1, world_size=2)
            late.finish()
        return left

    monkeypatch.setattr(uploader, "drain_once", a_pass_then_a_rank_starts)
    with uploader:
        uploader.run(until_done=True)
    assert late_started and segments.list_segments(spool) == []
    with admin_client(server) as api:
        assert [p[0] for p in stored_rank_points(api, "first", "loss")] == [0]
        assert [p[0] for p in stored_rank_points(api, "late", "loss")] == list(range(5))
