"""Summary answers kept for the dashboard's polls, so that their cost does not grow with
the run.

A live run's Distributed tab asks for the same summary every 5 s. What one costs grows
with the run (its step rows linearly, its heatmap's cover with the log of the run's
length), and under heavy ingest it shares the cores with the writer: with every answer
computed afresh, the polls' share of the machine, and the writes' latency with it, grow
as the run does (docs/reliability.md, the soak).

So a request that says how old an answer it accepts (``Cache-Control: max-age=N``, as
the dashboard's own refreshes send) gets the answer last computed for the same run, key
and parameters when that one is at most N seconds old and younger than ``REUSE`` times
what it took to compute (its waits for the writer included): one view's polls recompute
at most once per ``REUSE`` times a summary's cost, about 1/``REUSE`` of a core whatever
the run's length, and a quick summary (most runs') is still computed for every poll.
``REUSE`` is the server's ``summary_reuse`` setting (``INSTANTML_SUMMARY_REUSE``; 0: every
answer computed afresh). A reused answer says how old it is
in an ``Age`` header (RFC 9111). A request without the header (the API's clients, the
CLI, a user's own click in the dashboard) always gets an answer computed for it, holding
every point committed before it.

Kept per server process, in memory, as the rendered bytes; an answer that can no longer be
reused is dropped at the next one kept, and at most ``ENTRIES`` are kept.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

REUSE = 10.0  # an answer serves polls for up to this many times what it took to compute
ENTRIES = 32


@dataclass(frozen=True, slots=True)
class Kept:
    body: bytes
    at: float  # when its computation began (its snapshot is no older)
    until: float  # the budget's end: ``at`` + REUSE x what it took


class RecentAnswers:
    def __init__(
        self,
        reuse: float = REUSE,
        entries: int = ENTRIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kept: OrderedDict[Hashable, Kept] = OrderedDict()
        self._reuse = reuse
        self._entries = entries
        self.clock = clock

    def get(self, key: Hashable, max_age: float) -> tuple[bytes, float] | None:
        """The body kept for ``key`` and its age in seconds, when it is at most
        ``max_age`` old and still within its budget; else None."""
        kept = self._kept.get(key)
        if kept is None:
            return None
        now = self.clock()
        age = now - kept.at
        if age > max_age or now > kept.until:
            return None
        self._kept.move_to_end(key)
        return kept.body, age

    def put(self, key: Hashable, body: bytes, at: float, cost: float) -> None:
        """Keep an answer computed from ``at`` on, in ``cost`` seconds."""
        if self._reuse <= 0:
            return
        now = self.clock()
        for old in [k for k, kept in self._kept.items() if now > kept.until]:
            del self._kept[old]
        self._kept[key] = Kept(body, at, at + self._reuse * cost)
        self._kept.move_to_end(key)
        while len(self._kept) > self._entries:
            self._kept.popitem(last=False)

    def __len__(self) -> int:
        return len(self._kept)


def max_age(cache_control: str | None) -> float:
    """The ``max-age`` a request's ``Cache-Control`` accepts, in seconds: 0 when it has
    none, says ``no-cache`` or ``no-store``, or its value is not a number of seconds."""
    if not cache_control:
        return 0.0
    found = 0.0
    for directive in cache_control.lower().split(","):
        name, _, value = directive.strip().partition("=")
        if name in ("no-cache", "no-store"):
            return 0.0
        if name == "max-age":
            try:
                found = max(0.0, float(int(value.strip().strip('"'))))
            except ValueError:
                return 0.0
    return found
