"""Keys ``<prefix>-<n>`` as ranges of n (the embedded ledger's memory of the SDK's and the
spool's keys): the set answers exactly as the set of keys it was made of, however the keys
came (in order, shuffled, in several unions), and a writer's keys stay one range."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from instantml.server.write.idempotency import key_sequence, key_sequences
from instantml.storage.duckdb.keyranges import KeyRanges, idents
from instantml.storage.records import SEQUENCE_LIMIT

EDGES = [0, 1, 2, 3, SEQUENCE_LIMIT - 2, SEQUENCE_LIMIT - 1]
keys_st = st.lists(
    st.tuples(
        st.sampled_from([-(2**63), -5, 0, 7, 2**63 - 1]),
        st.one_of(st.sampled_from(EDGES), st.integers(0, 40)),
    ),
    max_size=60,
)


@given(st.lists(keys_st, min_size=1, max_size=4), keys_st)
@settings(max_examples=300, deadline=None)
def test_answers_as_the_set_of_its_keys(parts: list[list[tuple[int, int]]], asked: list) -> None:
    ranges = KeyRanges()
    for part in parts:
        ident = np.array([i for i, _ in part], dtype=np.int64)
        n = np.array([k for _, k in part], dtype=np.int64)
        ranges = ranges.union(KeyRanges.of(ident, n))
    every = {key for part in parts for key in part}
    asked = (
        asked
        + sorted(every)
        + [(i, -1) for i, _ in every]
        + [(i, SEQUENCE_LIMIT) for i, _ in every]
    )
    ident = np.array([i for i, _ in asked], dtype=np.int64)
    n = np.array([k for _, k in asked], dtype=np.int64)
    assert ranges.contains(ident, n).tolist() == [key in every for key in asked]
    # Ranges never touch or overlap: as few as the keys allow.
    runs = sum(1 for i, k in every if (i, k - 1) not in every)
    assert len(ranges) == runs


def test_a_writers_keys_stay_one_range_however_they_arrive() -> None:
    rng = np.random.default_rng(3)
    org = np.ones(512 * 200, dtype=np.int64)
    prefix = rng.integers(-(2**63), 2**63 - 1, 512, dtype=np.int64)
    seq = np.tile(prefix, 200)  # 512 writers, each with n = 1..200, batch after batch
    n = np.repeat(np.arange(1, 201), 512)
    order = rng.permutation(len(n))  # and out of order across batches
    ranges = KeyRanges()
    for batch in np.array_split(order, 37):
        ranges = ranges.union(KeyRanges.of(idents(org[batch], seq[batch]), n[batch]))
    assert len(ranges) == 512 and ranges.prefixes() == 512
    assert ranges.contains(idents(org, seq), n).all()
    assert not ranges.contains(idents(org, seq), n + 200).any()
    assert not ranges.contains(idents(org + 1, seq), n).any()  # another org's writer


def test_the_form_of_a_key() -> None:
    (a, one), (b, two) = key_sequence("3f2a-1"), key_sequence("3f2a-2")
    assert a == b and (one, two) == (1, 2)
    assert key_sequence("run-7-3")[1] == 3 and key_sequence("run-7-3")[0] != a  # last dash
    assert key_sequence(f"x-{SEQUENCE_LIMIT - 1}")[1] == SEQUENCE_LIMIT - 1
    assert key_sequence("x-0")[1] == 0
    # Only a form the key and (prefix, n) are one-to-one with: "x-01" is not "x-1".
    for key in ["x-01", "-1", "x-", "x", "x-+1", "x- 1", "x-1 ", "x-1.0", "x-١٢", "x-\uff11",
                f"x-{SEQUENCE_LIMIT}", "x-" + "9" * 40]:  # fmt: skip
        assert key_sequence(key) == (0, -1), key
    seq, n = key_sequences(["a-1", "b", "a-2"])
    assert n.tolist() == [1, -1, 2] and seq[0] == seq[2] and seq[1] == 0
