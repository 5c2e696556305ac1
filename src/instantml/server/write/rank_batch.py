"""The common case of ``POST /api/ingest`` taken in columns: rank-metrics events.

An uploader's batch is thousands of events that are all ``POST /runs/{id}/rank-metrics``
with plainly valid bodies. msgspec decodes such a batch straight into typed records
(:class:`RankFields`), checking types and ranges as it parses, and :class:`RankEventsBuilder`
appends them to columns without building a dict or a write object per event.

A batch that does not decode that way as a whole (a run's creation in it, a bad event)
is split into its events, each decoded on its own; an event that still does not (any
other route, an int where a float is expected, a bad field) goes to the general path in
``validate.py``, which applies the same rules and names what is wrong. So both paths accept
exactly the same events (``tests/server/test_ingest_fast.py`` holds them to that).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from itertools import repeat
from operator import attrgetter
from typing import Any, cast

import msgspec
import numpy as np
import xxhash

from .commands import MetricMatrix, RankEvents
from .idempotency import (
    canonicals,
    fingerprint_prefix,
    key_hash,
    key_sequence,
    key_sequences,
    typed_fingerprint,
)
from .table import rank_run
from .wire import RankEvent


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


def plain_batch(raw: bytes, org_id: int) -> tuple[list[str], RankEvents] | None:
    """A batch whose every event is a plain rank event, in columns: (event ids, events).
    None when any is not; the route then takes the batch event by event.

    Pure (bytes in, columns out), so that it can run in a decoding process
    (``decode_pool.py``): nothing it returns is tied to this process."""
    try:
        events = _BATCH.decode(raw).events
    except msgspec.DecodeError:
        return None
    write = columns_of(events, org_id, time.time())
    if write is None:
        return None
    return list(map(_EVENT_ID, events)), write


_EVENT_ID = attrgetter("event_id")
_REQUEST = attrgetter("request")
_FIELDS = [
    attrgetter(name)
    for name in (
        "step",
        "rank",
        "world_size",
        "local_rank",
        "weight",
        "timestamp",
        "node",
        "metrics",
    )
]
_NONFINITE = attrgetter("nonfinite")


def _has_nul(names: Iterable[str], nodes: Iterable[str | None]) -> bool:
    """Whether a metric name or a node holds NUL, which :class:`RankFields` leaves to be
    checked once per distinct value: such an event goes to the general path, which
    refuses it naming the field."""
    return any("\x00" in name for name in names) or any(
        node is not None and "\x00" in node for node in set(nodes)
    )


def columns_of(events: list[RankEvent], org_id: int, now: float) -> RankEvents | None:
    """Decoded events as one write, in columns, if every one is plain (what
    :meth:`RankEventsBuilder.take` takes); else None. The same columns the builder gives,
    with the per-event work done by C-level maps and numpy instead of a Python loop."""
    if not events:
        return None
    requests = list(map(_REQUEST, events))
    if any(method != "POST" for method in set(map(attrgetter("method"), requests))):
        return None
    paths = list(map(attrgetter("path"), requests))
    routes = {path: rank_run(path) for path in set(paths)}
    if None in routes.values():
        return None
    runs = cast(dict[str, str], routes)
    bodies = list(map(attrgetter("body"), requests))
    if any(x is not None for x in map(_NONFINITE, bodies)):
        return None
    steps, ranks, sizes, locals_, weights, stamps, nodes, metrics = (
        list(map(field, bodies)) for field in _FIELDS
    )
    size = np.array(sizes, dtype=np.int64)
    local = np.array([-1 if x is None else x for x in locals_], dtype=np.int64)
    if (np.array(ranks, dtype=np.int64) >= size).any() or (local >= size).any():
        return None
    keys = np.frombuffer(
        b"".join(map(xxhash.xxh3_128_digest, map(str.encode, map(_EVENT_ID, events)))),
        dtype=">i8",
    ).astype(np.int64)
    if len(runs) == 1:
        prefixes: Iterable[bytes] = repeat(fingerprint_prefix(paths[0]))
    else:
        prefixes = map(fingerprint_prefix, paths)
    prints = np.frombuffer(
        b"".join(map(xxhash.xxh3_64_digest, map(bytes.__add__, prefixes, canonicals(bodies)))),
        dtype=">i8",
    ).astype(np.int64)
    matrix = MetricMatrix.of(metrics)
    if _has_nul(matrix.names if matrix is not None else set().union(*metrics), nodes):
        return None
    return RankEvents(
        org_id,
        [runs[path] for path in paths] if len(runs) > 1 else [runs[paths[0]]] * len(paths),
        steps,
        ranks,
        sizes,
        local.tolist(),
        [1.0 if w is None else w for w in weights],
        [now if t is None else t for t in stamps],
        nodes,
        metrics if matrix is None else matrix,
        keys[0::2].copy(),
        keys[1::2].copy(),
        prints,
        *key_sequences(map(_EVENT_ID, events)),
    )


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
        run_id = rank_run(request.path)
        body = request.body
        size = body.world_size
        local_rank = body.local_rank
        if run_id is None or body.rank >= size or body.nonfinite is not None:
            return False
        if _has_nul(body.metrics, (body.node,)):
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
                body.node,
                body.metrics,
                hi,
                lo,
                typed_fingerprint(request.path, body),
                *key_sequence(event.event_id),
            )
        )
        return True

    def build(self) -> RankEvents:
        """The events taken so far as one write; the builder starts empty again."""
        columns: list[Any] = [list(column) for column in zip(*self._rows, strict=True)]
        columns[-5:] = [np.array(column, dtype=np.int64) for column in columns[-5:]]
        matrix = MetricMatrix.of(columns[8])
        if matrix is not None:
            columns[8] = matrix
        self.clear()
        return RankEvents(self.org_id, *columns)
