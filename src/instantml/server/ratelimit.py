"""Short-term rate limits per API key (docs/reference.md, "HTTP API"): a token bucket per key,
``rate`` requests a second with bursts of ``2 * rate``, so that one runaway client cannot
starve the others. Over it: 429 with ``X-InstantML-RateLimit-Scope: second`` and
``Retry-After``; the SDKs' uploaders treat that as transient and retry after it.

Per server process, in memory (a limit, not an account: several processes each allow
``rate``). Used from the event loop only, so it needs no lock."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from .errors import ApiError
from .write.answers import SCOPE_HEADER

_IDLE = 60.0  # a bucket untouched this long is full again: forgotten


class RateLimiter:
    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = 2.0 * rate
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key id -> (tokens, at)
        self._swept = self._clock()

    def take(self, key_id: str) -> None:
        """One request of this key; ApiError 429 when it has none left."""
        if self.rate <= 0:
            return
        now = self._clock()
        tokens, at = self._buckets.get(key_id, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.rate)
        if tokens < 1.0:
            wait = (1.0 - tokens) / self.rate
            self._buckets[key_id] = (tokens, now)
            raise ApiError(
                429,
                f"rate limit: at most {self.rate:g} requests a second per API key (bursts of"
                f" {self.burst:g}); retry after {wait:.2f} s",
                {SCOPE_HEADER: "second", "Retry-After": str(max(1, math.ceil(wait)))},
            )
        self._buckets[key_id] = (tokens - 1.0, now)
        if now - self._swept > _IDLE:
            self._swept = now
            self._buckets = {k: v for k, v in self._buckets.items() if now - v[1] < _IDLE}
