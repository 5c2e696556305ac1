"""The monthly metric-point guardrail's policy: the server-wide default limit, the clock,
and UTC calendar months."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ...storage.protocols import Stores


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


def usage(stores: Stores, policy: UsagePolicy, org_id: int) -> dict[str, Any]:
    """This month's metric points of an org: ``{"month", "used", "limit", "reset_at"}``."""
    now = policy.clock()
    month = month_of(now)
    own = stores.tenancy.monthly_limit(org_id)
    return {
        "month": month,
        "used": stores.ledger.used(org_id, month),
        "limit": policy.default_limit if own is None else own,
        "reset_at": reset_at(now),
    }
