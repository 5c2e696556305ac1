"""``POST /api/ingest``: a batch of events, each applied as if sent alone with its
``event_id`` as Idempotency-Key, each answered on its own."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated, Any

import msgspec
from fastapi import APIRouter, Depends, Request

from ...protocol import UPLOAD_ORDER_HEADER, is_final
from ...storage.records import ApiKeyRecord
from ..body import parse_object, parse_value, read_body, refuse_tokens
from ..context import require, services
from ..errors import ApiError
from ..responses import JSONResponse
from ..schemas import request_body
from ..write import idempotency, rank_batch, table, upload_order
from ..write.answers import Answer
from ..write.apply import apply_writes
from ..write.commands import Envelope, RankEvents
from ..write.wire import IngestBody, RankEvent

router = APIRouter()
Ingest = Annotated[ApiKeyRecord, Depends(require("ingest"))]


def _event(org_id: int, event: Any, index: int) -> tuple[Any, Envelope]:
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


@router.post("/api/ingest", openapi_extra=request_body(IngestBody))
async def ingest(request: Request, key: Ingest) -> JSONResponse:
    header = request.headers.get(UPLOAD_ORDER_HEADER)
    if header is None:
        return JSONResponse({"results": await _ingest(request, key, None)})
    session, seq = upload_order.parse(header)
    order = services(request).upload_order
    clean = False
    try:
        results = await _ingest(request, key, lambda: order.turn(key.org_id, session, seq))
        clean = all(is_final(result["status"], result["body"]) for result in results)
    finally:
        await order.done(key.org_id, session, seq, clean)
    return JSONResponse({"results": results})


async def _ingest(
    request: Request, key: ApiKeyRecord, turn: Callable[[], Awaitable[None]] | None
) -> list[dict[str, Any]]:
    """Check every event, wait for ``turn`` (if any), apply, answer each event."""
    raw = await read_body(request)
    found = services(request)
    limit = found.settings.max_batch_events
    decoded = await found.decoder.decode(raw, key.org_id)
    if decoded is not None:  # plain rank events, in columns already
        return await _plain(request, key, turn, limit, *decoded)
    events: list[Any] | None = rank_batch.decode_batch(raw)
    if events is None:  # not plainly {"events": [...]}: the general parser says what is wrong
        body = parse_object(raw, tokens=True)
        events = body.get("events")
        if not isinstance(events, list):
            raise ApiError(422, "events must be a list")
    if len(events) > limit:
        raise ApiError(413, f"events: at most {limit} events per batch, got {len(events)}")
    if events and all(type(event) is RankEvent for event in events):
        write = rank_batch.columns_of(events, key.org_id, time.time())
        if write is not None:  # the usual batch: every event plain, taken in columns
            return await _plain(request, key, turn, limit, [e.event_id for e in events], write)
    event_ids: list[str | None] = []
    refused: dict[int, ApiError] = {}  # answered before anything is applied
    envelopes: list[Envelope] = []
    columns = rank_batch.RankEventsBuilder(key.org_id)  # runs of plain rank-metrics events
    raw_events: list[msgspec.Raw] | None = None
    for index, event in enumerate(events):
        if type(event) is RankEvent and columns.take(event):
            event_ids.append(event.event_id)
            continue
        if len(columns):
            envelopes.append(Envelope(columns.build()))
        if type(event) is RankEvent:  # decoded, but not ours: as it was sent
            if raw_events is None:
                raw_events = rank_batch.raw_events(raw)
            event = raw_events[index]
        if type(event) is msgspec.Raw:
            event = parse_value(bytes(event))
        try:
            event_id, envelope = _event(key.org_id, event, index)
        except ApiError as exc:
            event_id = event.get("event_id") if isinstance(event, dict) else None
            event_ids.append(event_id if type(event_id) is str else None)
            refused[index] = exc
            continue
        event_ids.append(event_id)
        envelopes.append(envelope)
    if len(columns):
        envelopes.append(Envelope(columns.build()))
    if turn is not None:
        await turn()
    return _results(event_ids, refused, await apply_writes(request, key.org_id, envelopes))


async def _plain(
    request: Request,
    key: ApiKeyRecord,
    turn: Callable[[], Awaitable[None]] | None,
    limit: int,
    event_ids: list[str],
    write: RankEvents,
) -> list[dict[str, Any]]:
    """A batch of plain rank events, already in columns: one write."""
    if len(event_ids) > limit:
        raise ApiError(413, f"events: at most {limit} events per batch, got {len(event_ids)}")
    if turn is not None:
        await turn()
    return _results(event_ids, {}, await apply_writes(request, key.org_id, [Envelope(write)]))


def _results(
    event_ids: Sequence[str | None], refused: dict[int, ApiError], answered: list[Answer | None]
) -> list[dict[str, Any]]:
    """Each event's result, in order: refused before anything was applied, in flight
    (409), or the write path's answer."""
    first = answered[0] if answered else None
    shared = first is not None and not first.replayed and not refused
    if shared and all(outcome is first for outcome in answered):  # one answer for all: usual
        assert first is not None
        status, body = first.status, first.body
        return [{"event_id": id_, "status": status, "body": body} for id_ in event_ids]
    outcomes = iter(answered)
    results: list[dict[str, Any]] = []
    for index, event_id in enumerate(event_ids):
        early = refused.get(index) if refused else None
        if early is not None:
            results.append({"event_id": event_id, "status": early.status, "body": early.body()})
            continue
        outcome = next(outcomes)
        if outcome is None:
            result = {"event_id": event_id, "status": 409, "body": idempotency.IN_FLIGHT_BODY}
        else:
            result = {"event_id": event_id, "status": outcome.status, "body": outcome.body}
            if outcome.replayed:
                result["replayed"] = True
        results.append(result)
    return results
