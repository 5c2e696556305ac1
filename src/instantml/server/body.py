"""Reading a JSON request body: size-capped, orjson first, named errors."""

from __future__ import annotations

import json
from typing import Any

import orjson
from fastapi import Request

from .errors import ApiError


async def read_json_object(request: Request) -> dict[str, Any]:
    return parse_object(await read_body(request))


async def read_body(request: Request) -> bytes:
    """The raw body, refused with 413 past the size limit."""
    limit: int = request.app.state.settings.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"request body larger than the {limit}-byte limit")
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > limit:
            raise ApiError(413, f"request body larger than the {limit}-byte limit")
    return bytes(raw)


def parse_value(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        # orjson refuses the NaN and Infinity tokens outright (and integers beyond 64 bits);
        # the standard parser reads them so that the error can name the field.
        try:
            return json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise ApiError(400, f"body: malformed JSON ({exc})") from None


def parse_object(raw: bytes) -> dict[str, Any]:
    body = parse_value(raw)
    if not isinstance(body, dict):
        raise ApiError(400, "body: must be a JSON object")
    return body
