"""The monthly metric-point guardrail: UTC calendar months and the refusal it answers with."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone

from .base import Outcome

SCOPE_HEADER = "X-InstantML-RateLimit-Scope"


def month_of(now: float) -> str:
    return time.strftime("%Y-%m", time.gmtime(now))


def reset_at(now: float) -> str:
    """The start of the next UTC calendar month, ISO 8601."""
    t = time.gmtime(now)
    year, month = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
    return datetime(year, month, 1, tzinfo=timezone.utc).isoformat().replace("+00:00", "Z")


@dataclass
class UsagePolicy:
    """The server-wide default limit (None: unlimited) and the clock months are read from."""

    default_limit: int | None = None
    clock: Callable[[], float] = field(default=time.time)


def refusal(limit: int, used: int, points: int, now: float) -> Outcome:
    return Outcome(
        429,
        {
            "error": f"monthly metric-point limit reached: limit {limit}, used {used},"
            f" this write {points}; the limit resets at {reset_at(now)}",
            "scope": "monthly",
            "limit": limit,
            "used": used,
            "reset_at": reset_at(now),
        },
        headers={SCOPE_HEADER: "monthly"},
    )
