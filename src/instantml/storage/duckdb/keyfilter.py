"""A Bloom filter over Idempotency-Key hashes, one per partition of stored keys
(ledger.py), so that a write with a new key (nearly all of them) needs no lookup, and a key
the filters may hold is looked up only in the partitions whose filter says so."""

from __future__ import annotations

import numpy as np

# 24 bits and 10 hashes a key: about 2e-5 false positives per partition, so a batch of
# 10,000 new keys is looked up in one partition of five; 3 bytes of memory per stored key.
BITS_PER_KEY = 24
HASHES = 10
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def hashes(org: np.ndarray, hi: np.ndarray, lo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The two hashes a key's bit positions are made of (the same in every filter)."""
    return hi.astype(np.uint64) ^ (org.astype(np.uint64) * _GOLDEN), lo.astype(np.uint64) | 1


class KeyFilter:
    def __init__(self, capacity: int) -> None:
        self._size = np.uint64(-(-max(1, capacity) * BITS_PER_KEY // 64) * 64)
        self._bits = np.zeros(int(self._size) // 8, dtype=np.uint8)

    def _set(self, pos: np.ndarray) -> np.ndarray:
        return (self._bits[pos >> np.uint64(3)] >> (pos & np.uint64(7)).astype(np.uint8)) & 1

    def might_contain(self, h1: np.ndarray, h2: np.ndarray) -> np.ndarray:
        """Per key (its :func:`hashes`): whether it may be in the filter. A key leaves at
        its first unset bit: a third of new keys pass a bit, so the check costs about
        1.5 positions a key rather than ten."""
        alive = np.arange(len(h1))
        for i in range(HASHES):
            pos = (h1[alive] + np.uint64(i) * h2[alive]) % self._size  # wraps modulo 2**64
            alive = alive[self._set(pos).astype(bool)]
            if not len(alive):
                break
        found = np.zeros(len(h1), dtype=bool)
        found[alive] = True
        return found

    def add(self, h1: np.ndarray, h2: np.ndarray) -> None:
        steps = np.arange(HASHES, dtype=np.uint64)[:, None]
        pos = ((h1[None, :] + steps * h2[None, :]) % self._size).ravel()
        np.bitwise_or.at(
            self._bits, pos >> np.uint64(3), (1 << (pos & np.uint64(7))).astype(np.uint8)
        )
