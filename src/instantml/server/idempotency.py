"""Idempotency-Key handling: keys reduced to 128 bits, requests to a 64-bit fingerprint.

The stored answer is kept by the ledger in the same unit of work as the write; this module
only names keys and requests. (Keys whose first request is still being applied are the
ledger's claims: a repeat then answers 409.)
"""

from __future__ import annotations

import json
import struct
from functools import lru_cache
from typing import Any

import msgspec
import orjson
import xxhash

from ..protocol import IN_FLIGHT
from .commands import Idempotency
from .errors import ApiError
from .rank_body import RankBody, canonical, rank_route

MAX_KEY_LENGTH = 255


_TWO_INT64 = struct.Struct(">qq").unpack
_INT64 = struct.Struct(">q").unpack

# XXH3 rather than a cryptographic hash: ~0.1 us against ~0.8 us for blake2b, on every
# event. Keys are scoped by org, so a client that crafted a collision would only collide
# with its own keys.


def key_hash(key: str) -> tuple[int, int]:
    """A key reduced to 128 bits, as two signed 64-bit halves."""
    hi, lo = _TWO_INT64(xxhash.xxh3_128_digest(key.encode()))
    return hi, lo


def fingerprint(method: str, path: str, body: Any) -> int:
    """64 bits of the request a key came with, insensitive to how its JSON was written.

    A rank-metrics body that decodes as a :class:`RankBody` is fingerprinted by its typed
    form (so the batch route, which decodes it that way, gets the same answer without
    building a dict); any other body by its JSON with keys sorted."""
    if method.upper() == "POST" and rank_route(path) is not None:
        try:
            return typed_fingerprint(path, msgspec.convert(body, RankBody))
        except msgspec.ValidationError:
            pass
    try:
        request = orjson.dumps([method.upper(), path, body], option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:  # an integer beyond 64 bits somewhere in a free-form field
        request = json.dumps([method.upper(), path, body], sort_keys=True, default=str).encode()
    (value,) = _INT64(xxhash.xxh3_64_digest(request))
    return value


def typed_fingerprint(path: str, body: RankBody) -> int:
    (value,) = _INT64(xxhash.xxh3_64_digest(fingerprint_prefix(path) + canonical(body)))
    return value


@lru_cache(maxsize=4096)
def fingerprint_prefix(path: str) -> bytes:
    """What a typed fingerprint hashes before the body's canonical JSON."""
    return b"POST\0" + path.encode() + b"\0"


def make(org_id: int, key: str, method: str, path: str, body: Any) -> Idempotency:
    if not 1 <= len(key) <= MAX_KEY_LENGTH:
        raise ApiError(400, f"Idempotency-Key must be 1-{MAX_KEY_LENGTH} characters")
    return Idempotency(*key_hash(key), fingerprint(method, path, body))


IN_FLIGHT_ERROR = "Idempotency-Key: a request with this key is still being processed; retry later"
IN_FLIGHT_BODY = {"error": IN_FLIGHT_ERROR, "code": IN_FLIGHT}
