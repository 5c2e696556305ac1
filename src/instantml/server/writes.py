"""Turning a write request (a route's body, or one event of a batch) into a validated write.

The single routes and ``POST /api/ingest`` both come through here, so an event in a batch
is treated exactly as the same request sent alone.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime
from typing import Any

import orjson

from .. import validation
from .commands import (
    CreateRun,
    PatchRun,
    Write,
    WriteAttributes,
    WriteRankPoints,
    WriteScalars,
)
from .errors import ApiError, bad_input

_MAX_TEXT = 256


def _text(body: dict[str, Any], field: str, default: str | None = None) -> str | None:
    value = body.get(field)
    if value is None:
        return default
    if type(value) is not str:
        raise ApiError(422, f"{field} must be a string")
    if len(value) > _MAX_TEXT:
        raise ApiError(422, f"{field} must be at most {_MAX_TEXT} characters")
    return _plain(value, field)


def _plain(value: str, field: str) -> str:
    try:
        return validation.text(value, field)
    except ValueError as exc:
        raise bad_input(exc) from None


def storable(value: Any, field: str) -> Any:
    """Free-form JSON is kept as given, provided it can be stored (integers fit in 64 bits)."""
    try:
        orjson.dumps(value)
    except orjson.JSONEncodeError:
        raise ApiError(
            422, f"{field}: holds a value that cannot be stored (NaN, or an integer beyond 64 bits)"
        ) from None
    return value


def _object(body: dict[str, Any], field: str) -> dict[str, Any]:
    value = body.get(field)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ApiError(422, f"{field} must be an object")
    return storable(value, field)


def timestamp(value: Any) -> float:
    """Seconds since the epoch from a number or an ISO 8601 string; the server's clock if absent."""
    if value is None:
        return time.time()
    if type(value) in (int, float):
        number = float(value)
        if number == number and abs(number) < 1e11:
            return number
        raise ApiError(422, "timestamp must be seconds since the epoch or an ISO 8601 string")
    if type(value) is str:
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            pass
    raise ApiError(422, "timestamp must be seconds since the epoch or an ISO 8601 string")


def _required(body: dict[str, Any], field: str) -> Any:
    if field not in body:
        raise ApiError(422, f"{field} is required")
    return body[field]


def create_run(org_id: int, body: dict[str, Any]) -> CreateRun:
    try:
        run_id = validation.run_id(body["id"]) if body.get("id") is not None else uuid.uuid4().hex
    except (TypeError, ValueError) as exc:
        raise bad_input(exc) from None
    tags = body.get("tags")
    if tags is None:
        tags = []
    if not isinstance(tags, list) or not all(type(t) is str for t in tags):
        raise ApiError(422, "tags must be a list of strings")
    for tag in tags:
        _plain(tag, "tags")
    return CreateRun(
        org_id=org_id,
        run_id=run_id,
        project=_text(body, "project", "default") or "default",
        name=_text(body, "name"),
        config=_object(body, "config"),
        tags=tags,
        metadata=_object(body, "metadata"),
    )


def patch_run(org_id: int, run_id: str, body: dict[str, Any]) -> PatchRun:
    try:
        status = validation.run_status(_required(body, "status"))
    except (TypeError, ValueError) as exc:
        raise bad_input(exc) from None
    return PatchRun(org_id=org_id, run_id=run_id, status=status)


def _values(body: dict[str, Any]) -> dict[str, float]:
    """``metrics`` (finite numbers) with the ``nonfinite`` marks beside them merged in as
    NaN/+-inf: one value per key, at least one in all. Raises TypeError/ValueError."""
    marks = body.get("nonfinite")
    if marks is None:
        values, _ = validation.metric_values(_required(body, "metrics"))
        return values
    marks = validation.nonfinite_marks(marks)
    metrics = body.get("metrics")
    values = {} if metrics is None else validation.metric_values(metrics, allow_empty=True)[0]
    both = values.keys() & marks.keys()
    if both:
        raise ValueError(f"nonfinite: {sorted(both)[0]!r} is also in metrics; send one value")
    values.update({key: validation.NONFINITE_MARKS[mark] for key, mark in marks.items()})
    return values


def scalars(org_id: int, run_id: str, body: dict[str, Any]) -> WriteScalars:
    try:
        metrics = _values(body)
        step = validation.scalar_step(_required(body, "step"))
    except (TypeError, ValueError) as exc:
        raise bad_input(exc) from None
    return WriteScalars(
        org_id=org_id,
        run_id=run_id,
        step=step,
        metrics=metrics,
        timestamp=timestamp(body.get("timestamp")),
        preview=body.get("preview") is True,
    )


def rank_points(org_id: int, run_id: str, body: dict[str, Any]) -> WriteRankPoints:
    try:
        metrics = _values(body)
        step = validation.step(_required(body, "step"))
        rank, world_size, local_rank = validation.rank_context(
            _required(body, "rank"), _required(body, "world_size"), body.get("local_rank")
        )
        weight = validation.weight(body.get("weight"))
    except (TypeError, ValueError) as exc:
        raise bad_input(exc) from None
    return WriteRankPoints(
        org_id=org_id,
        run_id=run_id,
        step=step,
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        weight=weight,
        metrics=metrics,
        timestamp=timestamp(body.get("timestamp")),
    )


def attributes(org_id: int, run_id: str, body: dict[str, Any]) -> WriteAttributes:
    # The public SDK sends {"attributes": [...]} for config/tags/notes, or one bare attribute.
    items = body.get("attributes", [body] if "path" in body else None)
    if not isinstance(items, list) or not items or not all(isinstance(a, dict) for a in items):
        raise ApiError(422, "attributes must be a non-empty list of objects")
    for item in items:
        for name in ("path", "type"):
            if isinstance(item.get(name), str):
                _plain(item[name], f"attributes[].{name}")
    storable(items, "attributes")
    return WriteAttributes(org_id=org_id, run_id=run_id, attributes=items, timestamp=time.time())


def from_request(org_id: int, method: str, path: str, body: dict[str, Any]) -> Write:
    """The write a (method, path, body) triple stands for, as if sent to its own route."""
    parts = path.split("?", 1)[0].strip("/").split("/")
    if (
        parts[:1] == ["api"]
        and parts[1:2] == ["runs"]
        and len(parts) == 4
        and parts[3] == "attributes"
    ):
        route = ("attributes", parts[2])
    elif parts[:1] == ["runs"] and len(parts) == 1:
        route = ("create", "")
    elif parts[:1] == ["runs"] and len(parts) == 2:
        route = ("patch", parts[1])
    elif parts[:1] == ["runs"] and len(parts) == 3 and parts[2] in ("metrics", "rank-metrics"):
        route = (parts[2], parts[1])
    else:
        raise ApiError(404, f"request.path: no write route at {path!r}")
    kind, run_id = route
    expected = "PATCH" if kind == "patch" else "POST"
    if method.upper() != expected:
        raise ApiError(405, f"request.method: {path!r} takes {expected}, not {method!r}")
    if kind == "create":
        return create_run(org_id, body)
    if kind == "patch":
        return patch_run(org_id, run_id, body)
    if kind == "metrics":
        return scalars(org_id, run_id, body)
    if kind == "rank-metrics":
        return rank_points(org_id, run_id, body)
    return attributes(org_id, run_id, body)
