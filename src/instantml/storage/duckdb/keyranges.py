"""Stored Idempotency-Keys of the form ``<prefix>-<n>`` as ranges of n per prefix.

The SDK, the spool and the async sender name events ``<writer's random prefix>-<n>``, n
counting from 1 (``idempotency.key_sequence``), and a writer's events are stored nearly in
order: a partition's keys from 512 writers are a few hundred ranges. Kept that way they
cost nothing per key (a Bloom filter costs 3 bytes a key, and a server remembering a
week of keys at a high rate grows by it), and a key is known absent exactly (a filter
answers "maybe" for about one key in 50,000 per partition).

A prefix is known by its 64-bit hash mixed with the org (:func:`idents`): two prefixes
that collide share their ranges, which makes a key look possibly stored (the ledger then
looks for it and finds nothing), never absent when it is stored.
"""

from __future__ import annotations

import numpy as np

from ..records import SEQUENCE_LIMIT

# A range is kept as two int64 values, (its prefix's block << SHIFT) | first and | last n,
# so that one sorted array holds every prefix's ranges; n < SEQUENCE_LIMIT = 2**40 leaves a
# gap of 2**40 between blocks (no range can reach into the next block), and 2**22 blocks.
SHIFT = 41
MAX_PREFIXES = 1 << 22
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def idents(org: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """One int64 per (org, prefix hash)."""
    return (seq.astype(np.uint64) ^ (org.astype(np.uint64) * _GOLDEN)).view(np.int64)


class KeyRanges:
    """An immutable set of (ident, n): sorted idents, and their ranges of n as one sorted
    array of encoded starts and one of ends (the module docstring)."""

    __slots__ = ("_ends", "_ids", "_starts")

    def __init__(
        self,
        ids: np.ndarray | None = None,
        starts: np.ndarray | None = None,
        ends: np.ndarray | None = None,
    ) -> None:
        empty = np.zeros(0, dtype=np.int64)
        self._ids = empty if ids is None else ids
        self._starts = empty if starts is None else starts
        self._ends = empty if ends is None else ends

    @classmethod
    def of(cls, ident: np.ndarray, n: np.ndarray) -> KeyRanges:
        """The set of these keys (each n in 0 <= n < SEQUENCE_LIMIT)."""
        return cls._merged(ident, n, n)

    def __len__(self) -> int:
        """How many ranges."""
        return len(self._starts)

    def prefixes(self) -> int:
        return len(self._ids)

    def union(self, *others: KeyRanges) -> KeyRanges:
        parts = [r for r in (self, *others) if len(r)]
        if len(parts) <= 1:
            return parts[0] if parts else KeyRanges()
        columns = [r._columns() for r in parts]
        return self._merged(*(np.concatenate(c) for c in zip(*columns, strict=True)))

    def contains(self, ident: np.ndarray, n: np.ndarray) -> np.ndarray:
        """Per key: whether it is in the set."""
        found = np.zeros(len(ident), dtype=bool)
        if not len(self._ids) or not len(ident):
            return found
        block = np.minimum(np.searchsorted(self._ids, ident), len(self._ids) - 1)
        known = (self._ids[block] == ident) & (n >= 0) & (n < SEQUENCE_LIMIT)
        wanted = (block.astype(np.int64) << SHIFT) | np.where(known, n, 0)
        at = np.searchsorted(self._starts, wanted, side="right") - 1
        return known & (at >= 0) & (wanted <= self._ends[np.maximum(at, 0)])

    def _columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ident, first n, last n) per range."""
        mask = np.int64((1 << SHIFT) - 1)
        return self._ids[self._starts >> SHIFT], self._starts & mask, self._ends & mask

    @classmethod
    def _merged(cls, ident: np.ndarray, first: np.ndarray, last: np.ndarray) -> KeyRanges:
        """Ranges (ident, first..last), possibly overlapping or touching, merged."""
        if not len(ident):
            return cls()
        ids, block = np.unique(ident, return_inverse=True)
        if len(ids) > MAX_PREFIXES:
            raise OverflowError(f"more than {MAX_PREFIXES} prefixes in one set of key ranges")
        base = block.astype(np.int64).reshape(-1) << SHIFT
        starts, ends = base | first, base | last
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], ends[order]
        reach = np.maximum.accumulate(ends)
        begins = np.flatnonzero(np.r_[True, starts[1:] > reach[:-1] + 1])
        return cls(ids, starts[begins], reach[np.r_[begins[1:] - 1, len(starts) - 1]])
