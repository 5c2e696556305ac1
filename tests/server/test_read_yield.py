"""Reads yield to writes: the Distributed summary waits, between its reads, for the writes
queued or being applied (bounded), so that a write shares the cores with as little of a
summary as it can (server/write/committer.py, the soak in docs/reliability.md)."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import orjson

from instantml.health.monitor import HealthMonitor
from instantml.rankmath.params import SummaryParams
from instantml.server.responses import JSONResponse
from instantml.server.write.answers import Answer
from instantml.server.write.commands import CreateRun, Envelope
from instantml.server.write.committer import GroupCommitter
from instantml.server.write.service import WriteService
from instantml.storage import Stores, open_stores
from instantml.storage.querier import drive
from instantml.summary.assemble import assemble
from instantml.thresholds import Thresholds
from tests.storage.test_points import Writer
from tests.summary.compare import assert_matches
from tests.summary.reference import Point, reference


class HeldService(WriteService):
    """A real write service whose next unit waits until the test lets it go on."""

    def __init__(self, stores: Stores) -> None:
        super().__init__(stores)
        self.entered = threading.Event()
        self.release = threading.Event()

    def apply(self, envelopes: list[Envelope]) -> list[Answer]:
        self.entered.set()
        assert self.release.wait(10)
        return super().apply(envelopes)


def submit_in_thread(committer: GroupCommitter, stores: Stores) -> threading.Thread:
    org, _ = stores.tenancy.ensure_org("o")
    envelope = Envelope(CreateRun(org, "held", "p", None, {}, [], {}))
    thread = threading.Thread(target=lambda: asyncio.run(committer.submit([envelope])))
    thread.start()
    return thread


def test_a_read_waits_for_the_write_being_applied_then_goes_on() -> None:
    stores = open_stores("duckdb://:memory:")
    service = HeldService(stores)
    committer = GroupCommitter(service)
    try:
        began = time.monotonic()
        committer.wait_quiet(5)  # nothing queued: at once
        assert time.monotonic() - began < 0.5
        writing = submit_in_thread(committer, stores)
        assert service.entered.wait(5)
        returned = threading.Event()
        reader = threading.Thread(target=lambda: (committer.wait_quiet(10), returned.set()))
        reader.start()
        assert not returned.wait(0.3)  # the write is still being applied
        service.release.set()
        assert returned.wait(5)
        writing.join(5)
        reader.join(5)
        with stores.unit():
            assert stores.runs.resolve(org_of(stores), ["held"])["held"] is not None
    finally:
        service.release.set()
        committer.close()
        stores.close()


def test_a_read_waits_no_longer_than_its_bound_when_writes_go_on() -> None:
    stores = open_stores("duckdb://:memory:")
    service = HeldService(stores)
    committer = GroupCommitter(service)
    try:
        writing = submit_in_thread(committer, stores)
        assert service.entered.wait(5)
        began = time.monotonic()
        committer.wait_quiet(0.2)
        waited = time.monotonic() - began
        assert 0.15 <= waited < 2
        service.release.set()
        writing.join(5)
    finally:
        service.release.set()
        committer.close()
        stores.close()


def org_of(stores: Stores) -> int:
    org = stores.tenancy.org_id("o")
    assert org is not None
    return org


def test_the_summary_pauses_before_each_larger_read_and_answers_the_same() -> None:
    stores = open_stores("duckdb://:memory:")
    writer = Writer(stores)
    rng = np.random.default_rng(5)
    points = [
        Point(step, rank, float(rng.normal()), 1.0, None, 16)
        for step in range(3_000)
        for rank in range(16)
    ]
    writer.write(points)
    with stores.unit():
        while stores.points.maintain():  # the blocks built, so the cover reads them
            pass
    params = SummaryParams("loss", heatmap_steps=50)
    paused: list[float] = []
    reading = stores.points.summary_reading(writer.sid, params)
    rows = drive(reading, lambda: paused.append(time.monotonic()))
    # Before the snapshot, the heatmap buckets' cover (its cells and the rollup), the
    # outliers.
    assert len(paused) == 3
    answer = orjson.loads(JSONResponse(assemble(rows)).body)
    expected = reference(points, heatmap_steps=50)
    assert_matches(answer, expected, 1.0)
    alone = orjson.loads(
        JSONResponse(assemble(stores.points.summary_rows(writer.sid, params))).body
    )
    assert_matches(alone, expected, 1.0)  # and without pauses, the same
    stores.close()


def test_summary_reads_are_not_held_forever_by_a_writer_that_stopped() -> None:
    stores = open_stores("duckdb://:memory:")
    committer = GroupCommitter(WriteService(stores))
    committer.close()
    began = time.monotonic()
    committer.wait_quiet(5)
    assert time.monotonic() - began < 0.5
    stores.close()


def test_the_health_monitor_pauses_before_its_look_reads() -> None:
    stores = open_stores("duckdb://:memory:")
    writer = Writer(stores)
    writer.write([Point(step, rank, 1.0, 1.0, None, 4) for step in range(10) for rank in range(4)])
    with stores.unit():
        stores.runs.extend({stores.runs.resolve(writer.org, ["r"])["r"].seq: (4, 9)})  # type: ignore[union-attr]
    paused: list[float] = []
    monitor = HealthMonitor(stores, Thresholds(), pause=lambda: paused.append(time.monotonic()))
    try:
        monitor.evaluate(writer.org, "r")
        assert len(paused) == 1
    finally:
        monitor.close()
        stores.close()


class CountedService(WriteService):
    """A real write service with summary aggregates always due, that notes each unit of
    background work the writer runs."""

    def __init__(self, stores: Stores) -> None:
        super().__init__(stores)
        self.maintained: list[float] = []

    def backlog(self) -> int:
        return 1

    def maintain(self) -> bool:
        self.maintained.append(time.monotonic())
        return super().maintain()


def test_no_background_work_while_a_batch_is_on_its_way() -> None:
    # Between an uploader's pipelined batches the writer waits a decode's length; a unit
    # of background work started there would hold up the batch that comes next.
    stores = open_stores("duckdb://:memory:")
    service = CountedService(stores)
    committer = GroupCommitter(service)
    try:
        time.sleep(0.3)
        assert service.maintained  # idle, with work due: it runs
        with committer.expecting():
            entered = time.monotonic()
            time.sleep(0.5)
            left = time.monotonic()
        during = [t for t in service.maintained if entered + 0.05 < t < left]
        assert during == [], during
        time.sleep(0.3)
        assert service.maintained[-1] > left  # idle again: it goes on
    finally:
        committer.close()
        stores.close()
