"""Async upload mode: a bounded queue drained by one background thread through ``/api/ingest``.

The training thread only appends to a deque; it never waits on the network and never sees
an exception from it. When the queue is full (server down or slow for long), new events are
dropped and counted, and the next call warns once. A batch is retried with the same event
ids until the server answers, so a retry never double counts.
"""

from __future__ import annotations

import random
import threading
import time
import warnings
from collections import deque
from typing import Any

import httpx

from .sinks import EventIds
from .transport import Transport

_Event = tuple[str, str, str, dict[str, Any]]


class AsyncSender:
    def __init__(
        self,
        transport: Transport,
        max_queue: int = 200_000,
        batch_size: int = 2_000,
        flush_interval: float = 0.5,
    ) -> None:
        self._transport = transport
        self._ids = EventIds()
        self._queue: deque[_Event] = deque()
        self._max_queue = max_queue
        self._batch_size = batch_size
        self._interval = flush_interval
        self._wake = threading.Event()
        self._settled_cond = threading.Condition()
        self._submitted = 0  # events queued (the training thread)
        self._settled = 0  # events given a final answer, delivered or not (the sender thread)
        self._stopping = False
        self._stopped = False  # a monthly limit or a refused key: nothing more will be sent
        self.dropped = 0
        self.refused = 0
        self._warned_drop = False
        self._notice: str | None = None  # set by the thread, warned by the caller's thread
        self._thread = threading.Thread(target=self._run, name="instantml-async", daemon=True)
        self._thread.start()

    # ---- the training thread ----

    def submit(self, method: str, path: str, body: dict[str, Any]) -> None:
        if self._notice is not None:
            self._warn_notice()
        if len(self._queue) >= self._max_queue or self._stopped:
            self.dropped += 1
            if not self._warned_drop:
                self._warned_drop = True
                warnings.warn(
                    "instantml: the upload queue is full (server down or slow) or uploads"
                    " stopped; dropping metric events, counted in run.dropped_events",
                    RuntimeWarning,
                    stacklevel=4,
                )
            return
        self._submitted += 1
        self._queue.append((self._ids(), method, path, body))
        if len(self._queue) >= self._batch_size:
            self._wake.set()

    def _warn_notice(self) -> None:
        notice, self._notice = self._notice, None
        if notice:
            warnings.warn(f"instantml: {notice}", RuntimeWarning, stacklevel=4)

    def flush(self, timeout: float) -> bool:
        target = self._submitted
        self._wake.set()
        with self._settled_cond:
            delivered = self._settled_cond.wait_for(lambda: self._settled >= target, timeout)
        if self._notice is not None:
            self._warn_notice()
        return delivered

    def close(self, timeout: float) -> bool:
        """Flush for at most ``timeout`` seconds, then stop. A sender stuck on a dead or hung
        server is left behind (a daemon thread): finishing never waits longer than asked."""
        delivered = self.flush(timeout)
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout=0.2)
        if not delivered:
            pending = self._submitted - self._settled
            warnings.warn(
                f"instantml: finish timed out with {pending} events not yet delivered",
                RuntimeWarning,
                stacklevel=3,
            )
        else:
            self._transport.close()
        return delivered

    # ---- the background thread ----

    def _run(self) -> None:
        while not (self._stopping and (not self._queue or self._stopped)):
            if not self._queue:
                self._wake.wait(self._interval)
                self._wake.clear()
                continue
            batch = [self._queue.popleft() for _ in range(min(self._batch_size, len(self._queue)))]
            if self._stopped:
                self.dropped += len(batch)
            else:
                self._deliver(batch)
            with self._settled_cond:
                self._settled += len(batch)
                self._settled_cond.notify_all()

    def _deliver(self, batch: list[_Event]) -> None:
        """Send until every event has a final answer (or uploads stop, or we are told to quit)."""
        delay = 0.1
        while batch and not self._stopped:
            payload = {
                "events": [
                    {"event_id": eid, "request": {"method": m, "path": p, "body": b}}
                    for eid, m, p, b in batch
                ]
            }
            retry: list[_Event] = []
            try:
                response = self._transport.send("POST", "/api/ingest", payload)
            except httpx.HTTPError:
                retry = batch
            else:
                retry = self._settle(batch, response)
            if not retry:
                return
            if self._stopping and delay > 2.0:
                # finish() is waiting; give up on events the server will not take.
                self.dropped += len(retry)
                return
            batch = retry
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 5.0)

    def _settle(self, batch: list[_Event], response: httpx.Response) -> list[_Event]:
        status = response.status_code
        if status in (401, 403) or (
            status == 429 and response.headers.get("x-instantml-ratelimit-scope") == "monthly"
        ):
            self._stopped = True
            self.dropped += len(batch)
            self._notice = f"uploads stopped: server answered {status}: {_error(response)}"
            return []
        if status >= 500 or status == 429:
            return batch
        if status >= 300:  # the batch itself refused (too large?): nothing to retry safely
            self.refused += len(batch)
            self._notice = f"server refused a batch: {status}: {_error(response)}"
            return []
        retry: list[_Event] = []
        for event, result in zip(batch, response.json()["results"]):
            code = result["status"]
            if code == 429 and (result.get("body") or {}).get("scope") == "monthly":
                self._stopped = True
                self.dropped += len(batch) - len(retry)
                self._notice = f"uploads stopped: {result['body'].get('error')}"
                return []
            if code in (409, 429, 503) or code >= 500:
                retry.append(event)
            elif code >= 300:
                self.refused += 1
                if self._notice is None:
                    self._notice = (
                        f"server refused an event ({code}): {result['body'].get('error')}"
                    )
        return retry


def _error(response: httpx.Response) -> str:
    try:
        return str(response.json().get("error"))
    except ValueError:
        return response.text[:200]
