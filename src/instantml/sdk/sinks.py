"""Where a run's requests go: a ``Sink`` per upload mode.

``sync`` sends each request at the call; ``async`` (:mod:`.async_sender`) queues it for a
background thread; ``spool`` writes it to local files for a separate uploader. The run
only ever calls ``create_run`` (once, first), ``submit``, ``flush`` and ``close``.
"""

from __future__ import annotations

import itertools
import uuid
from typing import Any, Protocol

from .records import CREATE_RUN
from .transport import Transport


class Sink(Protocol):
    def create_run(self, body: dict[str, Any]) -> None:
        """The run's creation: the first record, whose answer decides whether anything
        else of the run may be sent."""
        ...

    def submit(self, method: str, path: str, body: dict[str, Any]) -> None: ...

    def flush(self, timeout: float) -> bool:
        """Deliver what was submitted; False when the timeout passed first."""
        ...

    def close(self, timeout: float) -> bool: ...


class EventIds:
    """Unique event ids, cheap enough for the hot path: a random prefix and a counter."""

    def __init__(self) -> None:
        self._prefix = uuid.uuid4().hex
        self._counter = itertools.count(1)

    def __call__(self) -> str:
        return f"{self._prefix}-{next(self._counter)}"


class SyncSink:
    """One HTTP request per call, with an Idempotency-Key so its retries are safe."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport
        self._ids = EventIds()

    def create_run(self, body: dict[str, Any]) -> None:
        self.submit(*CREATE_RUN, body)

    def submit(self, method: str, path: str, body: dict[str, Any]) -> None:
        self._transport.request(method, path, body, idempotency_key=self._ids())

    def flush(self, timeout: float) -> bool:
        return True

    def close(self, timeout: float) -> bool:
        self._transport.close()
        return True
