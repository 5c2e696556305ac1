"""The body of ``POST /runs/{id}/rank-metrics`` as a typed record, decoded straight from
JSON by msgspec (types and ranges checked in C, no intermediate dicts).

It takes exactly the bodies that ``writes.rank_points`` takes without converting anything
(floats as floats, ints as ints, no string timestamps); whatever it refuses goes through
``write/validate.py``, which either accepts it too (``"step": 5.0``, say) or names what is wrong.
Two checks span fields and stay in Python: ``rank < world_size`` and
``local_rank < world_size``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated

import msgspec
from msgspec import Meta

from ...validation import MAX_STEP, MAX_WORLD_SIZE

# 128 code points are at most 512 UTF-8 bytes, the contract's limit; a longer name is
# checked (in bytes) by the general path.
MetricName = Annotated[str, Meta(min_length=1, max_length=128, pattern="^[^\x00]+$")]


class RankBody(msgspec.Struct, gc=False):
    metrics: Annotated[dict[MetricName, float], Meta(min_length=1)]
    step: Annotated[int, Meta(ge=0, le=MAX_STEP)]
    rank: Annotated[int, Meta(ge=0, lt=MAX_WORLD_SIZE)]
    world_size: Annotated[int, Meta(ge=1, le=MAX_WORLD_SIZE)]
    local_rank: Annotated[int, Meta(ge=0, lt=MAX_WORLD_SIZE)] | None = None
    weight: Annotated[float, Meta(gt=0.0)] | None = None
    timestamp: Annotated[float, Meta(gt=-1e11, lt=1e11)] | None = None
    # Declared so that it is never silently dropped (msgspec ignores unknown fields) and
    # enters the fingerprint; an event that has it takes the general path (validate.py).
    nonfinite: dict[str, str] | None = None


_ENCODER = msgspec.json.Encoder(order="sorted")


def canonical(body: RankBody) -> bytes:
    """The body as JSON with every field present and keys sorted: equal for equal bodies,
    however they were written."""
    return _ENCODER.encode(body)


@lru_cache(maxsize=4096)
def rank_route(path: str) -> str | None:
    """The run id of a ``/runs/{id}/rank-metrics`` path, else None."""
    parts = path.strip("/").split("/")
    if len(parts) == 3 and parts[0] == "runs" and parts[2] == "rank-metrics" and "?" not in path:
        return parts[1]
    return None
