"""Chaos: rank processes logging while the server and the uploader are SIGKILLed and
restarted at random; then nothing a ``log_*`` call returned from is lost or doubled.

    .venv/bin/python bench/chaos.py [--seconds 600] [--mode spool|async] [--ranks 8] [--seed 0]

``spool`` mode: each rank appends to the spool and an ``instantml sync --follow`` uploader
sends it; the server is killed every 3-15 s (uniform) and restarted after 0-1 s, the
uploader killed every 3-15 s and restarted at once. ``async`` mode: each rank sends from
its own background thread straight to the server being killed (no uploader); loss is
allowed there only as the SDK's counted drops, which must equal what is missing.

Then (the server up, the spool drained): every (step, rank) whose ``log_rank_metrics``
returned is stored once with its value, nothing else is stored, the org's usage counts
each point once, and the Distributed summary equals the numpy reference.
``tests/reliability/test_chaos.py`` runs a short form of each mode in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from instantml.server.process import ServerProcess, StartFailed

ROOT = Path(__file__).resolve().parents[1]
KEYS = ("loss", "perf/step_ms")

RANK = textwrap.dedent(
    """
    import json, sys, time
    import instantml as im
    spool, run_id, rank, world, seconds, ledger, mode = sys.argv[1:8]
    rank, world, seconds = int(rank), int(world), float(seconds)
    options = {"spool_dir": spool} if mode == "spool" else {"finish_timeout": 300.0}
    run = im.init(project="chaos", run_id=run_id, upload_mode=mode, **options)
    end = time.monotonic() + seconds
    step = 0
    with open(ledger, "a", buffering=1) as out:
        while time.monotonic() < end:
            loss = ((step * 7919 + rank * 104729) % 1000) / 1000.0 + 0.01 * rank
            run.log_rank_metrics({"loss": loss, "perf/step_ms": 10.0 + rank + (step % 5)},
                                 step=step, rank=rank, world_size=world)
            out.write(f"{step}\\n")  # written only once the call returned
            step += 1
            time.sleep(0.005)
        run.finish()
        out.write(json.dumps({"dropped": run.dropped_events}) + "\\n")
    """
)


def expected_loss(step: int, rank: int) -> float:
    return ((step * 7919 + rank * 104729) % 1000) / 1000.0 + 0.01 * rank


@dataclass
class Report:
    mode: str
    seconds: float
    server_kills: int = 0
    uploader_kills: int = 0
    returned: int = 0  # log_rank_metrics calls that returned (events)
    stored: int = 0  # (step, rank) points stored per key
    lost: int = 0
    unexpected: int = 0  # stored but never returned, or with another value
    dropped: int = 0  # async mode: counted by the SDK
    usage: int = 0
    usage_expected: int = 0
    summary_matches: bool = False
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def lines(self) -> list[str]:
        return [
            f"mode {self.mode}, {self.seconds:g} s: server killed {self.server_kills} times,"
            f" uploader {self.uploader_kills} times",
            f"events returned {self.returned:,}; stored {self.stored:,} per key; lost"
            f" {self.lost}; unexpected {self.unexpected}; counted drops {self.dropped}",
            f"usage {self.usage:,} points (expected {self.usage_expected:,}); summary equals"
            f" the reference: {self.summary_matches}",
            *(f"PROBLEM: {p}" for p in self.problems),
        ]


class Killer(threading.Thread):
    """SIGKILLs a process every ``low``-``high`` seconds and restarts it."""

    def __init__(
        self, name: str, restart: Any, kill: Any, rng: random.Random, low: float, high: float
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.restart, self.kill, self.rng = restart, kill, rng
        self.low, self.high = low, high
        self.stop = threading.Event()
        self.kills = 0

    def run(self) -> None:
        while not self.stop.wait(self.rng.uniform(self.low, self.high)):
            self.kill()
            self.kills += 1
            self.restart()


def chaos(
    workdir: Path, seconds: float, mode: str = "spool", ranks: int = 8, seed: int = 0,
    kill_every: tuple[float, float] = (3.0, 15.0), stores: dict[str, str] | None = None,
) -> Report:  # fmt: skip
    """``stores``: the server's storage settings (INSTANTML_METADATA_URL, ...), default
    the data dir's DuckDB file."""
    rng = random.Random(seed)
    report = Report(mode, seconds)
    data, spool = workdir / "data", workdir / "spool"
    server_env = {"HOME": str(workdir), **(stores or {})}
    server = ServerProcess(data, env=server_env)
    server.start()
    port = server.port
    env = {
        **os.environ,
        "HOME": str(workdir),
        "INSTANTML_API_BASE_URL": server.url,
        "INSTANTML_API_KEY": server.admin_key,
    }
    run_id = f"chaos-{uuid.uuid4().hex[:8]}"
    lock = threading.Lock()

    def restart_server() -> None:
        nonlocal server
        time.sleep(rng.uniform(0.0, 1.0))
        for _ in range(100):
            try:
                server = ServerProcess(data, port=port, env=server_env)
                server.start()
                return
            except StartFailed:  # the port not yet free: again
                time.sleep(0.2)
        raise RuntimeError("the server did not restart")

    def kill_server() -> None:
        with lock:
            if server.proc is not None:
                server.proc.kill()
                server.proc.wait()

    uploader: subprocess.Popen[bytes] | None = None
    up_log = (workdir / "uploader.log").open("ab")

    def start_uploader() -> None:
        nonlocal uploader
        uploader = subprocess.Popen(
            [sys.executable, "-m", "instantml", "sync", "--follow", "--spool-dir", str(spool)],
            env=env, stdout=up_log, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def kill_uploader() -> None:
        if uploader is not None:
            uploader.kill()
            uploader.wait()

    ledgers = [workdir / f"rank{r}.ledger" for r in range(ranks)]
    procs = []
    for r in range(ranks):
        argv = [str(spool), run_id, str(r), str(ranks), str(seconds), str(ledgers[r]), mode]
        with (workdir / f"rank{r}.log").open("ab") as log:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", RANK, *argv],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                )
            )
    killers = [Killer("server-killer", restart_server, kill_server, rng, *kill_every)]
    if mode == "spool":
        start_uploader()
        killers.append(Killer("uploader-killer", start_uploader, kill_uploader, rng, *kill_every))
    for killer in killers:
        killer.start()
    for proc in procs:
        proc.wait(timeout=seconds + 600)
    for killer in killers:
        killer.stop.set()
        killer.join()
    report.server_kills = killers[0].kills
    report.uploader_kills = killers[1].kills if len(killers) > 1 else 0
    if mode == "spool":  # drain what is left, then stop following
        kill_uploader()
        drained = subprocess.run(
            [sys.executable, "-m", "instantml", "sync", "--spool-dir", str(spool)],
            env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        if drained.returncode != 0:
            report.problems.append(
                f"the final sync exited {drained.returncode}: {drained.stdout[-300:]}"
            )
    up_log.close()
    try:
        _verify(report, server, run_id, ranks, ledgers, mode)
    finally:
        server.stop()
    return report


def _verify(
    report: Report, server: ServerProcess, run_id: str, ranks: int, ledgers: list[Path], mode: str
) -> None:
    sys.path.insert(0, str(ROOT))
    from tests.summary.compare import assert_matches
    from tests.summary.reference import Point, reference

    returned: set[tuple[int, int]] = set()
    for rank, ledger in enumerate(ledgers):
        for line in ledger.read_text().splitlines():
            if line.startswith("{"):
                report.dropped += int(json.loads(line)["dropped"])
            elif line:
                returned.add((int(line), rank))
    report.returned = len(returned)
    headers = {"Authorization": f"Bearer {server.admin_key}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=120) as api:
        stored_by_key = {}
        for key in KEYS:
            body = api.get(f"/api/runs/{run_id}/rank-points", params={"metric": key}).json()
            value = body["columns"].index("value")
            points = body["points"]
            stored_by_key[key] = {(p[0], p[1]): p[value] for p in points}
            if len(points) != len(stored_by_key[key]):
                report.problems.append(f"{key}: a (step, rank) stored twice")
        loss = stored_by_key["loss"]
        report.stored = len(loss)
        report.lost = len(returned - set(loss))
        wrong = {k for k, v in loss.items() if k not in returned or v != expected_loss(*k)}
        report.unexpected = len(wrong)
        if set(stored_by_key["perf/step_ms"]) != set(loss):
            report.problems.append("the two keys hold different (step, rank) points")
        usage = api.get("/api/usage").json()
        report.usage = int(usage["used"])
        report.usage_expected = len(KEYS) * len(loss)
        got = api.get(f"/api/runs/{run_id}/distributed", params={"key": "loss"}).json()
    if mode == "spool" and report.lost:
        report.problems.append(f"{report.lost} returned events lost")
    if mode == "async" and report.lost != report.dropped:
        report.problems.append(f"{report.lost} lost but {report.dropped} counted as dropped")
    if report.unexpected:
        report.problems.append(f"{report.unexpected} points stored that no call returned")
    if report.usage != report.usage_expected:
        report.problems.append(f"usage {report.usage} for {report.usage_expected} points")
    writes = [Point(step, rank, value, 1.0, None, ranks) for (step, rank), value in loss.items()]
    try:
        assert_matches(got, reference(writes), 1.0)
        report.summary_matches = True
    except AssertionError as exc:
        report.problems.append(f"the summary differs from the reference: {str(exc)[:300]}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--mode", choices=["spool", "async"], default="spool")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = chaos(Path(tmp), args.seconds, args.mode, args.ranks, args.seed)
    print("\n".join(report.lines()))
    return 0 if report.ok else 1


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())
