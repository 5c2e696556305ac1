"""The uploader: replays a spool dir to the server through ``POST /api/ingest``.

Each event goes with its ``event_id`` as Idempotency-Key (the batch route's contract), so a
batch re-sent after a crash, a timeout or a restart is answered as a replay and counts
nothing twice. A segment's acknowledged offset moves only past events the server gave a
final answer (2xx, or a 4xx for bad input, which sends the event to the dead-letter file),
and a segment is removed only when its writer is gone and every line is acknowledged.
"""

from __future__ import annotations

import fcntl
import os
import random
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from ..protocol import UPLOAD_ORDER_HEADER, is_final
from . import segments

LOCK_FILE = "uploader.lock"
DEAD_LETTER = "dead-letter.jsonl"
_MIN_READ = 256 * 1024


class _Cursor:
    """Where a pass stands in one segment: complete lines read ahead, and how far the
    server has answered (acknowledged only once every line before it has an answer)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.active = segments.writer_active(path)  # before reading: if done, it is complete
        self.offset = segments.read_acked(path)  # acknowledged
        self._read = self.offset  # read ahead up to here
        self._lines: list[bytes] = []
        self._ends: list[int] = []
        self._pos = 0
        self._taken_end = self.offset
        self.exhausted = False
        self.missing = False

    def take(self, count: int, read_bytes: int) -> list[_Item]:
        """Up to ``count`` further complete lines; marks the cursor exhausted at the end."""
        while self._pos == len(self._lines):
            try:
                chunk = segments.read_lines(self.path, self._read, read_bytes)
                if chunk.end == self._read:
                    if self.path.stat().st_size - self._read < read_bytes:
                        self.exhausted = True  # nothing more, or only a line being written
                        return []
                    read_bytes *= 2  # one line longer than a read: read more
                    continue
            except FileNotFoundError:
                self.exhausted = self.missing = True
                return []
            self._lines, self._ends, self._pos = chunk.lines, chunk.ends, 0
            self._read = chunk.end
            if not chunk.lines:
                self._taken_end = chunk.end  # only blank lines: acknowledged with the rest
        start, self._pos = self._pos, min(self._pos + count, len(self._lines))
        self._taken_end = self._ends[self._pos - 1]
        return [
            (self, line, end)
            for line, end in zip(
                self._lines[start : self._pos], self._ends[start : self._pos], strict=True
            )
        ]

    def ack(self, offset: int | None = None) -> None:
        """Every line before ``offset`` (default: every line taken) has its final answer."""
        offset = self._taken_end if offset is None else offset
        if offset > self.offset:
            segments.write_acked(self.path, offset)
            self.offset = offset


_Item = tuple[_Cursor, bytes, int]  # a line, its segment, and the offset just past it


def _ack(items: list[_Item]) -> None:
    """Acknowledge, per segment, everything up to the last of ``items`` (all answered)."""
    last: dict[int, tuple[_Cursor, int]] = {}
    for cursor, _, end in items:
        last[id(cursor)] = (cursor, end)
    for cursor, end in last.values():
        cursor.ack(end)


def _ack_runs(items: list[_Item], runs: list[int], answered: int) -> None:
    """:func:`_ack` for the first ``answered`` items of a batch whose segments' runs of
    lines end at the indexes ``runs``: per segment, not per line."""
    start = 0
    for stop in runs:
        if answered <= start:
            return
        cursor, _, end = items[min(stop, answered) - 1]
        cursor.ack(end)
        start = stop


class UploadStopped(Exception):
    """The server will not take more from this spool (bad key, monthly limit): stop, keep it."""


class AlreadyRunning(Exception):
    """Another uploader holds this spool dir."""


@dataclass
class Stats:
    delivered: int = 0  # events the server applied (first time)
    replayed: int = 0  # events it had already applied (a re-send after a crash)
    dead_lettered: int = 0
    torn: int = 0  # fragments of lines a killed writer left unfinished
    segments_done: int = 0
    errors: list[str] = field(default_factory=list)


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
        on_progress: Callable[[Stats], None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        pipeline: int = 2,
    ) -> None:
        self.spool_dir = Path(spool_dir)
        headers = {"Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._client = httpx.Client(base_url=base_url, headers=headers, timeout=timeout)
        self._batch_events = batch_events
        self._batch_bytes = batch_bytes
        self._max_backoff = max_backoff
        self._on_progress = on_progress
        self._sleep = sleep
        self.stats = Stats()
        self._pipeline = max(1, pipeline)
        self._lock_fd = -1

    # ---- one uploader per spool dir ----

    def __enter__(self) -> Uploader:
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.spool_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the kernel drops it if we die
        except BlockingIOError:
            os.close(fd)
            raise AlreadyRunning(f"another uploader is already syncing {self.spool_dir}") from None
        self._lock_fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        self._client.close()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    # ---- passes ----

    def run(
        self,
        follow: bool = False,
        until_done: bool = False,
        poll: float = 0.2,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> Stats:
        """Drain the spool. ``follow``: keep tailing until ``should_stop``; ``until_done``:
        keep going until every writer has finished and everything is delivered."""
        while True:
            remaining = self.drain_once()
            if should_stop():
                break
            if not follow and (not until_done or remaining == 0):
                break
            self._sleep(poll)
        return self.stats

    def drain_once(self) -> int:
        """One pass over every segment; returns how many segments remain.

        Batches draw lines from every segment in turn (the spool of an 8-rank job is 8
        segments): each batch then holds the same steps of every rank, so the server brings
        a step's summary up to date once rather than once per rank."""
        cursors = [_Cursor(path) for path in segments.list_segments(self.spool_dir)]
        self._pump(cursors)
        remaining = 0
        for cursor in cursors:
            if not cursor.missing:
                cursor.ack()  # every batch of this pass has its answers
            if cursor.exhausted and not cursor.active and not cursor.missing:
                torn = segments.read_lines(cursor.path, cursor.offset).torn
                if torn:
                    self.stats.torn += 1
                    self._dead_letter(
                        cursor.path, torn, None, "torn line: its writer died mid-write"
                    )
                segments.remove(cursor.path)
                self.stats.segments_done += 1
            elif not cursor.missing:
                remaining += 1
        return remaining

    def _pump(self, cursors: list[_Cursor]) -> None:
        """Send the lines of ``cursors``, interleaved, until none has more.

        ``pipeline`` batches are in flight at once, numbered in an upload session
        (``Instantml-Upload``), so that the server parses one while it commits the one
        before, yet applies them in order. When a batch comes back with any event lacking a
        final answer, the batches after it are waited for and everything from that event on
        is sent again one batch at a time, then a new session starts."""
        live = list(cursors)
        session, seq = uuid.uuid4().hex, 0
        pending: deque[tuple[list[_Item], list[int], Future[httpx.Response | httpx.HTTPError]]]
        pending = deque()
        with ThreadPoolExecutor(self._pipeline, thread_name_prefix="instantml-upload") as pool:
            try:
                while True:
                    while live and len(pending) < self._pipeline:
                        items, runs = self._next_batch(live)
                        live = [c for c in live if not c.exhausted]
                        if items:
                            position = f"{session}/{seq}"
                            future = pool.submit(self._post, items, position)
                            pending.append((items, runs, future))
                            seq += 1
                    if not pending:
                        return
                    items, runs, future = pending.popleft()
                    answered = self._settle(items, future.result())
                    _ack_runs(items, runs, answered)
                    if answered < len(items):
                        rest = items[answered:]
                        while pending:  # these may have been refused, or applied: both fine
                            later, _, future = pending.popleft()
                            future.result()
                            rest += later
                        self._send(rest)
                        _ack(rest)
                        session, seq = uuid.uuid4().hex, 0
                    if self._on_progress:
                        self._on_progress(self.stats)
            finally:
                for _, _, future in pending:
                    future.cancel()

    def _next_batch(self, live: list[_Cursor]) -> tuple[list[_Item], list[int]]:
        """A batch's lines, and where each segment's run of them ends."""
        share = max(1, self._batch_events // max(1, len(live)))
        read_bytes = max(_MIN_READ, self._batch_bytes // max(1, len(live)))
        items: list[_Item] = []
        runs: list[int] = []
        for cursor in live:
            taken = cursor.take(share, read_bytes)
            if taken:
                items += taken
                runs.append(len(items))
        return items, runs

    def _post(self, items: list[_Item], position: str) -> httpx.Response | httpx.HTTPError:
        try:
            return self._client.post(
                "/api/ingest",
                content=b'{"events":[' + b",".join([line for _, line, _ in items]) + b"]}",
                headers={UPLOAD_ORDER_HEADER: position},
            )
        except httpx.HTTPError as exc:
            return exc

    def _settle(self, items: list[_Item], response: httpx.Response | httpx.HTTPError) -> int:
        """Count the answers of a pipelined batch; how many leading events have a final one
        (the rest go again). Raises UploadStopped when the server will take no more."""
        if isinstance(response, httpx.HTTPError):
            self._note(f"server unreachable ({type(response).__name__}); retrying")
            return 0
        self._stop_if_refused(response)
        if response.status_code != 200:
            return 0
        return self._answers(items, orjson.loads(response.content)["results"])

    def _stop_if_refused(self, response: httpx.Response) -> None:
        status = response.status_code
        scope = response.headers.get("x-instantml-ratelimit-scope", "")
        if status in (401, 403) or (status == 429 and scope == "monthly"):
            raise UploadStopped(f"server refused the upload ({status}): {_error(response)}")

    def _answers(self, items: list[_Item], results: list[dict[str, Any]]) -> int:
        """Record each event's answer, in order, up to the first that is not final."""
        if len(results) != len(items):
            raise UploadStopped(f"server answered {len(results)} events of {len(items)}")
        stats = self.stats
        statuses = [result["status"] for result in results]
        if statuses and min(statuses) >= 200 and max(statuses) < 300:  # all applied: counts
            replayed = [result.get("replayed", False) for result in results].count(True)
            stats.delivered += len(results) - replayed
            stats.replayed += replayed
            return len(results)
        final = 0
        for (cursor, line, _), result in zip(items, results, strict=True):
            code = result["status"]
            body = result.get("body") or {}
            if code == 429 and body.get("scope") == "monthly":
                raise UploadStopped(f"server refused the upload (429): {body.get('error')}")
            if not is_final(code):
                break  # this and every later event go again, in order
            if code >= 300:
                stats.dead_lettered += 1
                self._dead_letter(cursor.path, line, code, str(body.get("error")))
            elif result.get("replayed"):
                stats.replayed += 1
            else:
                stats.delivered += 1
            final += 1
        return final

    def _send(self, items: list[_Item]) -> None:
        """Deliver lines one batch at a time until each has a final answer (retrying what
        is transient, with backoff).

        Lines go as they are, unparsed; only when the server finds the batch itself
        malformed (a torn or corrupt line in it) is each line checked, and what is not an
        event is dead-lettered."""
        events = items
        checked = False
        cap = len(events)
        sent = 0
        delay = 0.1
        while sent < len(events):
            batch = events[sent : sent + cap]
            try:
                response = self._client.post(
                    "/api/ingest",
                    content=b'{"events":[' + b",".join([line for _, line, _ in batch]) + b"]}",
                )
            except httpx.HTTPError as exc:
                self._note(f"server unreachable ({type(exc).__name__}); retrying")
                delay = self._backoff(delay)
                continue
            self._stop_if_refused(response)
            status = response.status_code
            if status == 413 and cap > 1:
                cap = max(1, cap // 2)
                continue
            if status == 400 and not checked:
                checked = True
                events = events[:sent] + self._events_only(events[sent:])
                cap = max(1, len(events) - sent)
                continue
            if not is_final(status):
                self._note(f"server answered {status}; retrying")
                delay = self._backoff(delay, response.headers.get("retry-after"))
                continue
            if status != 200:
                raise UploadStopped(f"server refused a batch ({status}): {_error(response)}")
            final = self._answers(batch, orjson.loads(response.content)["results"])
            sent += final
            delay = 0.1 if final == len(batch) else self._backoff(delay)

    def _events_only(self, items: list[_Item]) -> list[_Item]:
        """The items whose line is an event; the others go to the dead-letter file."""
        kept = []
        for item in items:
            cursor, line, _ = item
            try:
                event = orjson.loads(line)
            except orjson.JSONDecodeError:
                event = None
            if isinstance(event, dict) and isinstance(event.get("event_id"), str):
                kept.append(item)
            else:
                self.stats.torn += 1
                self._dead_letter(cursor.path, line, None, "not an event: a torn or corrupt line")
        return kept

    def _backoff(self, delay: float, retry_after: str | None = None) -> float:
        wait = delay * (0.5 + random.random())
        if retry_after:
            try:
                wait = max(wait, float(retry_after))
            except ValueError:
                pass
        self._sleep(min(wait, self._max_backoff))
        return min(delay * 2, self._max_backoff)

    def _note(self, message: str) -> None:
        if not self.stats.errors or self.stats.errors[-1] != message:
            self.stats.errors.append(message)
            del self.stats.errors[:-20]

    def _dead_letter(self, segment: Path, line: bytes, status: int | None, reason: str) -> None:
        record: dict[str, Any] = {
            "segment": segment.name,
            "status": status,
            "reason": reason,
            "time": time.time(),
        }
        try:
            record["event"] = orjson.loads(line)
        except orjson.JSONDecodeError:
            record["line"] = line.decode("utf-8", "replace")
        with (self.spool_dir / DEAD_LETTER).open("ab") as handle:
            handle.write(orjson.dumps(record) + b"\n")


def _error(response: httpx.Response) -> str:
    try:
        return str(response.json().get("error"))
    except ValueError:
        return response.text[:200]
