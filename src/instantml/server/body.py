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
    limit: int = request.app.state.settings.max_body_bytes  # set before startup
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"request body larger than the {limit}-byte limit")
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > limit:
            raise ApiError(413, f"request body larger than the {limit}-byte limit")
    return bytes(raw)


class Token:
    """A bare ``NaN``/``Infinity``/``-Infinity`` token, which JSON does not have: kept as
    this marker by the fallback parser so that the refusal can name its field."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def parse_value(raw: bytes) -> Any:
    """The JSON value of ``raw``; a bare NaN/Infinity token becomes a :class:`Token`
    (refuse it with :func:`refuse_tokens`)."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _standard(raw)


def _standard(raw: bytes) -> Any:
    """What orjson refused, read by the standard parser: it reads the NaN and Infinity
    tokens (and integers beyond 64 bits) so that the error can name the field."""
    try:
        return json.loads(raw, parse_constant=Token)
    except (ValueError, RecursionError) as exc:
        raise ApiError(400, f"body: malformed JSON ({exc})") from None


def _token_path(value: Any, path: str) -> tuple[str, str] | None:
    if type(value) is Token:
        return path, value.text
    if isinstance(value, dict):
        for key, item in value.items():
            found = _token_path(item, f"{path}[{key!r}]" if path else str(key))
            if found:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = _token_path(item, f"{path}[{i}]")
            if found:
                return found
    return None


def refuse_tokens(value: Any, path: str = "") -> None:
    """400 naming the field, when ``value`` holds a NaN/Infinity token (non-finite values
    travel as marks in a body's ``nonfinite`` map)."""
    found = _token_path(value, path)
    if found is not None:
        where, text = found
        raise ApiError(
            400,
            f"{where or 'body'}: {text} is not valid JSON; send non-finite values in the"
            ' body\'s \'nonfinite\' map ({"key": "nan" | "inf" | "-inf"})',
        )


def parse_object(raw: bytes, tokens: bool = False) -> dict[str, Any]:
    """A JSON object; NaN/Infinity tokens refused (400) unless ``tokens`` (a batch, whose
    events are each answered on their own)."""
    try:
        body, checked = orjson.loads(raw), True  # orjson leaves no token to look for
    except orjson.JSONDecodeError:
        body, checked = _standard(raw), False
    if not isinstance(body, dict):
        raise ApiError(400, "body: must be a JSON object")
    if not tokens and not checked:
        refuse_tokens(body)
    return body
