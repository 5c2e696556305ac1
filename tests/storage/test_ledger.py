"""Conformance: the Ledger (Idempotency-Key claims and answers, usage charges), on every
backend."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from instantml.storage.protocols import Stores
from instantml.storage.records import Keys, StoredAnswer
from tests.storage.conftest import OpenStores


def _record(
    stores: Stores, slots: list[tuple[int, int, int]], at: float, status: int = 200
) -> None:
    keys = Keys.of(slots)
    stores.ledger.record(
        keys, keys.hi * 3, np.full(len(slots), status, dtype=np.int16),
        [f'{{"accepted": {h}}}' for h in keys.hi.tolist()], at,
    )  # fmt: skip


def test_claims_are_exclusive_until_their_owner_releases_them(stores: Stores) -> None:
    ledger = stores.ledger
    assert ledger.claim({(1, 2, 3), (1, 2, 4)}, owner=10) == set()
    assert ledger.claim({(1, 2, 3), (1, 9, 9)}, owner=11) == {(1, 2, 3)}  # (1, 9, 9): 11's
    assert ledger.claim({(2, 2, 3)}, owner=12) == set()  # keys are per org
    ledger.release(10)
    assert ledger.claim({(1, 2, 3), (1, 2, 4), (1, 9, 9)}, owner=13) == {(1, 9, 9)}
    ledger.release(99)  # nothing of its own: frees nothing
    assert ledger.claim({(1, 2, 4), (1, 9, 9), (2, 2, 3)}, owner=14) == {
        (1, 2, 4), (1, 9, 9), (2, 2, 3)
    }  # fmt: skip
    ledger.release(11)
    ledger.release(12)
    assert ledger.claim({(1, 9, 9), (2, 2, 3)}, owner=15) == set()


def test_answers_are_kept_and_found(open_stores: OpenStores) -> None:
    stores = open_stores()
    with stores.unit():
        _record(stores, [(1, 10, 1), (1, 11, 1), (2, 10, 1)], at=100.0)
    found = stores.ledger.lookup(Keys.of([(1, 10, 1), (1, 11, 2), (2, 10, 1), (3, 3, 3)]))
    assert found == {
        (1, 10, 1): StoredAnswer(30, 200, '{"accepted": 10}'),
        (2, 10, 1): StoredAnswer(30, 200, '{"accepted": 10}'),
    }
    with pytest.raises(RuntimeError), stores.unit():
        _record(stores, [(1, 12, 1)], at=100.0)
        raise RuntimeError("the unit fails")
    assert stores.ledger.lookup(Keys.of([(1, 12, 1)])) == {}  # nothing of a failed unit
    stores.close()
    again = open_stores()
    assert set(again.ledger.lookup(Keys.of([(1, 10, 1), (1, 11, 1)]))) == {(1, 10, 1), (1, 11, 1)}
    again.ledger.prune(before=101.0)
    assert again.ledger.lookup(Keys.of([(1, 10, 1), (1, 11, 1)])) == {}


def test_answers_keep_every_character(stores: Stores) -> None:
    # A run's answer holds what its config held: tabs, newlines, backslashes, quotes, any
    # character; bodies of every length (none too), keys and fingerprints of every sign.
    bodies = ['{"run": {"config": {"a": "x\ty"}}}', '{"n": "line\nnext\r\\\\N"}',
              "\\.", '{"accepted": 3}', '{"accepted": 3}', "", '{"name": "r\u00e9sum\u00e9 \u2713"}',
              '{"accepted": 12}']  # fmt: skip
    slots = [(1, (-1) ** i * (40 + i) << 56, -i) for i in range(len(bodies))]
    keys = Keys.of(slots)
    prints = np.array([(-1) ** i * (i + 1) << 60 for i in range(len(bodies))], dtype=np.int64)
    statuses = np.array([200, 201] * (len(bodies) // 2), dtype=np.int16)
    with stores.unit():  # in two parts, as a unit of several requests records them
        for part in (slice(0, 3), slice(3, None)):
            stores.ledger.record(
                Keys.of(slots[part]), prints[part], statuses[part], bodies[part], 5.0
            )
    found = stores.ledger.lookup(keys)
    assert found == {
        slot: StoredAnswer(int(f), int(s), body)
        for slot, f, s, body in zip(slots, prints, statuses, bodies, strict=True)
    }
    same = Keys.of([(1, 90 + i, -1) for i in range(3)])  # one body for every key
    with stores.unit():
        stores.ledger.record(same, same.lo, np.full(3, 200, dtype=np.int16), ["\u00e9\t"] * 3, 6.0)
    assert set(stores.ledger.lookup(same).values()) == {StoredAnswer(-1, 200, "\u00e9\t")}


def test_the_limit_is_exact_and_month_bound(open_stores: OpenStores) -> None:
    stores = open_stores()
    ledger = stores.ledger
    with stores.unit():
        assert ledger.charge(1, "2026-11", 60, 100)
        assert ledger.used(1, "2026-11") == 60  # this unit's charges count
        assert not ledger.charge(1, "2026-11", 41, 100)  # 101 > 100: refused, whole
        assert ledger.charge(1, "2026-11", 40, 100)  # landing exactly on the limit: taken
        assert not ledger.charge(1, "2026-11", 1, 100)
        assert ledger.charge(1, "2026-11", 1_000_000, None)  # no limit
        assert ledger.charge(2, "2026-11", 100, 100)  # another org
        assert ledger.charge(1, "2026-12", 100, 100)  # another month
    with pytest.raises(RuntimeError), stores.unit():
        assert ledger.charge(1, "2027-01", 5, None)
        raise RuntimeError("the unit fails")
    stores.close()
    ledger = open_stores().ledger
    assert ledger.used(1, "2026-11") == 1_000_100 and ledger.used(2, "2026-11") == 100
    assert ledger.used(1, "2026-12") == 100 and ledger.used(1, "2027-01") == 0


def test_concurrent_charges_never_overshoot(stores: Stores) -> None:
    results: list[bool] = []
    start = threading.Barrier(32)

    def charge() -> None:
        start.wait()
        with stores.unit():
            results.append(stores.ledger.charge(7, "2026-11", 10, 105))

    threads = [threading.Thread(target=charge) for _ in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results.count(True) == 10 and results.count(False) == 22
    assert stores.ledger.used(7, "2026-11") == 100


def test_other_threads_see_committed_usage_only(stores: Stores) -> None:
    inside, release = threading.Event(), threading.Event()

    def writer() -> None:
        with stores.unit():
            assert stores.ledger.charge(3, "2026-11", 50, None)
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert inside.wait(10)
        assert stores.ledger.used(3, "2026-11") == 0  # not the unit's uncommitted charge
    finally:
        release.set()
        thread.join()
    # ...and the read before the commit left no stale count behind.
    assert stores.ledger.used(3, "2026-11") == 50
    with stores.unit():
        assert not stores.ledger.charge(3, "2026-11", 51, 100)


def test_upload_marks_first_one_stands(stores: Stores) -> None:
    ledger = stores.ledger
    assert ledger.batch_marks(1, "s", [0, 1]) == {}
    ledger.mark_batch(1, "s", 0, True)
    ledger.mark_batch(1, "s", 1, False)
    ledger.mark_batch(1, "s", 1, True)  # a duplicate's mark: the first stands
    assert ledger.batch_marks(1, "s", [0, 1, 2]) == {0: True, 1: False}
    assert ledger.batch_marks(2, "s", [0]) == {}  # another org's session of the same name
    assert ledger.batch_marks(1, "t", [0]) == {}


def test_answers_across_partitions(
    open_stores: OpenStores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embedded ledger keeps keys in partitions of PARTITION_KEYS (only the newest is
    written, so only its index is rewritten at checkpoints): keys are found in any of them,
    a partition begun by a failed unit is gone with it, a restart finds them all, and
    pruning drops a partition once every key of it expired."""
    stores = open_stores()
    if not hasattr(stores.ledger, "_partitions"):
        pytest.skip("partitions are the embedded ledger's")
    from instantml.storage.duckdb import ledger as duckdb_ledger

    monkeypatch.setattr(duckdb_ledger, "PARTITION_KEYS", 4)
    for n in range(5):  # 3 keys a unit: a unit that would overfill a partition begins one
        with stores.unit():
            _record(stores, [(1, 100 + 3 * n + i, 1) for i in range(3)], at=100.0 + n)
    tables = lambda s: sorted(  # noqa: E731
        name
        for (name,) in s.ledger._engine.con.execute(  # type: ignore[attr-defined]
            "SELECT table_name FROM information_schema.tables WHERE table_name LIKE 'idem%'"
        ).fetchall()
    )
    assert tables(stores) == ["idempotency", *(f"idempotency_{n}" for n in range(1, 5))]
    indexed = lambda s: s.ledger._engine.con.execute(  # type: ignore[attr-defined]  # noqa: E731
        "SELECT table_name FROM duckdb_indexes() WHERE table_name LIKE 'idem%'"
    ).fetchall()
    assert indexed(stores) == [("idempotency_4",)]  # only the newest: full ones lose theirs
    every = [(1, 100 + k, 1) for k in range(15)]
    assert set(stores.ledger.lookup(Keys.of(every))) == set(every)
    with pytest.raises(RuntimeError), stores.unit():
        _record(stores, [(1, 500 + i, 1) for i in range(3)], at=200.0)
        raise RuntimeError("the unit fails")
    assert len(tables(stores)) == 5 and stores.ledger.lookup(Keys.of([(1, 500, 1)])) == {}
    assert indexed(stores) == [("idempotency_4",)]  # its index dropped, then rolled back
    with stores.unit():
        _record(stores, [(1, 600, 1)], at=300.0)  # fits the newest partition, beside unit 4
    stores.close()
    again = open_stores()
    assert set(again.ledger.lookup(Keys.of([*every, (1, 600, 1)]))) == {*every, (1, 600, 1)}
    again.ledger.prune(before=102.5)  # units 0-2 expired: their partitions are dropped
    assert tables(again) == ["idempotency_3", "idempotency_4"]
    assert set(again.ledger.lookup(Keys.of(every))) == {(1, 100 + k, 1) for k in range(9, 15)}
    again.ledger.prune(before=104.5)  # the newest is never dropped: its old keys are deleted
    assert tables(again) == ["idempotency_4"]
    assert set(again.ledger.lookup(Keys.of([*every, (1, 600, 1)]))) == {(1, 600, 1)}
    with again.unit():
        _record(again, [(1, 700 + i, 1) for i in range(4)], at=400.0)
    assert tables(again) == ["idempotency_4", "idempotency_5"]


def _record_forms(
    stores: Stores, org: int, writer: int, ns: list[int], at: float, hi: int | None = None
) -> list[tuple[int, int, int]]:
    """Keys ``<writer>-<n>`` (their 128-bit hash stood in for by (writer, n)), recorded."""
    slots = [(org, writer if hi is None else hi, n) for n in ns]
    keys = Keys.of(slots, [(writer, n) for n in ns])
    stores.ledger.record(
        keys, keys.lo, np.full(len(ns), 200, dtype=np.int16), ["{}"] * len(ns), at
    )  # fmt: skip
    return slots


def _ask(stores: Stores, org: int, writer: int, ns: list[int]) -> set[int]:
    keys = Keys.of([(org, writer, n) for n in ns], [(writer, n) for n in ns])
    return {lo for _, _, lo in stores.ledger.lookup(keys)}


def test_keys_of_a_writer_are_found_across_partitions_and_restarts(
    open_stores: OpenStores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys ``<prefix>-<n>`` (the SDK's and the spool's): found whichever partition, unit or
    order they were stored in, after a restart too, and never taken for another org's or
    writer's; the embedded ledger keeps them as ranges, none of them in a Bloom filter,
    until a partition's keys make too many ranges (random n): those go to its filter."""
    from instantml.storage.duckdb import ledger as duckdb_ledger

    monkeypatch.setattr(duckdb_ledger, "PARTITION_KEYS", 50)
    monkeypatch.setattr(duckdb_ledger, "RANGE_LIMIT", 8)
    stores = open_stores()
    embedded = hasattr(stores.ledger, "_ranges")
    rng = np.random.default_rng(11)
    stored: dict[int, set[int]] = {101: set(), 102: set(), 103: set()}
    chunks = rng.permutation(12).tolist()  # three writers, n 1..120 each, out of order
    for unit, chunk in enumerate(chunks):
        with stores.unit():
            for writer in stored:
                ns = list(range(10 * chunk + 1, 10 * chunk + 11))
                _record_forms(stores, 1, writer, ns, at=100.0 + unit)
                stored[writer].update(ns)
    asked = list(range(0, 130))
    for writer, ns in stored.items():
        assert _ask(stores, 1, writer, asked) == ns
    assert _ask(stores, 2, 101, asked) == set()  # another org
    assert _ask(stores, 1, 104, asked) == set()  # another writer
    if embedded:
        ledger = stores.ledger
        assert len(ledger._partitions) > 2  # type: ignore[attr-defined]
        assert ledger._filters == {}  # type: ignore[attr-defined]
        assert all(len(r) <= 3 for r in ledger._ranges.values())  # type: ignore[attr-defined]
    # Random n: ranges beyond RANGE_LIMIT in the newest partition; the rest go to a filter.
    scattered = sorted(set(rng.integers(1000, 10**9, 30).tolist()))
    with stores.unit():
        _record_forms(stores, 1, 105, scattered, at=200.0)
    assert _ask(stores, 1, 105, [*scattered, 999]) == set(scattered)
    if embedded:
        assert list(stores.ledger._filters) == [stores.ledger._partitions[-1]]  # type: ignore[attr-defined]
    stores.close()
    again = open_stores()
    for writer, ns in stored.items():
        assert _ask(again, 1, writer, asked) == ns
    assert _ask(again, 1, 105, [*scattered, 999]) == set(scattered)
    again.ledger.prune(before=104.5)  # units 0-4 expired
    gone = {n for chunk in chunks[:5] for n in range(10 * chunk + 1, 10 * chunk + 11)}
    kept = {writer: ns - gone for writer, ns in stored.items()}
    for writer, ns in kept.items():
        assert _ask(again, 1, writer, asked) == ns


def test_keys_each_their_own_range_are_found_when_ranges_overflow(
    open_stores: OpenStores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys such as ``<uuid>-1`` (each its own prefix, so its own range) fill a partition's
    ranges and then the frozen partitions' merged set: past either limit they are still
    found (the rest of a partition in its filter, a frozen partition's ranges checked on
    their own), after a restart too."""
    from instantml.storage.duckdb import ledger as duckdb_ledger

    monkeypatch.setattr(duckdb_ledger, "PARTITION_KEYS", 10)
    monkeypatch.setattr(duckdb_ledger, "RANGE_LIMIT", 6)
    monkeypatch.setattr(duckdb_ledger, "FROZEN_LIMIT", 14)
    stores = open_stores()
    stored = []
    for unit in range(12):  # 4 keys a unit, each of another writer
        with stores.unit():
            for i in range(4):
                stored += _record_forms(stores, 1, 1000 + 4 * unit + i, [1], at=100.0 + unit)
    asked = [*stored, *((1, w, 2) for _, w, _ in stored), (1, 9999, 1)]
    keys = Keys.of(asked, [(w, n) for _, w, n in asked])
    assert set(stores.ledger.lookup(keys)) == set(stored)
    if hasattr(stores.ledger, "_apart"):
        assert stores.ledger._apart  # type: ignore[attr-defined]
        assert len(stores.ledger._frozen) <= 14  # type: ignore[attr-defined]
        assert stores.ledger._filters  # type: ignore[attr-defined]
    stores.close()
    again = open_stores()
    assert set(again.ledger.lookup(keys)) == set(stored)
