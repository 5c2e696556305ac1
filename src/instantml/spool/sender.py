"""Sending spooled lines to the server and settling their answers: each event to a final
answer (applied, replayed, or refused for good, which sends it to the dead-letter file),
what is transient retried with backoff through the uploader's :class:`Outage`.

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

from ..protocol import UPLOAD_ORDER_HEADER, is_final, is_monthly_limit
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
        self.base_url = str(client.base_url).rstrip("/")
        self._client = client
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

    def post(
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

    def settle(self, items: list[Item], response: httpx.Response | httpx.HTTPError) -> int:
        """Count the answers of a pipelined batch; how many leading events have a final one
        (the rest go again). Raises UploadStopped when the server will take no more."""
        if isinstance(response, httpx.HTTPError) or response.status_code != 200:
            return 0  # send() retries it, and reports the outage
        answered = self._answers(items, orjson.loads(response.content)["results"])
        if answered == len(items):
            self._outage.recovered()
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
            if is_monthly_limit(code, body):
                raise UploadStopped(f"server refused the upload (429): {body.get('error')}")
            if not is_final(code, body):
                if code >= 500 or code == 429:  # not a key in flight: the server is failing
                    self._outage.failing(
                        f"server {self.base_url} answered {code}: {body.get('error')}"
                    )
                break  # this and every later event go again, in order
            if code >= 300:
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
        delay = 0.1
        while sent < len(events):
            if self._stop.is_set():
                raise Interrupted
            batch = events[sent : sent + cap]
            response = self.wait(spawn(partial(self.post, batch)))
            if isinstance(response, httpx.HTTPError):
                cause = f"{type(response).__name__}: {response}".rstrip(": ")
                self._outage.failing(f"server unreachable at {self.base_url}: {cause}", delay)
                delay = self._outage.backoff(delay)
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
                self._outage.failing(
                    f"server {self.base_url} answered {status}: {_error(response)}", delay
                )
                delay = self._outage.backoff(delay, response.headers.get("retry-after"))
                continue
            if status != 200:
                raise UploadStopped(f"server refused a batch ({status}): {_error(response)}")
            final = self._answers(batch, orjson.loads(response.content)["results"], refusals)
            if final == len(batch):
                self._outage.recovered()
            sent += final
            delay = 0.1 if final == len(batch) else self._outage.backoff(delay)

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
