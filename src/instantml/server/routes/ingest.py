"""``POST /api/ingest``: a batch of events, each applied as if sent alone with its
``event_id`` as Idempotency-Key, each answered on its own."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from ...storage.base import ApiKeyRecord, Envelope
from .. import idempotency, schemas, writes
from ..apply import apply_writes
from ..auth import require
from ..body import read_json_object
from ..errors import ApiError
from ..rank_events import RankEventsBuilder
from ..responses import JSONResponse

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
    write = writes.from_request(org_id, method, path, body)
    return event_id, Envelope(write, idempotency.make(org_id, event_id, method, path, body))


@router.post("/api/ingest", openapi_extra=schemas.INGEST)
async def ingest(request: Request, key: Ingest) -> JSONResponse:
    body = await read_json_object(request)
    events = body.get("events")
    if not isinstance(events, list):
        raise ApiError(422, "events must be a list")
    limit = request.app.state.settings.max_batch_events
    if len(events) > limit:
        raise ApiError(413, f"events: at most {limit} events per batch, got {len(events)}")
    results: list[dict[str, Any]] = []
    envelopes: list[Envelope] = []
    columns = RankEventsBuilder(key.org_id)  # runs of plain rank-metrics events
    for index, event in enumerate(events):
        event_id = columns.take(event)
        if event_id is not None:
            results.append({"event_id": event_id})
            continue
        if len(columns):
            envelopes.append(Envelope(columns.build()))
        try:
            event_id, envelope = _event(key.org_id, event, index)
        except ApiError as exc:
            event_id = event.get("event_id") if isinstance(event, dict) else None
            if type(event_id) is not str:
                event_id = None
            results.append(
                {"event_id": event_id, "status": exc.status, "body": {"error": exc.message}}
            )
            continue
        results.append({"event_id": event_id})
        envelopes.append(envelope)
    if len(columns):
        envelopes.append(Envelope(columns.build()))
    outcomes = iter(await apply_writes(request, key.org_id, envelopes))
    for result in results:
        if "status" not in result:
            outcome = next(outcomes)
            if outcome is None:
                result["status"], result["body"] = 409, {"error": idempotency.IN_FLIGHT_ERROR}
            else:
                result["status"], result["body"] = outcome.status, outcome.body
                if outcome.replayed:
                    result["replayed"] = True
    return JSONResponse({"results": results})
