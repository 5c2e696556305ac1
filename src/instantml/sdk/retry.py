"""The client's one retry policy. Sync calls, the async sender and the spool uploader all
decide with it: what an answer means (done, send again, refused for good, or stop every
upload), and how long to wait before sending again."""

from __future__ import annotations

import enum
import random
from typing import Any

from ..protocol import is_final, is_monthly_limit


class Verdict(enum.Enum):
    DONE = "done"  # applied (2xx)
    RETRY = "retry"  # transient: the same request, sent again later, may be applied
    REFUSED = "refused"  # refused for good: sending it again changes nothing
    STOP = "stop"  # the server takes nothing more from this key (refused key, monthly limit)


def of_request(status: int, body: Any = None, scope: str | None = None) -> Verdict:
    """What one HTTP answer means (``scope``: its ``X-Instantml-Ratelimit-Scope``)."""
    if status in (401, 403) or is_monthly_limit(status, body, scope):
        return Verdict.STOP
    if not is_final(status, body):
        return Verdict.RETRY
    return Verdict.REFUSED if status >= 300 else Verdict.DONE


def of_event(status: int, body: Any = None) -> Verdict:
    """What one event's answer inside an ``/api/ingest`` batch means."""
    if 200 <= status < 300:
        return Verdict.DONE
    if is_monthly_limit(status, body):
        return Verdict.STOP
    return Verdict.REFUSED if is_final(status, body) else Verdict.RETRY


class Backoff:
    """Waits between sends of the same thing: ``first`` seconds, doubling up to ``most``,
    jittered (ranks retrying against one server spread out), and never shorter than the
    server's ``Retry-After`` (itself held to ``most``)."""

    def __init__(self, first: float = 0.1, most: float = 5.0) -> None:
        self.first = first
        self.most = most
        self._delay = first

    def next(self, retry_after: str | None = None) -> float:
        """The seconds to wait now; the wait after it doubles."""
        wait = self._delay * (0.5 + random.random())
        if retry_after:
            try:
                wait = max(wait, float(retry_after))
            except ValueError:
                pass
        self._delay = min(self._delay * 2, self.most)
        return min(wait, self.most)

    @property
    def delay(self) -> float:
        """The wait the next :meth:`next` is drawn around."""
        return self._delay

    def reset(self) -> None:
        """The server answered: the next wait starts from ``first`` again."""
        self._delay = self.first
