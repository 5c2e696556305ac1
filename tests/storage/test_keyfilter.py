"""The Bloom filter of a partition of stored Idempotency-Keys: no stored key is ever missed
(a miss would apply a retry twice), and fresh keys are rarely taken for stored."""

from __future__ import annotations

import numpy as np

from instantml.storage.duckdb.keyfilter import KeyFilter, hashes


def test_never_misses_a_key_and_rarely_claims_one() -> None:
    rng = np.random.default_rng(5)
    keys = KeyFilter(capacity=50_000)
    added = []
    for _ in range(50):
        org = rng.integers(1, 4, 1000)
        hi, lo = rng.integers(-(2**63), 2**63 - 1, (2, 1000), dtype=np.int64)
        keys.add(*hashes(org, hi, lo))
        added.append((org, hi, lo))
    for org, hi, lo in added:
        assert keys.might_contain(*hashes(org, hi, lo)).all()
    org = rng.integers(1, 4, 1_000_000)
    hi, lo = rng.integers(-(2**63), 2**63 - 1, (2, 1_000_000), dtype=np.int64)
    assert keys.might_contain(*hashes(org, hi, lo)).sum() < 200  # about 2e-5 at capacity: ~20 here
