"""The OpenAPI schema's request bodies, generated from the types that describe them
(msgspec Structs: the write path's in ``write/wire.py``, the admin routes' beside them)
rather than kept by hand; and links from a created run to every operation on it."""

from __future__ import annotations

from typing import Any

import msgspec

_REF = "#/components/schemas/{name}"
_TYPES: set[type] = set()  # every body type a route documents


def request_body(body: type) -> dict[str, Any]:
    """A route's ``openapi_extra``: its JSON body is a ``body`` (a msgspec Struct)."""
    _TYPES.add(body)
    (schema,), _ = msgspec.json.schema_components([body], ref_template=_REF)
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": schema}},
        }
    }


def complete(spec: dict[str, Any]) -> dict[str, Any]:
    """The app's generated schema with the body types' components and the run links."""
    _, components = msgspec.json.schema_components(
        sorted(_TYPES, key=lambda t: t.__name__), ref_template=_REF
    )
    spec.setdefault("components", {}).setdefault("schemas", {}).update(components)
    return add_run_links(spec)


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
