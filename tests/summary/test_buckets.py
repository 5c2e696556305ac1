"""The bucket rule and the pieces a bucket is read from, as functions: block-aligned
buckets, a full bucket read as one block, every step of a range read exactly once, and a
step block's sums the same whether taken from step rows at once or from blocks of them."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from instantml.rankmath import covers, step_blocks
from instantml.rankmath.params import bucket_size


@given(
    first=st.integers(0, 10**7),
    span=st.integers(1, 10**6),
    cap=st.integers(1, 2_000),
)
def test_the_bucket_size_is_the_smallest_block_size_that_fits(
    first: int, span: int, cap: int
) -> None:
    last = first + span - 1
    size = bucket_size(first, last, span, cap)
    if span <= cap:
        assert size == 1
        return
    need = math.ceil(span / cap)
    assert size >= need and size // 4 < need
    assert size == 4 ** round(math.log(size, 4))
    touched = last // size - first // size + 1
    assert touched <= cap + 1  # aligned from step 0: one more than the cap at most


def _expanded(pieces: covers.Pieces) -> dict[int, list[int]]:
    """Each step read, with the bucket it was read for."""
    read: dict[int, list[int]] = {}
    for level, start, group in zip(pieces.levels, pieces.starts, pieces.block_group):
        assert start % 4**level == 0  # aligned
        for step in range(start, start + 4**level):
            read.setdefault(step, []).append(group)
    for step, group in zip(pieces.steps, pieces.step_group):
        read.setdefault(step, []).append(group)
    return read


@given(
    first=st.integers(0, 5_000),
    span=st.integers(1, 5_000),
    cap=st.integers(1, 300),
    stale_at=st.lists(st.integers(0, 2_500), max_size=6),
)
def test_every_step_is_read_once_for_its_bucket(
    first: int, span: int, cap: int, stale_at: list[int]
) -> None:
    last = first + span - 1
    size = bucket_size(first, last, span, cap)
    stale = np.unique(np.array([first + 4 * k for k in stale_at], dtype=np.int64) // 4 * 4)
    pieces = covers.buckets(first, last, size, None, stale)
    read = _expanded(pieces)
    assert sorted(read) == list(range(first, last + 1))
    assert all(groups == [step // size] for step, groups in read.items())
    # Steps of a stale level-1 block are read as steps, never through a block.
    blocked = {
        s
        for level, start in zip(pieces.levels, pieces.starts)
        for s in range(start, start + 4**level)
    }
    assert not any(s // 4 * 4 in set(stale.tolist()) for s in blocked)
    if not len(stale) and size > 1:
        # A bucket inside the range is one block of its size; only the edges take more.
        inner = range(-(-first // size), (last + 1) // size)
        for bucket in inner:
            mine = [
                (level, start)
                for level, start, group in zip(pieces.levels, pieces.starts, pieces.block_group)
                if group == bucket
            ]
            if size <= 4**covers.LEVELS:
                assert mine == [(round(math.log(size, 4)), bucket * size)]
            assert bucket not in pieces.step_group


@given(
    steps=st.lists(st.integers(0, 3_000), min_size=1, max_size=400, unique=True),
    size_level=st.integers(1, 4),
    data=st.data(),
)
def test_a_bucket_from_blocks_is_the_bucket_from_steps(
    steps: list[int], size_level: int, data: st.DataObject
) -> None:
    step = np.array(sorted(steps), dtype=np.int64)
    k = len(step)
    n = np.array(data.draw(st.lists(st.integers(0, 8), min_size=k, max_size=k)))
    marks = np.array(data.draw(st.lists(st.integers(0, 2), min_size=k, max_size=k)))
    expected = n + marks + np.array(data.draw(st.lists(st.integers(0, 2), min_size=k, max_size=k)))
    values = np.array(data.draw(st.lists(st.floats(-1e3, 1e3), min_size=6 * k, max_size=6 * k)))
    stats = {"step": step, "n": n, "nonfinite": marks, "expected": expected}
    for i, name in enumerate(step_blocks.MEANED):
        stats[name] = np.where(n > 0, values[i * k : (i + 1) * k], np.nan)
    stats["min"] = np.where(n > 0, stats["p05"] - 1, np.nan)
    stats["max"] = np.where(n > 0, stats["p95"] + 1, np.nan)
    size = 4**size_level
    rows = step_blocks.of_steps(stats)
    direct_keys, direct = step_blocks.combine(step // size, rows)
    # The same through level-1 blocks, then their parents: what a store keeps and reads.
    one_keys, ones = step_blocks.combine(step // 4 * 4, rows)
    staged_keys, staged = step_blocks.combine(one_keys // size, ones)
    np.testing.assert_array_equal(direct_keys, staged_keys)
    for name in step_blocks.FIELDS:
        np.testing.assert_allclose(direct[name], staged[name], rtol=1e-12, atol=1e-9)
    entries = step_blocks.entries(direct)
    for j, bucket in enumerate(direct_keys.tolist()):
        inside = (step // size) == bucket
        valued = inside & (n > 0)
        assert entries["step"][j] == step[inside][0] and entries["step_end"][j] == step[inside][-1]
        covered = (n + marks)[inside]
        least = int(np.argmin(covered))  # the first of the fewest: the earliest on ties
        assert entries["count"][j] == n[inside][least]
        assert entries["nonfinite"][j] == marks[inside][least]
        assert entries["nonfinite_total"][j] == marks[inside].sum()
        assert entries["expected"][j] == expected[inside].max()
        if valued.any():
            assert math.isclose(
                entries["mean"][j], stats["mean"][valued].mean(), rel_tol=1e-9, abs_tol=1e-9
            )
            assert entries["min"][j] == stats["min"][valued].min()
            assert entries["max"][j] == stats["max"][valued].max()
        else:
            assert math.isnan(entries["mean"][j]) and math.isnan(entries["min"][j])


@given(
    pairs=st.lists(
        st.tuples(st.integers(-(2**31), 2**31), st.integers(-(2**63), 2**63 - 1)), max_size=300
    ),
    repeats=st.integers(1, 3),
)
def test_unique_pairs_is_numpys_unique_over_pairs(
    pairs: list[tuple[int, int]], repeats: int
) -> None:
    """Block keys are made distinct (and each row's block found) by a lexsort: the same
    pairs, order and inverse as ``np.unique`` over the stacked pairs."""
    first = np.array([a for a, _ in pairs] * repeats, dtype=np.int64)
    second = np.array([b for _, b in pairs] * repeats, dtype=np.int64)
    got, inverse = covers.unique_pairs(first, second)
    want, want_inverse = np.unique(np.stack([first, second]), axis=1, return_inverse=True)
    assert got.shape == want.shape and (got == want).all()
    assert (inverse == want_inverse.ravel()).all()
    assert (got[0][inverse] == first).all() and (got[1][inverse] == second).all()
