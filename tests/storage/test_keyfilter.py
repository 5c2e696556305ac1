"""The Bloom filter of stored Idempotency-Keys grows in segments: no stored key is ever
missed (a miss would apply a retry twice), and fresh keys are rarely taken for stored."""

from __future__ import annotations

import numpy as np

from instantml.storage.duckdb.keyfilter import GrowingKeyFilter


def test_growing_never_misses_a_key_and_rarely_claims_one() -> None:
    rng = np.random.default_rng(5)
    keys = GrowingKeyFilter(capacity=1000)
    added = []
    for _ in range(40):  # 40,000 keys into a filter made for 1,000: it grows
        org = rng.integers(1, 4, 1000)
        hi, lo = rng.integers(-(2**63), 2**63 - 1, (2, 1000), dtype=np.int64)
        keys.add(org, hi, lo)
        added.append((org, hi, lo))
    assert len(keys.segments) > 3
    for org, hi, lo in added:
        assert keys.might_contain(org, hi, lo).all()
    org = rng.integers(1, 4, 100_000)
    hi, lo = rng.integers(-(2**63), 2**63 - 1, (2, 100_000), dtype=np.int64)
    assert keys.might_contain(org, hi, lo).mean() < 0.05
