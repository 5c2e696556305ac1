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
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import httpx
import orjson

from ..protocol import UPLOAD_ORDER_HEADER, is_final, is_monthly_limit
from . import segments
from .cursor import Cursor, Item, ack_items, ack_runs, creates_run

LOCK_FILE = "uploader.lock"
DEAD_LETTER = "dead-letter.jsonl"
REFUSED = "refused"  # segments of runs the server refused to create, set aside whole
_MIN_READ = 256 * 1024
_T = TypeVar("_T")


class UploadStopped(Exception):
    """The server will not take more from this spool (bad key, monthly limit): stop, keep it."""


class GaveUp(UploadStopped):
    """The server stayed unreachable (or failing) for longer than ``retry_for``."""


class AlreadyRunning(Exception):
    """Another uploader holds this spool dir."""


class _Interrupted(Exception):
    """``stop()`` was called: end the pass now; what was not answered stays in the spool."""


@dataclass
class Stats:
    delivered: int = 0  # events the server applied (first time)
    replayed: int = 0  # events it had already applied (a re-send after a crash)
    dead_lettered: int = 0
    torn: int = 0  # fragments of lines a killed writer left unfinished
    segments_done: int = 0
    refused_runs: int = 0  # segments set aside because their run's creation was refused
    errors: list[str] = field(default_factory=list)


def _spawn(call: Callable[[], _T]) -> Future[_T]:
    """Run ``call`` on a daemon thread: a request stuck on a dead peer never holds up a
    stop or the process's exit."""
    future: Future[_T] = Future()

    def target() -> None:
        try:
            future.set_result(call())
        except BaseException as exc:  # handed to the waiter
            future.set_exception(exc)

    threading.Thread(target=target, name="instantml-upload", daemon=True).start()
    return future


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
        headers = {"Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._client = httpx.Client(
            base_url=base_url,
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=10.0),
            transport=transport,  # tests: a fault-injecting or in-process transport
        )
        self._batch_events = batch_events
        self._batch_bytes = batch_bytes
        self._max_backoff = max_backoff
        self._retry_for = retry_for
        self._on_progress = on_progress
        self._notify = notify or (lambda message: None)
        self.stats = Stats()
        self._pipeline = max(1, pipeline)
        self._lock_fd = -1
        self._stop = threading.Event()
        self._until_done = False
        self._outage_since: float | None = None  # monotonic time the current outage began
        self._outage: str | None = None  # what it looks like (reported when it changes)
        self.interrupted = False

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

    def stop(self) -> None:
        """End the current pass as soon as possible (safe from a signal handler)."""
        self._stop.set()

    # ---- passes ----

    def run(self, follow: bool = False, until_done: bool = False, poll: float = 0.2) -> Stats:
        """Drain the spool. ``follow``: keep tailing until :meth:`stop`; ``until_done``:
        keep going until every writer has finished and everything is delivered. Sets
        ``interrupted`` when stopped with work left; raises UploadStopped (GaveUp)."""
        self._until_done = until_done
        try:
            while True:
                remaining = self.drain_once()
                if self._stop.is_set():
                    self.interrupted = remaining > 0 and not follow
                    break
                if not follow and (not until_done or remaining == 0):
                    break
                if self._stop.wait(poll):
                    self.interrupted = not follow
                    break
        except _Interrupted:
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
                    self._dead_letter(
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
        refusals: list[tuple[Item, int, dict[str, Any]]] = []
        self._send(firsts, refusals)
        ack_items(firsts)
        for (cursor, line, _), status, body in refusals:
            if creates_run(line):
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
        pending: deque[tuple[list[Item], list[int], Future[httpx.Response | httpx.HTTPError]]]
        pending = deque()
        while True:
            if self._stop.is_set():
                raise _Interrupted
            while live and len(pending) < self._pipeline:
                items, runs = self._next_batch(live)
                live = [c for c in live if not c.exhausted]
                if items:
                    position = f"{session}/{seq}"
                    pending.append((items, runs, _spawn(partial(self._post, items, position))))
                    seq += 1
            if not pending:
                return
            items, runs, future = pending.popleft()
            answered = self._settle(items, self._await(future))
            ack_runs(items, runs, answered)
            if answered < len(items):
                rest = items[answered:]
                while pending:  # these may have been refused, or applied: both fine
                    later, _, future = pending.popleft()
                    self._await(future)
                    rest += later
                self._send(rest)
                ack_items(rest)
                session, seq = uuid.uuid4().hex, 0
            if self._on_progress:
                self._on_progress(self.stats)

    def _await(self, future: Future[_T]) -> _T:
        """The future's result, looking up every 0.1 s for a stop."""
        while True:
            try:
                return future.result(timeout=0.1)
            except FutureTimeout:
                if self._stop.is_set():
                    raise _Interrupted from None

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

    def _post(
        self, items: list[Item], position: str | None = None
    ) -> httpx.Response | httpx.HTTPError:
        try:
            return self._client.post(
                "/api/ingest",
                content=b'{"events":[' + b",".join([line for _, line, _ in items]) + b"]}",
                headers={UPLOAD_ORDER_HEADER: position} if position else None,
            )
        except httpx.HTTPError as exc:
            return exc

    def _settle(self, items: list[Item], response: httpx.Response | httpx.HTTPError) -> int:
        """Count the answers of a pipelined batch; how many leading events have a final one
        (the rest go again). Raises UploadStopped when the server will take no more."""
        if isinstance(response, httpx.HTTPError) or response.status_code != 200:
            return 0  # _send retries it, and reports the outage
        answered = self._answers(items, orjson.loads(response.content)["results"])
        if answered == len(items):
            self._recovered()
        return answered

    def _stop_if_refused(self, response: httpx.Response) -> None:
        status = response.status_code
        scope = response.headers.get("x-instantml-ratelimit-scope")
        if status in (401, 403) or is_monthly_limit(status, None, scope):
            raise UploadStopped(
                f"server {self.base_url} refused the upload ({status}): {_error(response)}"
            )

    def _answers(
        self,
        items: list[Item],
        results: list[dict[str, Any]],
        refusals: list[tuple[Item, int, dict[str, Any]]] | None = None,
    ) -> int:
        """Record each event's answer, in order, up to the first that is not final;
        ``refusals`` collects the events refused for good."""
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
        for item, result in zip(items, results, strict=True):
            code = result["status"]
            body = result.get("body") or {}
            if is_monthly_limit(code, body):
                raise UploadStopped(f"server refused the upload (429): {body.get('error')}")
            if not is_final(code, body):
                if code >= 500 or code == 429:  # not a key in flight: the server is failing
                    self._failing(f"server {self.base_url} answered {code}: {body.get('error')}")
                break  # this and every later event go again, in order
            if code >= 300:
                stats.dead_lettered += 1
                self._dead_letter(item[0].path, item[1], code, str(body.get("error")))
                if refusals is not None:
                    refusals.append((item, code, body))
            elif result.get("replayed"):
                stats.replayed += 1
            else:
                stats.delivered += 1
            final += 1
        return final

    def _send(
        self,
        items: list[Item],
        refusals: list[tuple[Item, int, dict[str, Any]]] | None = None,
    ) -> None:
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
            if self._stop.is_set():
                raise _Interrupted
            batch = events[sent : sent + cap]
            response = self._await(_spawn(partial(self._post, batch)))
            if isinstance(response, httpx.HTTPError):
                cause = f"{type(response).__name__}: {response}".rstrip(": ")
                self._failing(f"server unreachable at {self.base_url}: {cause}", delay)
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
            if not is_final(status, _json(response)):
                self._failing(
                    f"server {self.base_url} answered {status}: {_error(response)}", delay
                )
                delay = self._backoff(delay, response.headers.get("retry-after"))
                continue
            if status != 200:
                raise UploadStopped(f"server refused a batch ({status}): {_error(response)}")
            final = self._answers(batch, orjson.loads(response.content)["results"], refusals)
            if final == len(batch):
                self._recovered()
            sent += final
            delay = 0.1 if final == len(batch) else self._backoff(delay)

    def _events_only(self, items: list[Item]) -> list[Item]:
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

    # ---- outages: reported when they change, bounded by retry_for ----

    def _failing(self, what: str, delay: float | None = None) -> None:
        """The server is unreachable or failing (``what``). Say so when that changes, and
        give up once it has lasted ``retry_for`` seconds, unless a writer of the spool is
        still running under ``until_done`` (the uploader is then all it has)."""
        now = time.monotonic()
        if self._outage_since is None:
            self._outage_since = now
        if what != self._outage:
            self._outage = what
            self.stats.errors = [*self.stats.errors[-19:], what]
            self._notify(what + (f"; retrying in {delay:.1f} s" if delay is not None else ""))
        if self._retry_for is None or now - self._outage_since < self._retry_for:
            return
        if self._until_done and any(
            map(segments.writer_active, segments.list_segments(self.spool_dir))
        ):
            return
        raise GaveUp(f"gave up after {self._retry_for:g} s: {what}")

    def _recovered(self) -> None:
        if self._outage_since is not None:
            lasted = time.monotonic() - self._outage_since
            self._notify(f"server {self.base_url} answering again after {lasted:.0f} s; resuming")
            self._outage_since = self._outage = None

    def _backoff(self, delay: float, retry_after: str | None = None) -> float:
        wait = delay * (0.5 + random.random())
        if retry_after:
            try:
                wait = max(wait, float(retry_after))
            except ValueError:
                pass
        if self._stop.wait(min(wait, self._max_backoff)):
            raise _Interrupted
        return min(delay * 2, self._max_backoff)

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


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _error(response: httpx.Response) -> str:
    body = _json(response)
    if isinstance(body, dict) and "error" in body:
        return str(body["error"])
    return response.text[:200]
