"""OpenAPI request-body schemas. Bodies are parsed by hand (orjson + the shared validation
rules, for speed and for messages that name the field); these document what is accepted."""

from __future__ import annotations

from typing import Any

_METRICS = {
    "type": "object",
    "minProperties": 1,
    "additionalProperties": {"type": "number"},
    "description": "metric name (1-512 UTF-8 bytes) -> finite number",
}
_STEP = {"type": "integer", "minimum": 0}
_TIMESTAMP = {"oneOf": [{"type": "number"}, {"type": "string", "format": "date-time"}]}


def body(schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": schema}},
        }
    }


CREATE_RUN = body(
    {
        "type": "object",
        "properties": {
            "project": {"type": "string", "maxLength": 256},
            "name": {"type": ["string", "null"], "maxLength": 256},
            "id": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"},
            "config": {"type": "object"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "metadata": {"type": "object"},
        },
    }
)
PATCH_RUN = body(
    {
        "type": "object",
        "required": ["status"],
        "properties": {
            "status": {"enum": ["running", "finished", "failed", "crashed"]},
            "rank": {"type": "integer", "minimum": 0, "description": "the rank that finishes"},
        },
    }
)
SCALARS = body(
    {
        "type": "object",
        "required": ["metrics", "step"],
        "properties": {
            "metrics": _METRICS,
            "step": _STEP,
            "timestamp": _TIMESTAMP,
            "preview": {"type": "boolean"},
        },
    }
)
RANK_POINTS = body(
    {
        "type": "object",
        "required": ["metrics", "step", "rank", "world_size"],
        "properties": {
            "metrics": _METRICS,
            "step": _STEP,
            "rank": {"type": "integer", "minimum": 0, "maximum": 511},
            "world_size": {"type": "integer", "minimum": 1, "maximum": 512},
            "local_rank": {"type": ["integer", "null"], "minimum": 0, "maximum": 511},
            "weight": {"type": "number", "exclusiveMinimum": 0},
            "timestamp": _TIMESTAMP,
        },
    }
)
ATTRIBUTES = body(
    {
        "type": "object",
        "properties": {"attributes": {"type": "array", "minItems": 1, "items": {"type": "object"}}},
    }
)
INGEST = body(
    {
        "type": "object",
        "required": ["events"],
        "properties": {
            "events": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["event_id", "request"],
                    "properties": {
                        "event_id": {"type": "string", "minLength": 1, "maxLength": 255},
                        "request": {
                            "type": "object",
                            "required": ["method", "path", "body"],
                            "properties": {
                                "method": {"type": "string"},
                                "path": {"type": "string"},
                                "body": {"type": "object"},
                            },
                        },
                    },
                },
            }
        },
    }
)
CREATE_KEY = body(
    {
        "type": "object",
        "properties": {
            "org": {"type": "string", "minLength": 1, "maxLength": 256},
            "scopes": {
                "type": "array",
                "minItems": 1,
                "items": {"enum": ["admin", "ingest", "read"]},
            },
        },
    }
)
SET_LIMIT = body(
    {
        "type": "object",
        "required": ["limit"],
        "properties": {
            "org": {"type": "string"},
            "limit": {"type": ["integer", "null"], "minimum": 0},
        },
    }
)


def add_run_links(spec: dict[str, Any]) -> dict[str, Any]:
    """OpenAPI links from a created run to every operation on ``{run_id}``, with what
    ``POST /runs`` answers: so a client (and schemathesis's stateful phase) can follow a
    run from its creation."""
    links = {}
    for path, operations in spec.get("paths", {}).items():
        if "{run_id}" not in path:
            continue
        for operation in operations.values():
            if "operationId" in operation:
                links[operation["operationId"]] = {
                    "operationId": operation["operationId"],
                    "parameters": {"run_id": "$response.body#/run/id"},
                }
    created = spec.get("paths", {}).get("/runs", {}).get("post")
    if created is not None and links:
        run = {"type": "object", "properties": {"run": {"type": "object"}}}
        for status, why in (("201", "Created"), ("200", "Attached to the run with this id")):
            created.setdefault("responses", {})[status] = {
                "description": why,
                "content": {"application/json": {"schema": run}},
                "links": links,
            }
    return spec
