"""``POST /api/ingest``: a batch of events, each applied as if sent alone with its
``event_id`` as Idempotency-Key, each answered on its own."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from ...protocol import UPLOAD_ORDER_HEADER, is_final
from ...storage.records import ApiKeyRecord
from ..body import read_body
from ..context import require, services
from ..errors import ApiError
from ..responses import JSONResponse
from ..schemas import request_body
from ..write import events, idempotency, upload_order
from ..write.answers import Answer
from ..write.apply import apply_writes
from ..write.wire import IngestBody

router = APIRouter()
Ingest = Annotated[ApiKeyRecord, Depends(require("ingest"))]


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
    """Decode every event, wait for ``turn`` (if any), apply, answer each event."""
    raw = await read_body(request)
    found = services(request)
    limit = found.settings.max_batch_events
    with found.writer.expecting():
        columns = await found.decoder.decode(raw, key.org_id)  # a large batch, elsewhere
        if columns is not None:
            batch = events.in_columns(*columns, limit)
        else:
            batch = events.decode(raw, key.org_id, limit)
        if turn is not None:
            await turn()
        answered = await apply_writes(request, key.org_id, batch.envelopes)
    return _results(batch.event_ids, batch.refused, answered)


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
