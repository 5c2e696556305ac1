"""Sending writes to the write path from a route: claim their Idempotency-Keys (a key whose
first request is still being applied answers 409), apply, release."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import anyio.to_thread
from fastapi import Request

from ...protocol import IN_FLIGHT
from ...storage.protocols import Ledger
from ...storage.records import Slot
from ..context import services
from ..errors import ApiError
from ..responses import JSONResponse
from . import idempotency
from .answers import Answer
from .commands import Envelope, Idempotency, RankEvents, Write

_PENDING = Answer(0, {})  # a placeholder: the write path has not answered yet
T = TypeVar("T")


async def apply_writes(
    request: Request, org_id: int, envelopes: list[Envelope]
) -> list[Answer | None]:
    """Apply envelopes in order; one answer per event (a RankEvents envelope holds many),
    ``None`` for those whose key is already in flight (409)."""
    found = services(request)
    ledger = found.stores.ledger
    keyed = [_slots(org_id, envelope) for envelope in envelopes]
    wanted = keyed[0] if len(keyed) == 1 else set().union(*keyed)
    owner = random.getrandbits(63)  # this request's claims
    taken = False
    runnable: list[Envelope] = []
    pending: list[Answer | None] = []  # _PENDING until the write path answers
    try:
        # Every key at once: one round trip to a shared ledger, whatever the batch holds.
        busy = await _on_ledger(ledger, ledger.claim, wanted, owner) if wanted else set()
        taken = len(busy) < len(wanted)
        for envelope, slots in zip(envelopes, keyed, strict=True):
            write = envelope.write
            if not busy or slots.isdisjoint(busy):
                # (A key repeated within this batch is fine: it is answered as a replay.)
                runnable.append(envelope)
                pending.extend([_PENDING] * (len(write) if isinstance(write, RankEvents) else 1))
            elif isinstance(write, RankEvents):
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
            else:
                pending.append(None)
        outcomes = await found.writer.submit(runnable)
    finally:
        if taken:
            await _on_ledger(ledger, ledger.release, owner)
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


def _slots(org_id: int, envelope: Envelope) -> set[Slot]:
    """The Idempotency-Keys an envelope's events are applied under."""
    write = envelope.write
    if isinstance(write, RankEvents):
        return set(write.keys().slots())
    idem = envelope.idempotency
    return set() if idem is None else {(org_id, idem.key_hi, idem.key_lo)}


async def _on_ledger(ledger: Ledger, call: Callable[..., T], *args: Any) -> T:
    """A claim or a release. On a shared ledger it is a database round trip: made on a
    worker thread, never on the event loop, and finished even when the request is
    cancelled meanwhile (a claim left behind holds its keys until its lease runs out)."""
    if not ledger.shared_claims:
        return call(*args)
    with anyio.CancelScope(shield=True):
        done = await anyio.to_thread.run_sync(call, *args)
    return done


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
