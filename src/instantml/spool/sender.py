"""Sending spooled lines to the server and settling their answers: each event to a final
answer (applied, replayed, or refused for good, which sends it to the dead-letter file),
what is transient retried with backoff through the uploader's :class:`Outage`. The lines go
through the SDK's one sender core (:class:`~instantml.sdk.ingest.IngestSender`) and are
judged by its one retry policy.

Every request runs on a daemon thread that is waited on in 0.1 s slices, so a stop ends
the wait at once, whatever the network is doing; a request stuck on a dead peer never
holds up the process's exit."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import httpx
import orjson

from ..sdk.ingest import Answer, IngestSender
from ..sdk.retry import Backoff, Verdict, of_event
from .cursor import Item
from .outage import Interrupted, Outage, UploadStopped

DEAD_LETTER = "dead-letter.jsonl"
_T = TypeVar("_T")
Refusals = list[tuple[Item, int, dict[str, Any]]]


@dataclass
class Stats:
    delivered: int = 0  # events the server applied (first time)
    replayed: int = 0  # events it had already applied (a re-send after a crash)
    dead_lettered: int = 0
    torn: int = 0  # fragments of lines a killed writer left unfinished
    segments_done: int = 0
    refused_runs: int = 0  # segments set aside because their run's creation was refused


def spawn(call: Callable[[], _T]) -> Future[_T]:
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


class Sender:
    def __init__(
        self,
        spool_dir: Path,
        client: httpx.Client,
        outage: Outage,
        stop: threading.Event,
        stats: Stats,
    ) -> None:
        self.spool_dir = spool_dir
        self._sender = IngestSender(client)
        self.base_url = self._sender.base_url
        self._outage = outage
        self._stop = stop
        self.stats = stats

    def wait(self, future: Future[_T]) -> _T:
        """The future's result, looking up every 0.1 s for a stop."""
        while True:
            try:
                return future.result(timeout=0.1)
            except FutureTimeout:
                if self._stop.is_set():
                    raise Interrupted from None

    def post(self, items: list[Item], position: str | None = None) -> Answer:
        return self._sender.post([line for _, line, _ in items], position)

    def settle(self, items: list[Item], answer: Answer) -> int:
        """Count the answers of a pipelined batch; how many leading events have a final one
        (the rest go again). Raises UploadStopped when the server will take no more."""
        if answer.verdict is not Verdict.DONE:
            return 0  # send() retries it, and reports the outage
        answered = self._answers(items, answer.results or [])
        if answered == len(items):
            self._outage.recovered()
        return answered

    def _answers(
        self,
        items: list[Item],
        results: list[dict[str, Any]],
        refusals: Refusals | None = None,
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
            verdict = of_event(code, body)
            if verdict is Verdict.STOP:
                raise UploadStopped(f"server refused the upload (429): {body.get('error')}")
            if verdict is Verdict.RETRY:
                if code >= 500 or code == 429:  # not a key in flight: the server is failing
                    self._outage.failing(
                        f"server {self.base_url} answered {code}: {body.get('error')}"
                    )
                break  # this and every later event go again, in order
            if verdict is Verdict.REFUSED:
                stats.dead_lettered += 1
                self.dead_letter(item[0].path, item[1], code, str(body.get("error")))
                if refusals is not None:
                    refusals.append((item, code, body))
            elif result.get("replayed"):
                stats.replayed += 1
            else:
                stats.delivered += 1
            final += 1
        return final

    def send(
        self,
        items: list[Item],
        refusals: Refusals | None = None,
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
        backoff = Backoff(first=0.1, most=self._outage.max_backoff)
        while sent < len(events):
            if self._stop.is_set():
                raise Interrupted
            batch = events[sent : sent + cap]
            answer = self.wait(spawn(partial(self.post, batch)))
            if answer.verdict is Verdict.STOP:
                raise UploadStopped(
                    f"server {self.base_url} refused the upload ({answer.status}): {answer.error}"
                )
            if answer.status == 413 and cap > 1:
                cap = max(1, cap // 2)
                continue
            if answer.status == 400 and not checked:
                checked = True
                events = events[:sent] + self._events_only(events[sent:])
                cap = max(1, len(events) - sent)
                continue
            if answer.verdict is Verdict.RETRY:
                wait = backoff.next(answer.retry_after)
                self._outage.failing(answer.cause, wait)
                self._outage.wait(wait)
                continue
            if answer.verdict is Verdict.REFUSED:
                raise UploadStopped(f"server refused a batch ({answer.status}): {answer.error}")
            final = self._answers(batch, answer.results or [], refusals)
            sent += final
            if final == len(batch):
                self._outage.recovered()
                backoff.reset()
            else:
                self._outage.wait(backoff.next())

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
                self.dead_letter(cursor.path, line, None, "not an event: a torn or corrupt line")
        return kept

    def dead_letter(self, segment: Path, line: bytes, status: int | None, reason: str) -> None:
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
