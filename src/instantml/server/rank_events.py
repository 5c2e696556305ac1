"""The common case of ``POST /api/ingest`` taken in columns: rank-metrics events.

An uploader's batch is thousands of events that are all ``POST /runs/{id}/rank-metrics``
with plainly valid bodies. :class:`RankEventsBuilder` takes such an event with a few
``type(...) is`` checks and appends it to columns, without building a write object per
event. Anything it is not sure of (an int metric value, a string timestamp, a bad field)
goes to the general path in ``writes.py``, which applies the same rules and names what is
wrong, so both paths accept exactly the same events (``tests/server/test_ingest_fast.py``
holds them to that).
"""

from __future__ import annotations

import math
import time
from functools import lru_cache
from typing import Any

from .. import validation
from ..storage.base import RankEvents
from .idempotency import MAX_KEY_LENGTH, fingerprint, key_hash


@lru_cache(maxsize=4096)
def _rank_route(path: str) -> str | None:
    """The run id of a ``/runs/{id}/rank-metrics`` path, else None."""
    parts = path.strip("/").split("/")
    if len(parts) == 3 and parts[0] == "runs" and parts[2] == "rank-metrics" and "?" not in path:
        return parts[1]
    return None


@lru_cache(maxsize=4096)
def _plain_keys(keys: frozenset[str]) -> bool:
    """Metric names the general path would accept (non-empty, at most 512 UTF-8 bytes)."""
    return all(type(k) is str and k and len(k.encode()) <= validation.MAX_KEY_BYTES for k in keys)


class RankEventsBuilder:
    def __init__(self, org_id: int) -> None:
        self.org_id = org_id
        self._now = time.time()
        self.clear()

    def clear(self) -> None:
        # One tuple per event, transposed into columns by build() (zip runs in C).
        self._rows: list[tuple[Any, ...]] = []

    def __len__(self) -> int:
        return len(self._rows)

    def take(self, event: Any) -> str | None:
        """Append a plainly valid rank-metrics event and return its event_id; None (and
        nothing appended) for anything else."""
        if type(event) is not dict:
            return None
        event_id = event.get("event_id")
        request = event.get("request")
        if type(event_id) is not str or type(request) is not dict:
            return None
        if not 0 < len(event_id) <= MAX_KEY_LENGTH:
            return None
        path = request.get("path")
        body = request.get("body")
        if request.get("method") != "POST" or type(path) is not str or type(body) is not dict:
            return None
        run_id = _rank_route(path)
        if run_id is None:
            return None
        metrics = body.get("metrics")
        step = body.get("step")
        rank = body.get("rank")
        size = body.get("world_size")
        if type(metrics) is not dict or not metrics:
            return None
        if type(step) is not int or type(rank) is not int or type(size) is not int:
            return None
        if not (0 <= step <= validation.MAX_STEP and 0 <= rank < size <= validation.MAX_WORLD_SIZE):
            return None
        local_rank = body.get("local_rank")
        if local_rank is None:
            local_rank = -1
        elif type(local_rank) is not int or not 0 <= local_rank < size:
            return None
        weight = body.get("weight")
        if weight is None:
            weight = 1.0
        elif type(weight) is not float or not 0.0 < weight < math.inf:
            return None
        stamp = body.get("timestamp")
        if stamp is None:
            stamp = self._now
        elif type(stamp) is not float or not -1e11 < stamp < 1e11:
            return None
        for value in metrics.values():
            # Floats only (an int takes the general path, which converts it); v - v is 0.0
            # for every finite float and NaN for inf and NaN.
            if type(value) is not float or value - value != 0.0:
                return None
        if not _plain_keys(frozenset(metrics)):
            return None
        hi, lo = key_hash(event_id)
        self._rows.append(
            (
                run_id,
                step,
                rank,
                size,
                local_rank,
                weight,
                stamp,
                metrics,
                hi,
                lo,
                fingerprint("POST", path, body),
            )
        )
        return event_id

    def build(self) -> RankEvents:
        """The events taken so far as one write; the builder starts empty again."""
        columns = [list(column) for column in zip(*self._rows, strict=True)]
        self.clear()
        return RankEvents(self.org_id, *columns)
