"""What a run sends, as records: its creation, and every other request. Async mode queues
them in memory and spool mode appends them to segment files (lines of the same fields);
one sender (:mod:`.ingest`) ships both. A creation is a record of its own type: its answer
decides whether anything else of the run may be sent."""

from __future__ import annotations

from typing import Any

import orjson

CREATE_RUN = ("POST", "/runs")


def encode(event_id: str, method: str, path: str, body: dict[str, Any]) -> bytes:
    """A record as the wire's event: a request and the id its retries are known by."""
    return orjson.dumps(
        {"event_id": event_id, "request": {"method": method, "path": path, "body": body}}
    )


class Request:
    """A request of the run, with the event id its retries are known by."""

    __slots__ = ("body", "event_id", "method", "path")
    creates_run = False

    def __init__(self, event_id: str, method: str, path: str, body: dict[str, Any]) -> None:
        self.event_id = event_id
        self.method = method
        self.path = path
        self.body = body

    def encode(self) -> bytes:
        return encode(self.event_id, self.method, self.path, self.body)


class CreateRun(Request):
    """The run's creation (``POST /runs``), the first record a run writes."""

    __slots__ = ()
    creates_run = True

    def __init__(self, event_id: str, body: dict[str, Any]) -> None:
        super().__init__(event_id, *CREATE_RUN, body)


def from_line(line: bytes) -> Request | None:
    """A spooled line as its record (None when it is not an event: a torn or corrupt line).
    The spool keeps the wire's event as it is, so a creation is the line of a
    ``POST /runs``."""
    try:
        event = orjson.loads(line)
        request = event["request"]
        event_id, method, path = event["event_id"], request["method"], request["path"]
        body = request.get("body") or {}
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None
    if not all(isinstance(x, str) for x in (event_id, method, path)):
        return None
    if (method, path) == CREATE_RUN:
        return CreateRun(event_id, body)
    return Request(event_id, method, path, body)
