"""Idempotency-Key handling: keys reduced to 128 bits, requests to a 64-bit fingerprint.

The stored answer is kept by the ledger in the same unit of work as the write; this module
only names keys and requests. (Keys whose first request is still being applied are the
ledger's claims: a repeat then answers 409.)
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from functools import lru_cache
from itertools import chain
from typing import Any

import msgspec
import numpy as np
import orjson
import xxhash

from ...protocol import IN_FLIGHT
from ...storage.records import SEQUENCE_LIMIT
from ..errors import ApiError
from .commands import Idempotency
from .table import rank_run
from .wire import MAX_EVENT_ID, RankBody, RankFields

MAX_KEY_LENGTH = MAX_EVENT_ID


_TWO_INT64 = struct.Struct(">qq").unpack
_INT64 = struct.Struct(">q").unpack

# XXH3 rather than a cryptographic hash: it runs on every event, and several times faster
# than blake2b. Keys are scoped by org, so a client that crafted a collision would only
# collide with its own keys.


def key_hash(key: str) -> tuple[int, int]:
    """A key reduced to 128 bits, as two signed 64-bit halves."""
    hi, lo = _TWO_INT64(xxhash.xxh3_128_digest(key.encode()))
    return hi, lo


# Keys of the form ``<prefix>-<n>``: n in canonical decimal (no sign, no leading zero) below
# SEQUENCE_LIMIT, so that the key and (prefix, n) determine each other.
_SEQUENCE_DIGITS = len(str(SEQUENCE_LIMIT))


def key_sequence(key: str) -> tuple[int, int]:
    """(the prefix's 64-bit hash, n) of a key ``<prefix>-<n>``, as the SDK and the spool
    name events (one prefix per writer, n counting from 1); (0, -1) for any other key."""
    prefix, _, digits = key.rpartition("-")
    if (
        not prefix
        or not digits.isascii()
        or not digits.isdigit()
        or len(digits) > _SEQUENCE_DIGITS
        or (digits[0] == "0" and digits != "0")
    ):
        return 0, -1
    n = int(digits)
    if n >= SEQUENCE_LIMIT:
        return 0, -1
    return _prefix_hash(prefix), n


@lru_cache(maxsize=8192)
def _prefix_hash(prefix: str) -> int:
    (value,) = _INT64(xxhash.xxh3_64_digest(prefix.encode()))
    return value


def key_sequences(keys: Iterable[str]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`key_sequence` of each key, as two int64 columns."""
    both = np.fromiter(chain.from_iterable(map(key_sequence, keys)), dtype=np.int64)
    return both[0::2].copy(), both[1::2].copy()


def fingerprint(method: str, path: str, body: Any) -> int:
    """64 bits of the request a key came with, insensitive to how its JSON was written.

    A rank-metrics body that decodes as a :class:`RankBody` is fingerprinted by its typed
    form (so the batch route, which decodes it that way, gets the same answer without
    building a dict); any other body by its JSON with keys sorted."""
    if method.upper() == "POST" and rank_run(path) is not None:
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


_ENCODER = msgspec.json.Encoder(order="sorted")


_NO_NODE = b'"node":null,'


def canonical(body: RankFields) -> bytes:
    """The body as JSON with every field present and keys sorted: equal for equal bodies,
    however they were written. ``node`` only when given: a body without one is encoded as
    before the field existed (a metric's value is a number, so only the field matches)."""
    encoded = _ENCODER.encode(body)
    return encoded.replace(_NO_NODE, b"", 1) if body.node is None else encoded


def canonicals(bodies: list[RankFields]) -> list[bytes]:
    """:func:`canonical` of each body, encoded in one call (JSON lines). ``"node":null,``
    can appear only where a body has no node: a metric's value is a finite number, and a
    quote inside a string is escaped."""
    lines = _ENCODER.encode_lines(bodies).replace(_NO_NODE, b"").split(b"\n")
    lines.pop()  # after the last line's newline
    return lines


def typed_fingerprint(path: str, body: RankFields) -> int:
    (value,) = _INT64(xxhash.xxh3_64_digest(fingerprint_prefix(path) + canonical(body)))
    return value


@lru_cache(maxsize=4096)
def fingerprint_prefix(path: str) -> bytes:
    """What a typed fingerprint hashes before the body's canonical JSON."""
    return b"POST\0" + path.encode() + b"\0"


def make(org_id: int, key: str, method: str, path: str, body: Any) -> Idempotency:
    if not 1 <= len(key) <= MAX_KEY_LENGTH:
        raise ApiError(400, f"Idempotency-Key must be 1-{MAX_KEY_LENGTH} characters")
    return Idempotency(*key_hash(key), fingerprint(method, path, body), *key_sequence(key))


IN_FLIGHT_ERROR = "Idempotency-Key: a request with this key is still being processed; retry later"
IN_FLIGHT_BODY = {"error": IN_FLIGHT_ERROR, "code": IN_FLIGHT}
