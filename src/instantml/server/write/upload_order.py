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

A session starts at seq 0. Which batches of it completed, and cleanly, is kept in the
ledger (``Ledger.mark_batch``): in PostgreSQL when several server processes share it, so
an uploader's batches may land on any of them. A batch waiting for its predecessor is
woken at once when that one completed in the same process, and otherwise finds its mark
by asking the ledger again, at most ``POLL_SECONDS`` apart. A batch whose predecessor
never completes (an uploader begun before a server restart on the embedded store, which
keeps the marks in memory) is refused after ``WAIT_SECONDS``; the uploader then starts a
new session.
"""

from __future__ import annotations

import asyncio
import re

from starlette.concurrency import run_in_threadpool

from ...protocol import UPLOAD_ORDER_HEADER
from ...storage.protocols import Ledger
from ..errors import ApiError

WAIT_SECONDS = 30.0  # for the batch before; then it is taken as lost
POLL_SECONDS = 0.02  # the longest wait between two looks at the ledger
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


class UploadOrder:
    """Ordered uploads, over the ledger's marks; this process's waiters on its event loop."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        # (org, session, seq) -> set when that batch completes in this process
        self._waiting: dict[tuple[int, str, int], asyncio.Event] = {}

    async def turn(self, org_id: int, session: str, seq: int) -> None:
        """Wait until batch ``seq`` may be applied; ApiError 409 if it may not."""
        wanted = [seq - 1, seq] if seq else [seq]
        before = (org_id, session, seq - 1)
        completed = self._waiting.setdefault(before, asyncio.Event())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_SECONDS
        pause = 0.001
        try:
            while True:
                marks = await run_in_threadpool(self._ledger.batch_marks, org_id, session, wanted)
                if seq in marks:
                    raise ApiError(409, f"{UPLOAD_ORDER_HEADER}: batch {seq} was already sent")
                if seq == 0 or seq - 1 in marks:
                    break
                left = deadline - loop.time()
                if left <= 0:
                    raise ApiError(
                        409,
                        f"{UPLOAD_ORDER_HEADER}: batch {seq - 1} of this upload never"
                        " completed; resend from it",
                    )
                try:
                    await asyncio.wait_for(completed.wait(), min(pause, left))
                except TimeoutError:
                    pause = min(2 * pause, POLL_SECONDS)
        finally:
            if self._waiting.get(before) is completed:
                del self._waiting[before]
        if seq and not marks[seq - 1]:
            raise ApiError(
                409,
                f"{UPLOAD_ORDER_HEADER}: an earlier batch of this upload did not complete;"
                " resend from its first unanswered event",
            )

    async def done(self, org_id: int, session: str, seq: int, clean: bool) -> None:
        """Batch ``seq`` has completed (or failed, ``clean=False``): the next may go. A
        clean batch had its turn, so every batch before it completed cleanly too."""
        await run_in_threadpool(self._ledger.mark_batch, org_id, session, seq, clean)
        completed = self._waiting.get((org_id, session, seq))
        if completed is not None:
            completed.set()
