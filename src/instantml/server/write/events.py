"""An ``/api/ingest`` body decoded once into what the write path applies: each event's
id, and the commands it stands for, or the error that refuses it before anything is
applied.

Events are routed by the write table (``table.py``), so each is the same request as when
sent alone. Rank events, nearly every event an uploader sends, are decoded as typed
records (``wire.RankEvent``) and runs of them taken in columns (``rank_batch.py``), never
as one command each; a batch of nothing else is put in columns at once (by the decoding
process for a large one, ``decode_pool.py``). Any other event, or one that does not decode
as a rank event, is parsed and validated on its own (``validate.py``), which names what is
wrong with it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ..body import parse_object, parse_value, refuse_tokens
from ..errors import ApiError
from . import idempotency, rank_batch, table
from .commands import Envelope, RankEvents
from .wire import RankEvent


@dataclass(slots=True)
class Batch:
    """A decoded batch: its events' ids (None where an event has none), the envelopes to
    apply, in order, and the events refused before anything is applied (by index)."""

    event_ids: list[str | None]
    envelopes: list[Envelope]
    refused: dict[int, ApiError] = field(default_factory=dict)


def check_size(events: int, limit: int) -> None:
    if events > limit:
        raise ApiError(413, f"events: at most {limit} events per batch, got {events}")


def in_columns(event_ids: list[str], write: RankEvents, limit: int) -> Batch:
    """A batch of plain rank events, already in columns (by the decoding process)."""
    check_size(len(event_ids), limit)
    return Batch(list(event_ids), [Envelope(write)])


def decode(raw: bytes, org_id: int, limit: int) -> Batch:
    """The batch an ``/api/ingest`` body holds; ApiError when the body itself is not one."""
    events: list[Any] | None = rank_batch.decode_batch(raw)
    if events is None:  # not plainly {"events": [...]}: the general parser says what is wrong
        body = parse_object(raw, tokens=True)
        events = body.get("events")
        if not isinstance(events, list):
            raise ApiError(422, "events must be a list")
    check_size(len(events), limit)
    if events and all(type(event) is RankEvent for event in events):
        write = rank_batch.columns_of(events, org_id, time.time())
        if write is not None:  # the usual batch: every event plain, taken in columns
            return Batch([e.event_id for e in events], [Envelope(write)])
    batch = Batch([], [])
    columns = rank_batch.RankEventsBuilder(org_id)  # runs of plain rank-metrics events
    raw_events: list[msgspec.Raw] | None = None
    for index, event in enumerate(events):
        if type(event) is RankEvent and columns.take(event):
            batch.event_ids.append(event.event_id)
            continue
        if len(columns):
            batch.envelopes.append(Envelope(columns.build()))
        if type(event) is RankEvent:  # decoded, but not plain: checked as it was sent
            if raw_events is None:
                raw_events = rank_batch.raw_events(raw)
            event = raw_events[index]
        if type(event) is msgspec.Raw:
            event = parse_value(bytes(event))
        try:
            event_id, envelope = _event(org_id, event, index)
        except ApiError as exc:
            given = event.get("event_id") if isinstance(event, dict) else None
            batch.event_ids.append(given if type(given) is str else None)
            batch.refused[index] = exc
            continue
        batch.event_ids.append(event_id)
        batch.envelopes.append(envelope)
    if len(columns):
        batch.envelopes.append(Envelope(columns.build()))
    return batch


def _event(org_id: int, event: Any, index: int) -> tuple[str, Envelope]:
    """(event_id, envelope) for one event; ApiError names what is wrong with it."""
    if not isinstance(event, dict):
        raise ApiError(400, f"events[{index}] must be an object")
    event_id = event.get("event_id")
    if type(event_id) is not str or not 1 <= len(event_id) <= idempotency.MAX_KEY_LENGTH:
        raise ApiError(422, f"events[{index}].event_id must be a string of 1-255 characters")
    request = event.get("request")
    if not isinstance(request, dict):
        raise ApiError(422, f"events[{index}].request must be an object")
    method, path, body = request.get("method"), request.get("path"), request.get("body")
    if type(method) is not str or type(path) is not str:
        raise ApiError(422, f"events[{index}].request needs string 'method' and 'path'")
    if not isinstance(body, dict):
        raise ApiError(422, f"events[{index}].request.body must be an object")
    refuse_tokens(body)
    write = table.command(org_id, method, path, body)
    return event_id, Envelope(write, idempotency.make(org_id, event_id, method, path, body))
