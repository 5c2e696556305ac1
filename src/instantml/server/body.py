"""Reading a JSON request body: size-capped, orjson first, named errors."""

from __future__ import annotations

import json
from typing import Any

import orjson
from fastapi import Request

from .errors import ApiError


async def read_json_object(request: Request) -> dict[str, Any]:
    limit: int = request.app.state.settings.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"request body larger than the {limit}-byte limit")
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > limit:
            raise ApiError(413, f"request body larger than the {limit}-byte limit")
    return parse_object(bytes(raw))


def parse_object(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        # orjson refuses the NaN and Infinity tokens outright; the standard parser reads them
        # so that the error can name the field that carried one.
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise ApiError(400, f"body: malformed JSON ({exc})") from None
    if not isinstance(body, dict):
        raise ApiError(400, "body: must be a JSON object")
    return body
