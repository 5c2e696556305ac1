"""The common case of ``POST /api/ingest`` taken in columns: rank-metrics events.

An uploader's batch is thousands of events that are all ``POST /runs/{id}/rank-metrics``
with plainly valid bodies. msgspec decodes such a batch straight into typed records
(:class:`RankBody`), checking types and ranges as it parses, and :class:`RankEventsBuilder`
appends them to columns without building a dict or a write object per event.

A batch that does not decode that way as a whole (a run's creation in it, a bad event)
is split into its events, each decoded on its own; an event that still does not (any
other route, an int where a float is expected, a bad field) goes to the general path in
``writes.py``, which applies the same rules and names what is wrong. So both paths accept
exactly the same events (``tests/server/test_ingest_fast.py`` holds them to that).
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import msgspec
import numpy as np
from msgspec import Meta

from .commands import RankEvents
from .idempotency import MAX_KEY_LENGTH, key_hash, typed_fingerprint
from .rank_body import RankBody, rank_route


# gc=False: these hold no cycles, and a batch makes tens of thousands of them; the cyclic
# collector need not track (or walk) any.
class _Request(msgspec.Struct, gc=False):
    method: str
    path: str
    body: RankBody


class RankEvent(msgspec.Struct, gc=False):
    event_id: Annotated[str, Meta(min_length=1, max_length=MAX_KEY_LENGTH)]
    request: _Request


class _Batch(msgspec.Struct):
    events: list[RankEvent]


class _RawBatch(msgspec.Struct):
    events: list[msgspec.Raw]


_BATCH = msgspec.json.Decoder(_Batch)
_RAW_BATCH = msgspec.json.Decoder(_RawBatch)
_EVENT = msgspec.json.Decoder(RankEvent)


def decode_batch(raw: bytes) -> list[RankEvent | msgspec.Raw] | None:
    """The events of an ingest body: typed where they decode as rank events, raw JSON
    where not; None when the body is not ``{"events": [...]}`` of JSON values at all (the
    general parser then says what is wrong with it)."""
    try:
        return list(_BATCH.decode(raw).events)
    except msgspec.DecodeError:
        pass
    try:
        events = _RAW_BATCH.decode(raw).events
    except msgspec.DecodeError:
        return None
    decoded: list[RankEvent | msgspec.Raw] = []
    for event in events:
        try:
            decoded.append(_EVENT.decode(event))
        except msgspec.DecodeError:
            decoded.append(event)
    return decoded


def raw_events(raw: bytes) -> list[msgspec.Raw]:
    """The events of a body :func:`decode_batch` decoded, each as the JSON it was sent as."""
    return _RAW_BATCH.decode(raw).events


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

    def take(self, event: RankEvent) -> bool:
        """Append a decoded rank event; False (nothing appended) if the general path must
        decide (another method or route, a rank outside world_size, non-finite marks)."""
        request = event.request
        if request.method != "POST":
            return False
        run_id = rank_route(request.path)
        body = request.body
        size = body.world_size
        local_rank = body.local_rank
        if run_id is None or body.rank >= size or body.nonfinite is not None:
            return False
        if local_rank is None:
            local_rank = -1
        elif local_rank >= size:
            return False
        hi, lo = key_hash(event.event_id)
        self._rows.append(
            (
                run_id,
                body.step,
                body.rank,
                size,
                local_rank,
                1.0 if body.weight is None else body.weight,
                self._now if body.timestamp is None else body.timestamp,
                body.metrics,
                hi,
                lo,
                typed_fingerprint(request.path, body),
            )
        )
        return True

    def build(self) -> RankEvents:
        """The events taken so far as one write; the builder starts empty again."""
        columns: list[Any] = [list(column) for column in zip(*self._rows, strict=True)]
        columns[-3:] = [np.array(column, dtype=np.int64) for column in columns[-3:]]
        self.clear()
        return RankEvents(self.org_id, *columns)
