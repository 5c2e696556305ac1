"""Every answer a write gets, in HTTP terms (status, body, headers): the one place where the
write service's outcomes become what a client reads. Stores never see these."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import orjson

from ...protocol import RUN_CONFLICT
from ...storage.records import RunConflict, RunRecord, StoredAnswer
from .guardrail import reset_at

SCOPE_HEADER = "X-InstantML-RateLimit-Scope"


@dataclass(slots=True)
class Answer:
    status: int
    body: dict[str, Any]
    replayed: bool = False
    headers: dict[str, str] | None = None
    each: list[Answer] | None = None  # a RankEvents write: one answer per event

    def text(self) -> str:
        """The body as stored for replays (JSON text)."""
        accepted = self.body.get("accepted")
        if len(self.body) == 1 and type(accepted) is int:
            return accepted_text(accepted)
        return orjson.dumps(self.body).decode()


@lru_cache(maxsize=1024)
def accepted(points: int) -> Answer:
    # Shared: nothing changes an Answer once given.
    return Answer(200, {"accepted": points})


@lru_cache(maxsize=1024)
def accepted_text(points: int) -> str:
    # The stored answer of nearly every metric write: serialise each count once.
    return orjson.dumps({"accepted": points}).decode()


EMPTY = Answer(200, {})


def run(record: RunRecord, created: bool = False) -> Answer:
    return Answer(201 if created else 200, {"run": record.to_json()})


def run_conflict(conflict: RunConflict) -> Answer:
    return Answer(
        409,
        {
            "error": f"id: run {conflict.run_id!r} already exists in another project"
            f" ({conflict.project!r})",
            "code": RUN_CONFLICT,
        },
    )


def unknown_run(run_id: str) -> Answer:
    return Answer(404, {"error": f"run {run_id!r} not found"})


def over_limit(limit: int, used: int, points: int, now: float) -> Answer:
    return Answer(
        429,
        {
            "error": f"monthly metric-point limit reached: limit {limit}, used {used},"
            f" this write {points}; the limit resets at {reset_at(now)}",
            "scope": "monthly",
            "limit": limit,
            "used": used,
            "reset_at": reset_at(now),
        },
        headers={SCOPE_HEADER: "monthly"},
    )


def replay(stored: StoredAnswer, fingerprint: int) -> Answer:
    """The first answer to a key again, or 422 when the request is not the same."""
    if stored.fingerprint != fingerprint:
        return Answer(
            422,
            {"error": "Idempotency-Key: this key was already used with a different request body"},
        )
    return Answer(stored.status, orjson.loads(stored.body), replayed=True)


def storage_failed(exc: Exception) -> Answer:
    """Nothing was written; the client may retry."""
    return Answer(503, {"error": f"storage error: {type(exc).__name__}; retry"})
