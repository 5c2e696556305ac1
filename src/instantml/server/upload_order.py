"""Ordered pipelining of ``POST /api/ingest``: an uploader keeps two batches in flight, and
the server still applies them in the order they were sent.

A batch sent with ``Instantml-Upload: <session>/<seq>`` is read, parsed and checked as
soon as it arrives, while batch ``seq - 1`` of the same session is being committed; it is
applied only once that batch has completed, and only if every earlier batch of the
session completed cleanly (each event got a final answer). Otherwise it is refused whole
with 409 and nothing of it is applied: the uploader then resends, in order, from the
first event that has no final answer. So a segment's events are never applied out of
order (a run's creation before its points; a later rewrite of a point after the earlier
one), however requests race on their connections.

A session starts at seq 0. After a server restart, a batch of a session begun before it
waits for predecessors that never come, and is refused after ``WAIT_SECONDS``; the
uploader then starts a new session.
"""

from __future__ import annotations

import asyncio
import re
import time

from ..protocol import UPLOAD_ORDER_HEADER
from .errors import ApiError

WAIT_SECONDS = 30.0  # for the batch before; then it is taken as lost
IDLE_SECONDS = 600.0  # a session unused this long is forgotten
_VALUE = re.compile(r"([A-Za-z0-9_-]{1,64})/(\d{1,18})")


def parse(value: str) -> tuple[str, int]:
    match = _VALUE.fullmatch(value.strip())
    if match is None:
        raise ApiError(
            400,
            f"{UPLOAD_ORDER_HEADER}: expected '<session>/<seq>' (session: 1-64 letters,"
            " digits, '-' or '_'; seq: an integer >= 0)",
        )
    return match.group(1), int(match.group(2))


class _Session:
    __slots__ = ("changed", "clean", "completed", "finished", "used")

    def __init__(self) -> None:
        self.completed = -1  # every batch up to this seq has completed
        self.clean = True  # ... and each gave every event a final answer
        self.finished: dict[int, bool] = {}  # completed out of order, not yet folded in
        self.changed = asyncio.Condition()
        self.used = time.monotonic()


class UploadOrder:
    """The sessions of one server process (its event loop only: no lock needed)."""

    def __init__(self) -> None:
        self._sessions: dict[str, _Session] = {}

    async def turn(self, session_id: str, seq: int) -> None:
        """Wait until batch ``seq`` may be applied; ApiError 409 if it may not."""
        session = self._session(session_id)
        async with session.changed:
            try:
                await asyncio.wait_for(
                    session.changed.wait_for(lambda: session.completed >= seq - 1),
                    WAIT_SECONDS,
                )
            except TimeoutError:
                raise ApiError(
                    409,
                    f"{UPLOAD_ORDER_HEADER}: batch {seq - 1} of this upload never completed;"
                    " resend from it",
                ) from None
        if seq <= session.completed:
            raise ApiError(409, f"{UPLOAD_ORDER_HEADER}: batch {seq} was already sent")
        if not session.clean:
            raise ApiError(
                409,
                f"{UPLOAD_ORDER_HEADER}: an earlier batch of this upload did not complete;"
                " resend from its first unanswered event",
            )

    async def done(self, session_id: str, seq: int, clean: bool) -> None:
        """Batch ``seq`` has completed (or failed, ``clean=False``): later ones may go."""
        session = self._session(session_id)  # it may have failed before its turn
        if seq <= session.completed:
            return
        session.finished[seq] = clean
        while session.completed + 1 in session.finished:
            session.completed += 1
            session.clean = session.finished.pop(session.completed) and session.clean
        async with session.changed:
            session.changed.notify_all()

    def _session(self, session_id: str) -> _Session:
        session = self._sessions.get(session_id)
        if session is None:  # batch 1 may well arrive before batch 0: both are in flight
            self._forget_idle()
            session = self._sessions[session_id] = _Session()
        session.used = time.monotonic()
        return session

    def _forget_idle(self) -> None:
        cutoff = time.monotonic() - IDLE_SECONDS
        for session_id in [s for s, v in self._sessions.items() if v.used < cutoff]:
            del self._sessions[session_id]
