"""A Bloom filter over Idempotency-Key hashes, so that a write with a new key (nearly all of
them) needs no lookup in a table of millions of keys."""

from __future__ import annotations

import numpy as np

_BITS_PER_KEY = 12
_HASHES = 6  # with 12 bits a key: about 0.4% false positives, which a lookup then clears
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


class KeyFilter:
    def __init__(self, capacity: int = 1 << 20) -> None:
        self.capacity = capacity
        bits = 1 << max(16, (capacity * _BITS_PER_KEY - 1).bit_length())
        self._mask = np.uint64(bits - 1)
        self._bits = np.zeros(bits // 8, dtype=np.uint8)
        self.count = 0

    def _positions(self, org: np.ndarray, hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
        h1 = hi.astype(np.uint64) ^ (org.astype(np.uint64) * _GOLDEN)
        h2 = lo.astype(np.uint64) | np.uint64(1)
        steps = np.arange(_HASHES, dtype=np.uint64)[:, None]
        return (h1[None, :] + steps * h2[None, :]) & self._mask  # wraps modulo 2**64

    def might_contain(self, org: np.ndarray, hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
        pos = self._positions(org, hi, lo)
        hit = (self._bits[pos >> np.uint64(3)] >> (pos & np.uint64(7)).astype(np.uint8)) & 1
        return np.asarray(hit.all(axis=0))

    def add(self, org: np.ndarray, hi: np.ndarray, lo: np.ndarray) -> None:
        pos = self._positions(org, hi, lo).ravel()
        np.bitwise_or.at(
            self._bits, pos >> np.uint64(3), (1 << (pos & np.uint64(7))).astype(np.uint8)
        )
        self.count += len(hi)

    @property
    def full(self) -> bool:
        return self.count > self.capacity


class GrowingKeyFilter:
    """Bloom filters in segments: keys go to the newest, and a full one is followed by one
    of twice its capacity, so growing never re-reads the stored keys (which, at tens of
    millions, took seconds of the writer and gigabytes of memory at each doubling). A key
    may be in any segment: the false-positive rates add up, a few percent at most, which a
    lookup clears."""

    def __init__(self, capacity: int = 1 << 20) -> None:
        self.segments = [KeyFilter(capacity)]

    def might_contain(self, org: np.ndarray, hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
        found = self.segments[0].might_contain(org, hi, lo)
        for segment in self.segments[1:]:
            found = found | segment.might_contain(org, hi, lo)
        return found

    def add(self, org: np.ndarray, hi: np.ndarray, lo: np.ndarray) -> None:
        newest = self.segments[-1]
        newest.add(org, hi, lo)
        if newest.full:
            self.segments.append(KeyFilter(2 * newest.capacity))
