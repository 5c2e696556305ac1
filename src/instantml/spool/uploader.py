"""The uploader: replays a spool dir to the server through ``POST /api/ingest``.

Each event goes with its ``event_id`` as Idempotency-Key (the batch route's contract), so a
batch re-sent after a crash, a timeout or a restart is answered as a replay and counts
nothing twice. A segment's acknowledged offset moves only past events the server gave a
final answer (2xx, or a 4xx for bad input, which sends the event to the dead-letter file),
and a segment is removed only when its writer is gone and every line is acknowledged.

Failures are loud and bounded: an outage is reported once per change of state (through
``notify``), retried with backoff, and given up after ``retry_for`` seconds (``GaveUp``);
``stop()`` ends a pass within a fraction of a second, whatever the network is doing,
because every request runs on a daemon thread that the uploader waits on in short slices.
"""

from __future__ import annotations

import fcntl
import os
import threading
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import httpx

from ..sdk.http import open_client
from ..sdk.ingest import Answer
from ..sdk.records import from_line
from . import segments
from .cursor import Cursor, Item, ack_items, ack_runs
from .outage import GaveUp, Interrupted, Outage, UploadStopped
from .sender import DEAD_LETTER, Refusals, Sender, Stats, spawn

LOCK_FILE = "uploader.lock"
REFUSED = "refused"  # segments of runs the server refused to create, set aside whole
_MIN_READ = 256 * 1024
_T = TypeVar("_T")


class AlreadyRunning(Exception):
    """Another uploader holds this spool dir."""


class Uploader:
    def __init__(
        self,
        spool_dir: str | os.PathLike[str],
        base_url: str,
        api_key: str | None,
        *,
        batch_events: int = 10_000,
        batch_bytes: int = 8 * 1024 * 1024,
        timeout: float = 60.0,
        max_backoff: float = 5.0,
        retry_for: float | None = 300.0,
        on_progress: Callable[[Stats], None] | None = None,
        notify: Callable[[str], None] | None = None,
        pipeline: int = 2,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.spool_dir = Path(spool_dir)
        self.base_url = base_url
        # transport: tests' fault-injecting or in-process transport
        self._client = open_client(
            base_url, api_key, httpx.Timeout(timeout, connect=10.0), transport
        )
        self._batch_events = batch_events
        self._batch_bytes = batch_bytes
        self._on_progress = on_progress
        self._notify = notify or (lambda message: None)
        self.stats = Stats()
        self._pipeline = max(1, pipeline)
        self._lock_fd = -1
        self._stop = threading.Event()
        self._outage = Outage(base_url, retry_for, self._notify, self._stop, max_backoff)
        self._sender = Sender(self.spool_dir, self._client, self._outage, self._stop, self.stats)
        self.interrupted = False

    # ---- one uploader per spool dir ----

    def __enter__(self) -> Uploader:
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        if not self._take_lock():
            raise AlreadyRunning(f"another uploader is already syncing {self.spool_dir}")
        return self

    def __exit__(self, *exc: object) -> None:
        self._client.close()
        self._release_lock()

    def _take_lock(self) -> bool:
        fd = os.open(self.spool_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the kernel drops it if we die
        except BlockingIOError:
            os.close(fd)
            return False
        self._lock_fd = fd
        return True

    def _release_lock(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def _handed_back(self) -> bool:
        """``until_done`` with nothing left: release the lock, then look again; True when
        a segment appeared and the lock was taken back (so the drain goes on).

        A writer starts the background uploader only after its segment is listed, and not
        when this one holds the lock. A segment made between this pass's listing and the
        exit would have no uploader: its rank saw the lock held. Looked for after the
        release, it is listed, or the rank that made it found the lock free and started
        another uploader (which then holds the lock). Seen in the demo under load: an uploader
        delivered the one finished segment it saw and exited as the other seven ranks began."""
        if self._lock_fd < 0:
            return False
        self._release_lock()
        # False when nothing is left, or another uploader took the spool (the rest is its).
        return bool(segments.list_segments(self.spool_dir)) and self._take_lock()

    def stop(self) -> None:
        """End the current pass as soon as possible (safe from a signal handler)."""
        self._stop.set()

    # ---- passes ----

    def run(self, follow: bool = False, until_done: bool = False, poll: float = 0.2) -> Stats:
        """Drain the spool. ``follow``: keep tailing until :meth:`stop`; ``until_done``:
        keep going until every writer has finished and everything is delivered. Sets
        ``interrupted`` when stopped with work left; raises UploadStopped (GaveUp)."""
        if until_done:  # the uploader is all a running writer has: no giving up then
            self._outage.keep_going = lambda: any(
                map(segments.writer_active, segments.list_segments(self.spool_dir))
            )
        try:
            while True:
                remaining = self.drain_once()
                if self._stop.is_set():
                    self.interrupted = remaining > 0 and not follow
                    break
                if not follow and (not until_done or remaining == 0):
                    if until_done and self._handed_back():
                        continue
                    break
                if self._stop.wait(poll):
                    self.interrupted = not follow
                    break
        except Interrupted:
            self.interrupted = not follow  # a stop is how --follow ends
        return self.stats

    def drain_once(self) -> int:
        """One pass over every segment; returns how many segments remain.

        Batches draw lines from every segment in turn (the spool of an 8-rank job is 8
        segments): each batch then holds the same steps of every rank, so the server brings
        a step's summary up to date once rather than once per rank."""
        cursors = [Cursor(path) for path in segments.list_segments(self.spool_dir)]
        self._pump(self._confirm_runs(cursors))
        remaining = 0
        for cursor in cursors:
            if cursor.missing:
                continue
            cursor.ack()  # every batch of this pass has its answers
            if cursor.exhausted and not cursor.active:
                torn = segments.read_lines(cursor.path, cursor.offset).torn
                if torn:
                    self.stats.torn += 1
                    self._sender.dead_letter(
                        cursor.path, torn, None, "torn line: its writer died mid-write"
                    )
                segments.remove(cursor.path)
                self.stats.segments_done += 1
            else:
                remaining += 1
        return remaining

    def _confirm_runs(self, cursors: list[Cursor]) -> list[Cursor]:
        """Send the first line of each segment that has none acknowledged yet, alone, before
        anything else of it; returns the cursors the pass may go on with.

        That first line is the run's creation (``init`` writes it first). Sent with the
        rest, a creation refused for good (the id exists in another project) would be
        followed by its points landing in that other project's run. So its answer comes
        first, and a refused run's segment is set aside whole in ``refused/``."""
        ready: list[Cursor] = []
        firsts: list[Item] = []
        for cursor in cursors:
            if cursor.offset:
                ready.append(cursor)  # its first line was answered in an earlier pass
                continue
            taken = cursor.take(1, _MIN_READ)
            if taken:
                firsts += taken
                ready.append(cursor)
            elif not cursor.active:
                ready.append(cursor)  # empty or torn, and final: the pass removes it
        if not firsts:
            return ready
        refusals: Refusals = []
        self._sender.send(firsts, refusals)
        ack_items(firsts)
        for (cursor, line, _), status, body in refusals:
            record = from_line(line)
            if record is not None and record.creates_run:
                self._set_aside(cursor, status, body)
        return [cursor for cursor in ready if not cursor.missing]

    def _set_aside(self, cursor: Cursor, status: int, body: dict[str, Any]) -> None:
        """Move a refused run's segment to ``refused/`` (its writer, if still running,
        keeps appending to it there: the file is the same) and say so."""
        target = self.spool_dir / REFUSED / cursor.path.name
        target.parent.mkdir(exist_ok=True)
        reason = f"the server refused to create its run ({status}): {body.get('error')}"
        (target.parent / (target.name + ".reason")).write_text(reason + "\n")
        os.replace(cursor.path, target)
        segments.remove(cursor.path)  # the .ack beside it
        cursor.missing = cursor.exhausted = True
        self.stats.refused_runs += 1
        self._notify(f"{reason}; nothing of it is sent; its events are kept in {target}")

    def _pump(self, cursors: list[Cursor]) -> None:
        """Send the lines of ``cursors``, interleaved, until none has more.

        ``pipeline`` batches are in flight at once, numbered in an upload session
        (``Instantml-Upload``), so that the server parses one while it commits the one
        before, yet applies them in order. When a batch comes back with any event lacking a
        final answer, the batches after it are waited for and everything from that event on
        is sent again one batch at a time, then a new session starts."""
        live = list(cursors)
        session, seq = uuid.uuid4().hex, 0
        pending: deque[tuple[list[Item], list[int], Future[Answer]]]
        pending = deque()
        while True:
            if self._stop.is_set():
                raise Interrupted
            while live and len(pending) < self._pipeline:
                items, runs = self._next_batch(live)
                live = [c for c in live if not c.exhausted]
                if items:
                    position = f"{session}/{seq}"
                    pending.append(
                        (items, runs, spawn(partial(self._sender.post, items, position)))
                    )
                    seq += 1
            if not pending:
                return
            items, runs, future = pending.popleft()
            answered = self._sender.settle(items, self._sender.wait(future))
            ack_runs(items, runs, answered)
            if answered < len(items):
                rest = items[answered:]
                while pending:  # these may have been refused, or applied: both fine
                    later, _, future = pending.popleft()
                    self._sender.wait(future)
                    rest += later
                self._sender.send(rest)
                ack_items(rest)
                session, seq = uuid.uuid4().hex, 0
            if self._on_progress:
                self._on_progress(self.stats)

    def _next_batch(self, live: list[Cursor]) -> tuple[list[Item], list[int]]:
        """A batch's lines, and where each segment's run of them ends."""
        share = max(1, self._batch_events // max(1, len(live)))
        read_bytes = max(_MIN_READ, self._batch_bytes // max(1, len(live)))
        items: list[Item] = []
        runs: list[int] = []
        for cursor in live:
            taken = cursor.take(share, read_bytes)
            if taken:
                items += taken
                runs.append(len(items))
        return items, runs


__all__ = [
    "DEAD_LETTER", "LOCK_FILE", "AlreadyRunning", "GaveUp", "Stats", "UploadStopped", "Uploader",
]  # fmt: skip
