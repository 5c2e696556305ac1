"""Async upload mode: a bounded queue drained by one background thread through ``/api/ingest``.

The training thread only appends to a deque; it never waits on the network and never sees
an exception from it. A batch is retried with the same event ids until the server answers,
so a retry never double counts.

Nothing of the run is sent before its creation was accepted: the creation (the first event
``init`` queues) goes alone, and a final refusal of it (the id taken in another project, a
refused key) stops the sender, so no point can land in a run this process did not get.

Every event ends delivered or lost, and ``lost`` counts each one not delivered for any
reason (queue full, refused, uploads stopped, still undelivered when ``close`` timed out),
so ``close`` returns True exactly when everything arrived.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections import deque
from typing import Any

from .ingest import IngestSender
from .records import CreateRun, Request
from .retry import Backoff, Verdict, of_event
from .sinks import EventIds
from .transport import Transport


class AsyncSender:
    def __init__(
        self,
        transport: Transport,
        max_queue: int = 200_000,
        batch_size: int = 2_000,
        flush_interval: float = 0.5,
    ) -> None:
        self._transport = transport
        self._sender = IngestSender(transport.client)
        self._ids = EventIds()
        self._queue: deque[Request] = deque()
        self._max_queue = max_queue
        self._batch_size = batch_size
        self._interval = flush_interval
        self._wake = threading.Event()
        self._settled_cond = threading.Condition()
        self._offered = 0  # every submit (the training thread)
        self._submitted = 0  # of those, queued
        self._settled = 0  # queued events given a final outcome (the sender thread)
        self._counts = threading.Lock()  # delivered/lost: both threads, and close()
        self.delivered = 0
        self.lost = 0
        self._closed = False  # close() has counted what is left: the thread counts no more
        self._stopping = False
        self._stopped = False  # refused key, refused run, monthly limit: nothing more is sent
        self._cause: str | None = None  # why the last event was not delivered
        self._warned_drop = False
        self._notice: str | None = None  # set by the thread, warned by the caller's thread
        self._thread = threading.Thread(target=self._run, name="instantml-async", daemon=True)
        self._thread.start()

    @property
    def dropped(self) -> int:
        return self.lost

    # ---- the training thread ----

    def submit(self, method: str, path: str, body: dict[str, Any]) -> None:
        self._put(Request(self._ids(), method, path, body))

    def create_run(self, body: dict[str, Any]) -> None:
        self._put(CreateRun(self._ids(), body))

    def _put(self, record: Request) -> None:
        if self._notice is not None:
            self._warn_notice(stacklevel=5)
        self._offered += 1
        if self._stopped or len(self._queue) >= self._max_queue:
            self._lose(1)
            if not self._warned_drop:
                self._warned_drop = True
                why = self._cause if self._stopped else "the upload queue is full"
                warnings.warn(
                    f"instantml: dropping metric events ({why}; server {self._url});"
                    " counted in run.dropped_events",
                    RuntimeWarning,
                    stacklevel=5,
                )
            return
        self._submitted += 1
        self._queue.append(record)
        # A run's creation leaves at once: its answer decides whether anything else may.
        if len(self._queue) >= self._batch_size or record.creates_run:
            self._wake.set()

    @property
    def _url(self) -> str:
        return self._transport.base_url

    def _warn_notice(self, stacklevel: int = 4) -> None:
        notice, self._notice = self._notice, None
        if notice:
            warnings.warn(f"instantml: {notice}", RuntimeWarning, stacklevel=stacklevel)

    def flush(self, timeout: float) -> bool:
        target = self._submitted
        self._wake.set()
        with self._settled_cond:
            settled = self._settled_cond.wait_for(lambda: self._settled >= target, timeout)
        if self._notice is not None:
            self._warn_notice()
        return settled and self.lost == 0

    def close(self, timeout: float) -> bool:
        """Flush for at most ``timeout`` seconds, then stop; True when every event was
        delivered. A sender stuck on a dead or hung server is left behind (a daemon
        thread), its events counted as lost: finishing never waits longer than asked."""
        self.flush(timeout)
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout=0.2)
        with self._counts:
            unsettled = self._submitted - self._settled
            self.lost += unsettled
            self._closed = True
            lost = self.lost
        if lost:
            why = f"finish timed out after {timeout:g} s" if unsettled else "refused"
            warnings.warn(
                f"instantml: {lost} of {self._offered} events were not delivered to"
                f" {self._url} ({why}): {self._cause or 'no answer'};"
                " counted in run.dropped_events",
                RuntimeWarning,
                stacklevel=3,
            )
        if not unsettled:
            self._transport.close()
        return lost == 0

    # ---- the background thread ----

    def _lose(self, count: int, cause: str | None = None) -> None:
        with self._counts:
            if not self._closed:
                self.lost += count
            if cause is not None:
                self._cause = cause

    def _stop(self, notice: str) -> None:
        self._stopped = True
        self._cause = notice
        self._notice = f"uploads stopped: {notice}"

    def _run(self) -> None:
        while not (self._stopping and (not self._queue or self._stopped)):
            if not self._queue:
                self._wake.wait(self._interval)
                self._wake.clear()
                continue
            batch = self._next_batch()
            if self._stopped:
                self._lose(len(batch))
            else:
                self._deliver(batch)
            with self._settled_cond:
                self._settled += len(batch)
                self._settled_cond.notify_all()
        # close() left this thread behind on a dead or hung server: its connection is the
        # thread's to close when it gives up (else it lingers until collected).
        self._transport.close()

    def _next_batch(self) -> list[Request]:
        """Up to ``batch_size`` records; a run's creation goes alone. A batch is sent until
        each record has its final answer, so nothing after the creation leaves before it was
        accepted: were it refused, what followed would land in a run not this process's."""
        queue = self._queue
        batch = [queue.popleft()]
        if batch[0].creates_run:
            return batch
        while queue and len(batch) < self._batch_size and not queue[0].creates_run:
            batch.append(queue.popleft())
        return batch

    def _deliver(self, batch: list[Request]) -> None:
        """Send until every record has a final answer (or uploads stop, or finish gives up)."""
        backoff = Backoff(first=0.1, most=5.0)
        lines = [record.encode() for record in batch]  # a retry sends the same bytes
        while batch:
            if self._stopped:
                self._lose(len(batch))
                return
            answer = self._sender.post(lines)
            if answer.verdict is Verdict.STOP:
                self._stop(answer.cause)
                self._lose(len(batch))
                return
            if answer.verdict is Verdict.REFUSED:  # the batch itself (too large?): for good
                self._lose(len(batch), f"server refused a batch: {answer.cause}")
                self._notice = self._cause
                return
            if answer.verdict is Verdict.RETRY:
                self._cause = answer.cause
            else:
                keep = self._settle(batch, answer.results or [])
                batch, lines = [batch[i] for i in keep], [lines[i] for i in keep]
                if not batch:
                    return
            if self._stopping and backoff.delay > 2.0:
                return  # finish() gave up waiting; close() counted these as lost
            time.sleep(backoff.next())

    def _settle(self, batch: list[Request], results: list[dict[str, Any]]) -> list[int]:
        """Count each record's answer; the indexes of those to send again."""
        retry: list[int] = []
        delivered = 0
        for i, (record, result) in enumerate(zip(batch, results)):
            code, answer = result["status"], result.get("body") or {}
            verdict = of_event(code, answer)
            if verdict is Verdict.DONE:
                delivered += 1
            elif verdict is Verdict.STOP:
                self._stop(str(answer.get("error")))
                self._lose(len(batch) - delivered - len(retry))
                break
            elif verdict is Verdict.RETRY:
                retry.append(i)
            elif record.creates_run:  # refused for good: nothing of this run may follow
                self._stop(
                    f"server {self._url} did not create the run ({code}:"
                    f" {answer.get('error')}); nothing of this run is sent"
                )
                self._lose(1)
            else:
                self._lose(1, f"server refused an event ({code}): {answer.get('error')}")
                if self._notice is None:
                    self._notice = self._cause
        with self._counts:
            if not self._closed:
                self.delivered += delivered
        return retry
