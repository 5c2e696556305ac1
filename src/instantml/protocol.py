"""Wire-protocol constants the SDK's uploader and the server share."""

from __future__ import annotations

from typing import Any

# Answers that are not final: the same request may succeed if sent again later.
RETRY_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504})

# ``Instantml-Upload: <session>/<seq>`` on ``POST /api/ingest``: the uploader's batches, in
# the order it sent them (see server/write/upload_order.py).
UPLOAD_ORDER_HEADER = "Instantml-Upload"

# A 409 is two different answers, told apart by the ``code`` of its body: a request whose
# Idempotency-Key is still being applied (retry later), or a run id that exists in another
# project (final: sending it again changes nothing).
IN_FLIGHT = "in_flight"
RUN_CONFLICT = "run_conflict"


def is_final(status: int, body: Any = None) -> bool:
    """True when sending the request again cannot change the answer (a 2xx, or a refusal)."""
    if status == 409:
        return isinstance(body, dict) and body.get("code") == RUN_CONFLICT
    return status < 500 and status not in RETRY_STATUSES


def is_monthly_limit(status: int, body: Any = None, scope: str | None = None) -> bool:
    """The monthly guardrail's 429 (final until the month turns), by header or body."""
    if status != 429:
        return False
    return scope == "monthly" or (isinstance(body, dict) and body.get("scope") == "monthly")
