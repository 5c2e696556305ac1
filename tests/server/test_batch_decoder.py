"""Large ``/api/ingest`` batches are decoded in a process of their own
(server/write/decode_pool.py): answered and stored as when decoded in the server, a decoding
process that dies costs no batch (the next is decoded in the server while another starts),
and none outlives the server."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from instantml.server.process import ServerProcess
from tests.helpers import stored_rank_points

OFFLOAD_ALL = {"INSTANTML_DECODE_PROCESSES": "1", "INSTANTML_DECODE_MIN_BYTES": "0"}


def _children(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(entry.name))
    return found


def _decoders(server: ServerProcess) -> set[int]:
    """The server's decoding processes (spawned: their command line says so)."""
    assert server.proc is not None
    pids = set()
    for pid in _children(server.proc.pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"multiprocessing.spawn" in cmdline and b"spawn_main" in cmdline:
            pids.add(pid)
    return pids


def _batch(run: str, first: int, n: int) -> dict[str, Any]:
    return {
        "events": [
            {
                "event_id": f"{run}-{i}",
                "request": {
                    "method": "POST",
                    "path": f"/runs/{run}/rank-metrics",
                    "body": {
                        "metrics": {"loss": i / 7, "gn": 2.5},
                        "step": i // 4,
                        "rank": i % 4,
                        "world_size": 4,
                        "weight": 2.0,
                    },
                },
            }
            for i in range(first, first + n)
        ]
    }


def test_batches_decoded_in_a_process_are_answered_and_stored_alike(
    start_server: Callable[..., ServerProcess],
) -> None:
    server = start_server(env=OFFLOAD_ALL)
    headers = {"Authorization": f"Bearer {server.admin_key}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as api:
        run = f"dec-{uuid.uuid4().hex[:8]}"
        assert api.post("/runs", json={"project": "t", "id": run}).status_code == 201

        def health() -> dict[str, int]:
            return dict(api.get("/healthz").json()["batch_decoder"])

        def send(first: int, n: int = 40) -> list[dict[str, Any]]:
            response = api.post("/api/ingest", json=_batch(run, first, n))
            assert response.status_code == 200, response.text
            return list(response.json()["results"])

        sent = 0
        deadline = time.monotonic() + 60
        while health()["batches"] == 0:  # the first batches start the process
            assert time.monotonic() < deadline, "no batch was decoded in a decoding process"
            results = send(sent)
            assert [r["status"] for r in results] == [200] * 40
            sent += 40
            time.sleep(0.05)
        assert _decoders(server)

        # Sent again, whole: each event a replay of its first answer.
        again = send(0)
        assert all(r["replayed"] and r["body"] == {"accepted": 2} for r in again)

        # The decoding process dies: the next batch is still answered (decoded here), and
        # a new process takes the batches after it.
        for pid in _decoders(server):
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
        results = send(sent)
        assert [r["status"] for r in results] == [200] * 40
        sent += 40
        assert health()["restarts"] == 1
        decoded = health()["batches"]
        deadline = time.monotonic() + 60
        while health()["batches"] == decoded:
            assert time.monotonic() < deadline, "no decoding process after one died"
            send(sent)
            sent += 40
            time.sleep(0.05)
        survivors = _decoders(server)
        assert survivors

        points = stored_rank_points(api, run, "loss")
        stored = {(step, rank): value for step, rank, value, *_ in points}
        assert stored == {(i // 4, i % 4): i / 7 for i in range(sent)}
    server.stop()
    assert not any(Path(f"/proc/{pid}").exists() for pid in survivors)


def test_decoding_processes_exit_when_the_server_is_killed(
    start_server: Callable[..., ServerProcess],
) -> None:
    server = start_server(env=OFFLOAD_ALL)
    headers = {"Authorization": f"Bearer {server.admin_key}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as api:
        run = f"dec-{uuid.uuid4().hex[:8]}"
        assert api.post("/runs", json={"project": "t", "id": run}).status_code == 201
        deadline = time.monotonic() + 60
        sent = 0
        while api.get("/healthz").json()["batch_decoder"]["batches"] == 0:
            assert time.monotonic() < deadline, "no batch was decoded in a decoding process"
            assert api.post("/api/ingest", json=_batch(run, sent, 10)).status_code == 200
            sent += 10
            time.sleep(0.05)
    decoders = _decoders(server)
    assert decoders and server.proc is not None
    server.proc.kill()  # no shutdown: the pool is never told
    server.proc.wait()
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in decoders):
        assert time.monotonic() < deadline, "a decoding process outlived its server"
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
