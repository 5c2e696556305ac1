"""Sending writes to the write path from a route: claim their Idempotency-Keys (a key whose
first request is still being applied answers 409), apply, release."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from ...protocol import IN_FLIGHT
from ...storage.records import Slot
from ..context import services
from ..errors import ApiError
from ..responses import JSONResponse
from . import idempotency
from .answers import Answer
from .commands import Envelope, Idempotency, RankEvents, Write

_PENDING = Answer(0, {})  # a placeholder: the write path has not answered yet


async def apply_writes(
    request: Request, org_id: int, envelopes: list[Envelope]
) -> list[Answer | None]:
    """Apply envelopes in order; one answer per event (a RankEvents envelope holds many),
    ``None`` for those whose key is already in flight (409)."""
    found = services(request)
    ledger = found.stores.ledger
    claimed: set[Slot] = set()
    runnable: list[Envelope] = []
    pending: list[Answer | None] = []  # _PENDING until the write path answers
    try:
        for envelope in envelopes:
            write = envelope.write
            if isinstance(write, RankEvents):
                slots = set(write.keys().slots()) - claimed
                busy = ledger.claim(slots)
                claimed.update(slots - busy)
                if not busy:
                    runnable.append(envelope)
                    pending.extend([_PENDING] * len(write))
                    continue
                # Some are in flight (409): the others go on, still in columns.
                free = [
                    i
                    for i, slot in enumerate(zip(write.key_hi.tolist(), write.key_lo.tolist()))
                    if (org_id, *slot) not in busy
                ]
                pending.extend([None] * len(write))
                for i in free:
                    pending[len(pending) - len(write) + i] = _PENDING
                if free:
                    runnable.append(Envelope(write.take(free)))
                continue
            idem = envelope.idempotency
            if idem is not None and (org_id, idem.key_hi, idem.key_lo) not in claimed:
                # A key repeated within this batch is fine: it is answered as a replay.
                slot = (org_id, idem.key_hi, idem.key_lo)
                if ledger.claim({slot}):
                    pending.append(None)
                    continue
                claimed.add(slot)
            runnable.append(envelope)
            pending.append(_PENDING)
        outcomes = await found.writer.submit(runnable)
    finally:
        ledger.release(claimed)
    each: list[Answer] = []
    for envelope, outcome in zip(runnable, outcomes, strict=True):
        if outcome.each is not None:
            each.extend(outcome.each)
        elif isinstance(envelope.write, RankEvents):  # failed whole (storage): each event so
            each.extend([outcome] * len(envelope.write))
        else:
            each.append(outcome)
    answered = iter(each)
    return [next(answered) if answer is _PENDING else None for answer in pending]


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
