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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from . import segments

LOCK_FILE = "uploader.lock"
DEAD_LETTER = "dead-letter.jsonl"
_RETRY = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


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
        batch_events: int = 5_000,
        batch_bytes: int = 8 * 1024 * 1024,
        timeout: float = 60.0,
        max_backoff: float = 5.0,
        on_progress: Callable[[Stats], None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
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
        """One pass over every segment; returns how many segments remain."""
        remaining = 0
        for path in segments.list_segments(self.spool_dir):
            active = segments.writer_active(path)  # before reading: if done, it is complete
            if self._drain_segment(path) and not active:
                torn = segments.read_lines(path, segments.read_acked(path)).torn
                if torn:
                    self.stats.torn += 1
                    self._dead_letter(path, torn, None, "torn line: its writer died mid-write")
                segments.remove(path)
                self.stats.segments_done += 1
            else:
                remaining += 1
        return remaining

    def _drain_segment(self, path: Path) -> bool:
        """Send every complete line of a segment; True when all are acknowledged."""
        offset = segments.read_acked(path)
        while True:
            try:
                chunk = segments.read_lines(path, offset, self._batch_bytes)
            except FileNotFoundError:
                return False
            for start in range(0, len(chunk.lines), self._batch_events):
                lines = chunk.lines[start : start + self._batch_events]
                self._send(path, lines)
                segments.write_acked(path, chunk.ends[start + len(lines) - 1])
                if self._on_progress:
                    self._on_progress(self.stats)
            if chunk.end > offset and not chunk.lines:
                segments.write_acked(path, chunk.end)  # only blank lines
            if chunk.end == offset or not chunk.lines:
                return True
            offset = chunk.end

    def _send(self, path: Path, lines: list[bytes]) -> None:
        """Deliver lines until each has a final answer (retrying what is transient)."""
        events = []
        for line in lines:
            try:
                event = orjson.loads(line)
            except orjson.JSONDecodeError:
                event = None
            if isinstance(event, dict) and isinstance(event.get("event_id"), str):
                events.append(line)
            else:
                self.stats.torn += 1
                self._dead_letter(path, line, None, "not an event: a torn or corrupt line")
        cap = len(events)
        sent = 0
        delay = 0.1
        while sent < len(events):
            batch = events[sent : sent + cap]
            try:
                response = self._client.post(
                    "/api/ingest", content=b'{"events":[' + b",".join(batch) + b"]}"
                )
            except httpx.HTTPError as exc:
                self._note(f"server unreachable ({type(exc).__name__}); retrying")
                delay = self._backoff(delay)
                continue
            status = response.status_code
            scope = response.headers.get("x-instantml-ratelimit-scope", "")
            if status in (401, 403) or (status == 429 and scope == "monthly"):
                raise UploadStopped(f"server refused the upload ({status}): {_error(response)}")
            if status == 413 and cap > 1:
                cap = max(1, cap // 2)
                continue
            if status in _RETRY or status >= 500:
                self._note(f"server answered {status}; retrying")
                delay = self._backoff(delay, response.headers.get("retry-after"))
                continue
            if status != 200:
                raise UploadStopped(f"server refused a batch ({status}): {_error(response)}")
            final = 0
            for line, result in zip(batch, response.json()["results"], strict=True):
                code = result["status"]
                body = result.get("body") or {}
                if code == 429 and body.get("scope") == "monthly":
                    raise UploadStopped(f"server refused the upload (429): {body.get('error')}")
                if code in _RETRY or code >= 500:
                    break  # this and every later event go again, in order
                if code < 300:
                    if result.get("replayed"):
                        self.stats.replayed += 1
                    else:
                        self.stats.delivered += 1
                else:
                    self.stats.dead_lettered += 1
                    self._dead_letter(path, line, code, str(result.get("body", {}).get("error")))
                final += 1
            sent += final
            delay = 0.1 if final == len(batch) else self._backoff(delay)

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
