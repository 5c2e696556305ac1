"""Wire-protocol constants the SDK's uploader and the server share."""

from __future__ import annotations

# Answers that are not final: the same request may succeed if sent again later.
RETRY_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504})

# ``Instantml-Upload: <session>/<seq>`` on ``POST /api/ingest``: the uploader's batches, in
# the order it sent them (see server/upload_order.py).
UPLOAD_ORDER_HEADER = "Instantml-Upload"


def is_final(status: int) -> bool:
    return status < 500 and status not in RETRY_STATUSES
