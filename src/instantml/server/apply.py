"""Applying writes through the group committer, with Idempotency-Key semantics."""

from __future__ import annotations

from itertools import repeat
from typing import Any

from fastapi import Request

from ..protocol import IN_FLIGHT
from ..storage.base import Envelope, Idempotency, Outcome, RankEvents, Write
from . import idempotency
from .errors import ApiError
from .responses import JSONResponse

_PENDING = Outcome(0, {})  # a placeholder: the store has not answered yet


async def apply_writes(
    request: Request, org_id: int, envelopes: list[Envelope]
) -> list[Outcome | None]:
    """Apply envelopes in order; one answer per event (a RankEvents envelope holds many),
    ``None`` for those whose key is already in flight (409)."""
    in_flight = request.app.state.in_flight
    claimed: set[tuple[int, int, int]] = set()
    runnable: list[Envelope] = []
    answers: list[Outcome | None] = []  # _PENDING until the store answers
    try:
        for envelope in envelopes:
            write = envelope.write
            if isinstance(write, RankEvents):
                slots = set(zip(repeat(org_id), write.key_hi, write.key_lo)) - claimed
                busy = in_flight.claim_all(slots)
                claimed.update(slots - busy)
                if not busy:
                    runnable.append(envelope)
                    answers.extend([_PENDING] * len(write))
                    continue
                for single in write.envelopes():  # some are in flight: event by event
                    idem = single.idempotency
                    assert idem is not None
                    if (org_id, idem.key_hi, idem.key_lo) in busy:
                        answers.append(None)
                    else:
                        runnable.append(single)
                        answers.append(_PENDING)
                continue
            idem = envelope.idempotency
            if idem is not None and (org_id, idem.key_hi, idem.key_lo) not in claimed:
                # A key repeated within this batch is fine: the store answers it as a replay.
                slot = in_flight.claim(org_id, idem)
                if slot is None:
                    answers.append(None)
                    continue
                claimed.add(slot)
            runnable.append(envelope)
            answers.append(_PENDING)
        outcomes = await request.app.state.writer.submit(runnable)
    finally:
        in_flight.release(claimed)
    each: list[Outcome] = []
    for outcome in outcomes:
        if outcome.each is not None:
            each.extend(outcome.each)
        else:
            each.append(outcome)
    answered = iter(each)
    return [next(answered) if answer is _PENDING else None for answer in answers]


def idempotency_of(request: Request, org_id: int, body: Any) -> Idempotency | None:
    key = request.headers.get("idempotency-key")
    if key is None:
        return None
    return idempotency.make(org_id, key, request.method, request.url.path, body)


async def apply_one(request: Request, org_id: int, write: Write, body: Any) -> JSONResponse:
    envelope = Envelope(write, idempotency_of(request, org_id, body))
    (outcome,) = await apply_writes(request, org_id, [envelope])
    if outcome is None:
        raise ApiError(409, idempotency.IN_FLIGHT_ERROR, code=IN_FLIGHT)
    headers = dict(outcome.headers or {})
    if outcome.replayed:
        headers["Idempotent-Replayed"] = "true"
    return JSONResponse(outcome.body, status_code=outcome.status, headers=headers)
