"""Applying writes through the group committer, with Idempotency-Key semantics."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from ..storage.base import Envelope, Idempotency, Outcome, Write
from . import idempotency
from .errors import ApiError
from .responses import JSONResponse


async def apply_writes(
    request: Request, org_id: int, envelopes: list[Envelope]
) -> list[Outcome | None]:
    """Apply envelopes in order; ``None`` for those whose key is already in flight (409)."""
    state = request.app.state
    claimed: set[tuple[int, int, int]] = set()
    runnable: list[Envelope] = []
    answers: list[Outcome | None] = []
    for envelope in envelopes:
        idem = envelope.idempotency
        if idem is not None and (org_id, idem.key_hi, idem.key_lo) not in claimed:
            # A key repeated within this batch is fine: the store answers it as a replay.
            slot = state.in_flight.claim(org_id, idem)
            if slot is None:
                answers.append(None)
                continue
            claimed.add(slot)
        runnable.append(envelope)
        answers.append(Outcome(0, {}))
    try:
        outcomes = iter(await state.writer.submit(runnable))
    finally:
        state.in_flight.release(claimed)
    return [next(outcomes) if answer is not None else None for answer in answers]


def idempotency_of(request: Request, org_id: int, body: Any) -> Idempotency | None:
    key = request.headers.get("idempotency-key")
    if key is None:
        return None
    return idempotency.make(org_id, key, request.method, request.url.path, body)


async def apply_one(request: Request, org_id: int, write: Write, body: Any) -> JSONResponse:
    envelope = Envelope(write, idempotency_of(request, org_id, body))
    (outcome,) = await apply_writes(request, org_id, [envelope])
    if outcome is None:
        raise ApiError(409, idempotency.IN_FLIGHT_ERROR)
    headers = dict(outcome.headers or {})
    if outcome.replayed:
        headers["Idempotent-Replayed"] = "true"
    return JSONResponse(outcome.body, status_code=outcome.status, headers=headers)
