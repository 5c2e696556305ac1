"""Group commit: one writer thread applies everything that queued while it last committed.

An embedded engine pays milliseconds per COMMIT whatever its size, so concurrent requests
share one transaction instead of paying one each. A request's answer is sent only after
the transaction holding its write has committed: a 2xx means durable.

The same thread is the one scheduler of the stores' background work (an embedded engine
has one writing connection): compaction of the series a read is waiting for (``compact``:
a task of its own, never a write), applied right after the writes taken with it, and
when idle, or when the backlog grows past a bound under sustained writes, bounded units of
the rest.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..errors import ApiError
from .answers import Answer, storage_failed
from .commands import Envelope
from .deletion import Deleter
from .service import WriteService

IDLE_SECONDS = 0.05  # no write for this long: do background work
# A read that shares the engine's cores with the writer (the Distributed summary, between
# its statements) waits at most this long for the writes queued or being applied: reads
# yield to writes, whose answers a training job or an uploader is waiting on.
READ_YIELD_SECONDS = 0.25
MAX_BACKLOG = 4096  # stale summary steps tolerated while writes keep coming

_Pending = tuple[list[Envelope], "asyncio.Future[list[Answer]]", asyncio.AbstractEventLoop]
_Compaction = tuple[int, "asyncio.Future[None]", asyncio.AbstractEventLoop]
_Deletion = tuple[int, str, "asyncio.Future[bool]", asyncio.AbstractEventLoop]
_Waiter = tuple["asyncio.Future[bool]", asyncio.AbstractEventLoop]


def _resolve(future: asyncio.Future[Any], outcome: Any) -> None:
    if not future.done():  # the client may have gone away; the write stands regardless
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)


class GroupCommitter:
    def __init__(
        self,
        service: WriteService,
        max_group_writes: int = 50_000,
        deleter: Deleter | None = None,
    ) -> None:
        self._service = service
        self._max = max_group_writes
        self._deleter = deleter or Deleter(service.stores, None, float("inf"))
        self._pending: deque[_Pending] = deque()
        self._compactions: deque[_Compaction] = deque()
        self._deletions: deque[_Deletion] = deque()
        self._purge_waiters: list[_Waiter] = []  # deletions answered once purges are done
        lock = threading.Lock()
        self._cond = threading.Condition(lock)  # a write queued (the writer waits on it)
        self._quiet = threading.Condition(lock)  # none queued or being applied (readers)
        self._applying = False
        self._expected = 0  # batches read and being decoded: writes on their way
        self._busy_at = 0.0  # when the last write was applied or stopped being expected
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="instantml-writer", daemon=True)
        self._thread.start()

    @contextmanager
    def expecting(self) -> Iterator[None]:
        """A write on its way (a batch read, being decoded, waiting for its turn): the
        writer does not take the moment for background work, which the batch would then
        wait behind. Between an uploader's pipelined batches the writer is otherwise idle
        for a decode's length, and a unit of summary aggregates started there held up
        every batch that followed."""
        with self._cond:
            self._expected += 1
        try:
            yield
        finally:
            with self._cond:
                self._expected -= 1
                self._busy_at = time.monotonic()
                self._cond.notify()

    async def submit(self, envelopes: list[Envelope]) -> list[Answer]:
        if not envelopes:
            return []
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Answer]] = loop.create_future()
        with self._cond:
            if self._closed:
                raise ApiError(503, "server is shutting down; retry")
            self._pending.append((envelopes, future, loop))
            self._cond.notify()
        return await future

    async def compact(self, series_id: int) -> None:
        """Return once the series' summary aggregates hold every point committed before
        the call (and those of the writes the writer takes with it, applied first)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._cond:
            if self._closed:
                raise ApiError(503, "server is shutting down; retry")
            self._compactions.append((series_id, future, loop))
            self._cond.notify()
        await future

    async def delete_run(self, org_id: int, run_id: str) -> bool:
        """Delete a run (after the writes queued before it); return once its points are
        gone from the point store too. False: there is no such run."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        with self._cond:
            if self._closed:
                raise ApiError(503, "server is shutting down; retry")
            self._deletions.append((org_id, run_id, future, loop))
            self._cond.notify()
        return await future

    def _take(
        self, wait: float | None
    ) -> tuple[list[_Pending], list[_Compaction], list[_Deletion]]:
        """What queued since the last commit (writes, compactions and deletions asked
        for), waiting up to ``wait`` seconds (None: until something does) when nothing
        has."""
        with self._cond:
            if (
                not self._pending and not self._compactions and not self._deletions
                and not self._closed
            ):  # fmt: skip
                self._cond.wait(wait)
            group: list[_Pending] = []
            size = 0
            while self._pending and (not group or size + len(self._pending[0][0]) <= self._max):
                item = self._pending.popleft()
                size += len(item[0])
                group.append(item)
            self._applying = bool(group)
            compactions = list(self._compactions)
            self._compactions.clear()
            deletions = list(self._deletions)
            self._deletions.clear()
            return group, compactions, deletions

    def wait_quiet(self, timeout: float = READ_YIELD_SECONDS) -> None:
        """Wait, up to ``timeout`` seconds, until no write is queued or being applied
        (background work does not count): a read about to use the cores starts in the
        writer's gap instead of slowing a write down."""
        with self._quiet:
            self._quiet.wait_for(
                lambda: self._closed or not (self._pending or self._applying), timeout
            )

    def _applied(self) -> None:
        with self._quiet:
            self._applying = False
            if not self._pending:
                self._quiet.notify_all()

    def _wait(self) -> float | None:
        """How long the writer may sleep when nothing is queued."""
        if self._service.backlog() or self._deleter.pending:
            return IDLE_SECONDS
        check = self._deleter.seconds_to_check()
        return None if check == float("inf") else max(check, IDLE_SECONDS)

    def _run(self) -> None:
        while True:
            group, compactions, deletions = self._take(self._wait())
            if not group and not compactions and not deletions:
                if self._closed:
                    return
                if self._expected or time.monotonic() - self._busy_at < IDLE_SECONDS:
                    continue  # not idle yet: a batch is on its way, or may be
                # Idle for a moment: bring summary aggregates up to date, a bounded unit at a
                # time, so a write arriving now waits for one unit at most; the same for
                # deleted runs' points, and runs past their retention.
                self._service.maintain()
                self._deleter.expire()
                self._purge()
                continue
            if group:
                self._apply(group)
            if compactions:
                self._service.compact(sid for sid, _, _ in compactions)
                for _, done, loop in compactions:
                    loop.call_soon_threadsafe(_resolve, done, None)
            for org_id, run_id, answer, loop in deletions:
                try:
                    found = self._deleter.delete_run(org_id, run_id)
                except Exception as exc:  # a storage failure: nothing deleted, retryable
                    loop.call_soon_threadsafe(_resolve, answer, exc)
                    continue
                if found:
                    self._purge_waiters.append((answer, loop))
                else:
                    loop.call_soon_threadsafe(_resolve, answer, False)
            # One bounded unit of a deletion's purge between write groups, and runs past
            # their retention when a look is due (a server never idle still applies it).
            self._purge()
            self._deleter.expire()
            # Under sustained load the writer is never idle: keep the backlog bounded, so
            # that a summary read never has more than this to bring up to date.
            if self._service.backlog() >= MAX_BACKLOG:
                self._service.maintain()

    def _purge(self) -> None:
        if not self._deleter.pending or self._deleter.purge():
            return
        for answer, loop in self._purge_waiters:
            loop.call_soon_threadsafe(_resolve, answer, True)
        self._purge_waiters.clear()

    def _apply(self, group: list[_Pending]) -> None:
        flat = [envelope for envelopes, _, _ in group for envelope in envelopes]
        try:
            outcomes = self._service.apply(flat)
        except Exception as exc:  # storage failure: nothing committed, the client may retry
            outcomes = [storage_failed(exc)] * len(flat)
        self._busy_at = time.monotonic()
        start = 0
        for envelopes, future, loop in group:
            end = start + len(envelopes)
            loop.call_soon_threadsafe(_resolve, future, outcomes[start:end])
            start = end
        self._applied()

    def close(self) -> None:
        """Finish what is queued, then stop."""
        with self._cond:
            self._closed = True
            self._cond.notify()
            self._quiet.notify_all()
        self._thread.join()
