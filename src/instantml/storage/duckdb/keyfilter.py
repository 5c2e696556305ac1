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


class KeyFilter:
    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self._bits_count = np.uint64(-(-self.capacity * BITS_PER_KEY // 64) * 64)
        self._bits = np.zeros(int(self._bits_count) // 8, dtype=np.uint8)

    def _positions(self, org: np.ndarray, hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
        h1 = hi.astype(np.uint64) ^ (org.astype(np.uint64) * _GOLDEN)
        h2 = lo.astype(np.uint64) | np.uint64(1)
        steps = np.arange(HASHES, dtype=np.uint64)[:, None]
        return (h1[None, :] + steps * h2[None, :]) % self._bits_count  # wraps modulo 2**64

    def might_contain(self, org: np.ndarray, hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
        pos = self._positions(org, hi, lo)
        hit = (self._bits[pos >> np.uint64(3)] >> (pos & np.uint64(7)).astype(np.uint8)) & 1
        return np.asarray(hit.all(axis=0))

    def add(self, org: np.ndarray, hi: np.ndarray, lo: np.ndarray) -> None:
        pos = self._positions(org, hi, lo).ravel()
        np.bitwise_or.at(
            self._bits, pos >> np.uint64(3), (1 << (pos & np.uint64(7))).astype(np.uint8)
        )
