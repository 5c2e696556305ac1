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

from ... import validation
from ...thresholds import check
from ..errors import ApiError, bad_input
from .commands import (
    CreateRun,
    PatchRun,
    WriteAttributes,
    WriteRankPoints,
    WriteScalars,
)

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
        rank = body.get("rank")
        if rank is not None:
            rank = validation.rank_context(rank, validation.MAX_WORLD_SIZE, None)[0]
    except (TypeError, ValueError) as exc:
        raise bad_input(exc) from None
    return PatchRun(org_id=org_id, run_id=run_id, status=status, rank=rank)


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
        node = validation.node(body.get("node"))
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
        node=node,
    )


HEALTH_TYPE, HEALTH_PREFIX = "health", "health/"  # health/monitor.py reads them


def attributes(org_id: int, run_id: str, body: dict[str, Any]) -> WriteAttributes:
    # The public SDK sends {"attributes": [...]} for config/tags/notes, or one bare attribute.
    items = body.get("attributes", [body] if "path" in body else None)
    if not isinstance(items, list) or not items or not all(isinstance(a, dict) for a in items):
        raise ApiError(422, "attributes must be a non-empty list of objects")
    for index, item in enumerate(items):
        for name in ("path", "type"):
            if isinstance(item.get(name), str):
                _plain(item[name], f"attributes[].{name}")
        if item.get("type") == HEALTH_TYPE:  # a run's health thresholds: checked here
            path = item.get("path")
            if not isinstance(path, str) or not path.startswith(HEALTH_PREFIX):
                raise ApiError(422, f"attributes[{index}].path must be '{HEALTH_PREFIX}<name>'")
            try:
                check(path[len(HEALTH_PREFIX) :], item.get("value"), f"attributes[{index}].health")
            except ValueError as exc:
                raise ApiError(422, str(exc)) from None
    storable(items, "attributes")
    return WriteAttributes(org_id=org_id, run_id=run_id, attributes=items, timestamp=time.time())


CONSOLE = "console"  # the attribute type console lines are kept as
MAX_LOG_LINES = 10_000  # per request
MAX_LOG_LINE_BYTES = 65_536


def logs(org_id: int, run_id: str, body: dict[str, Any]) -> WriteAttributes:
    """Console lines (the public SDK's ``capture_console`` / ``log_console``): ``{"stream":
    "stdout" | "stderr", "lines": [{"line_number", "message", "timestamp"}]}``, kept as
    attributes of type ``console`` (path ``console/<stream>``, step = line number)."""
    stream = body.get("stream")
    if stream not in ("stdout", "stderr"):
        raise ApiError(422, f"stream must be 'stdout' or 'stderr', got {stream!r}")
    lines = body.get("lines")
    if not isinstance(lines, list) or not lines or not all(isinstance(x, dict) for x in lines):
        raise ApiError(422, "lines must be a non-empty list of objects")
    if len(lines) > MAX_LOG_LINES:
        raise ApiError(422, f"lines: at most {MAX_LOG_LINES} per request, got {len(lines)}")
    kept = []
    for i, line in enumerate(lines):
        number, text, stamp = line.get("line_number"), line.get("message"), line.get("timestamp")
        if type(number) is not int or number < 0 or number > validation.MAX_STEP:
            raise ApiError(422, f"lines[{i}].line_number must be an integer >= 0, got {number!r}")
        if (
            not isinstance(text, str)
            or len(text.encode("utf-8", "surrogatepass")) > MAX_LOG_LINE_BYTES
        ):
            raise ApiError(
                422, f"lines[{i}].message must be a string of at most {MAX_LOG_LINE_BYTES} bytes"
            )
        if stamp is not None and not isinstance(stamp, str):
            raise ApiError(422, f"lines[{i}].timestamp must be a string or null")
        kept.append(
            {"path": f"console/{stream}", "type": CONSOLE, "step": number,
             "value": {"message": text, "timestamp": stamp}}
        )  # fmt: skip
    storable(kept, "lines")
    return WriteAttributes(org_id=org_id, run_id=run_id, attributes=kept, timestamp=time.time())
