"""The writes the wire carries, as types: each write route's body and the ``/api/ingest``
event that wraps one. The OpenAPI schema of every write route is generated from these
(``server/schemas.py``), and msgspec decodes rank events with them straight into typed
records (``rank_batch.py``): types and ranges checked in C as the JSON is parsed.

What a type here admits, the write path accepts (``tests/server/test_schema_fuzz.py``
sends schema-valid bodies to every write route). A body that does not decode goes to
``validate.py``, whose rules are the same and whose messages name the field that is wrong;
it also takes a few lenient forms the types leave out (an integral float as a rank step,
a metric name of up to 512 UTF-8 bytes)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from ...validation import MAX_NODE, MAX_STEP, MAX_WORLD_SIZE

MAX_EVENT_ID = 255  # an event id is its Idempotency-Key

# 128 code points are at most 512 UTF-8 bytes, the contract's limit; a longer name is
# checked (in bytes) by validate.py.
MetricName = Annotated[str, Meta(min_length=1, max_length=128, pattern="^[^\x00]+$")]
Metrics = Annotated[
    dict[MetricName, float],
    Meta(min_length=1, description="metric name (1-512 UTF-8 bytes) -> finite number"),
]
Text = Annotated[str, Meta(max_length=256, pattern="^[^\x00]*$")]
RunId = Annotated[str, Meta(pattern="^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]
Step = Annotated[int, Meta(ge=0, le=MAX_STEP)]
Rank = Annotated[int, Meta(ge=0, lt=MAX_WORLD_SIZE)]
Timestamp = Annotated[
    float | datetime,
    Meta(
        description="seconds since the epoch, or an ISO 8601 string; the server's clock if absent"
    ),
]
NonFinite = Annotated[
    dict[MetricName, Literal["nan", "inf", "-inf"]],
    Meta(description="metric name -> a value JSON cannot carry; beside metrics, never in both"),
]


class RunBody(msgspec.Struct):
    """``POST /runs``: create a run, or attach to it when its id exists in the project."""

    project: Text | None = None
    name: Text | None = None
    id: RunId | None = None
    config: dict[str, Any] | None = None
    tags: list[Text] | None = None
    metadata: dict[str, Any] | None = None


class PatchBody(msgspec.Struct):
    """``PATCH /runs/{run_id}``: a run's status (``rank``: the rank that finishes)."""

    status: Literal["running", "finished", "failed", "crashed"]
    rank: Rank | None = None


class ScalarBody(msgspec.Struct):
    """``POST /runs/{run_id}/metrics``: scalars at a step (any finite number >= 0)."""

    step: Annotated[float, Meta(ge=0)]
    metrics: Metrics | None = None
    nonfinite: NonFinite | None = None
    timestamp: Timestamp | None = None
    preview: bool | None = None


# gc=False: these hold no cycles, and a batch makes tens of thousands of them; the cyclic
# collector need not track (or walk) any.
class RankFields(msgspec.Struct, gc=False):
    """A rank-metrics body as ``/api/ingest`` decodes it: :class:`RankBody` less the NUL
    rule on metric names and ``node``, which the batch path checks once per distinct name
    (``rank_batch.py``): a pattern matched on every name of every event was the largest
    part of decoding a batch. Same fields, so the same canonical form."""

    metrics: Annotated[
        dict[Annotated[str, Meta(min_length=1, max_length=128)], float], Meta(min_length=1)
    ]
    step: Step
    rank: Rank
    world_size: Annotated[int, Meta(ge=1, le=MAX_WORLD_SIZE)]
    local_rank: Rank | None = None
    weight: Annotated[float, Meta(gt=0.0)] | None = None
    timestamp: Annotated[float, Meta(gt=-1e11, lt=1e11)] | None = None
    # The host the rank runs on (our SDK sends it; the public SDK never does). Left out of
    # the fingerprint when absent (``idempotency.canonical``), so keys from before it
    # existed replay as they did.
    node: Annotated[str, Meta(max_length=MAX_NODE)] | None = None
    # Declared so that it is never silently dropped (msgspec ignores unknown fields) and
    # enters the fingerprint (typed as it always was, so a key's fingerprint never
    # changes); an event that has it is taken by validate.py, which checks the marks.
    nonfinite: dict[str, str] | None = None


class RankBody(RankFields, gc=False):
    """``POST /runs/{run_id}/rank-metrics``: one rank's metrics at a global step."""

    metrics: Metrics
    node: Annotated[str, Meta(max_length=MAX_NODE, pattern="^[^\x00]*$")] | None = None


class AttributesBody(msgspec.Struct):
    """``POST /api/runs/{run_id}/attributes``: free-form run attributes (``health/<name>``
    of type ``health``: the run's own health thresholds)."""

    attributes: Annotated[list[dict[str, Any]], Meta(min_length=1)]


class LogLine(msgspec.Struct):
    line_number: Step
    message: Annotated[str, Meta(description="at most 65,536 UTF-8 bytes")]
    timestamp: str | None = None


class LogsBody(msgspec.Struct):
    """``POST /api/runs/{run_id}/logs``: console lines (the public SDK's capture)."""

    stream: Literal["stdout", "stderr"]
    lines: Annotated[list[LogLine], Meta(min_length=1, max_length=10_000)]


class EventRequest(msgspec.Struct):
    method: str
    path: Annotated[str, Meta(description="a write route's path, e.g. /runs/{id}/rank-metrics")]
    body: dict[str, Any]


class Event(msgspec.Struct):
    """One write in a batch, answered as if sent alone with ``event_id`` as its
    Idempotency-Key."""

    event_id: Annotated[str, Meta(min_length=1, max_length=MAX_EVENT_ID)]
    request: EventRequest


class IngestBody(msgspec.Struct):
    """``POST /api/ingest``: a batch of events, each answered on its own."""

    events: list[Event]


class RankRequest(msgspec.Struct, gc=False):
    method: str
    path: str
    body: RankFields


class RankEvent(msgspec.Struct, gc=False):
    """An ``/api/ingest`` event whose body decodes as :class:`RankFields`."""

    event_id: Annotated[str, Meta(min_length=1, max_length=MAX_EVENT_ID)]
    request: RankRequest
