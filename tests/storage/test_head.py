"""The embedded store's head alone: rebuilt from the tables, changed only by a committed
unit's changes."""

from __future__ import annotations

import duckdb
import numpy as np
import pytest

from instantml.rankmath.step_stats import REFERENCE_STEPS
from instantml.storage.duckdb import block_tables, point_tables
from instantml.storage.duckdb import head as head_module
from instantml.storage.duckdb.head import Head, Staged


@pytest.fixture
def con() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(":memory:")
    con.execute(point_tables.SCHEMA)
    con.execute(block_tables.SCHEMA)
    return con


def _points(con: duckdb.DuckDBPyConnection, rows: list[tuple[int, int, int]]) -> None:
    for sid, step, rank in rows:
        con.execute(
            "INSERT INTO rank_points (series_id, step, rank, world_size, value, weight, ts)"
            " VALUES (?, ?, ?, 4, 1.0, 1.0, 0.0)",
            [sid, step, rank],
        )


def test_a_head_is_rebuilt_from_the_tables(con: duckdb.DuckDBPyConnection) -> None:
    _points(con, [(1, 0, 0), (1, 5, 0), (1, 3, 2), (2, 7, 1)])
    con.execute("INSERT INTO stale_steps VALUES (1, 3), (1, 3), (2, 7)")
    con.execute("INSERT INTO stale_blocks VALUES (1, 0), (1, 4)")
    head = Head.load(con)
    assert head.newest_by_rank(1).tolist() == [5, -1, 3]
    assert head.newest_by_rank(2).tolist() == [-1, 7]
    assert head.newest_by_rank(3) is None
    assert head.last_step == {1: 5, 2: 7}
    assert head.stale == {1: {3}, 2: {7}}
    # Listed blocks, and the block of each stale step (series 2's step 7 is in block 4,
    # which no row lists: a single request's unit leaves it to the step's row).
    assert head.dirty == {1: {0, 4}, 2: {4}}
    assert head.backlog() == 5  # two stale steps, three stale blocks
    assert head.tails == {} and head.spreads == {}  # caches start empty


def test_a_unit_changes_the_head_only_when_committed(con: duckdb.DuckDBPyConnection) -> None:
    _points(con, [(1, 4, 0)])
    con.execute("INSERT INTO stale_steps VALUES (1, 2), (1, 3)")
    head = Head.load(con)
    assert head.dirty == {1: {0}}  # the block of the stale steps
    staged = Staged()
    staged.frames = [
        {"series_id": np.array([1, 1, 9]), "rank": np.array([0, 3, 0]),
         "step": np.array([6, 6, 1])}
    ]  # fmt: skip
    staged.last_step = {1: 6, 9: 1}
    staged.stale = {1: {5}}
    staged.refreshed = {1: {2, 3}}
    staged.dirty = {1: {4}}
    staged.tails = {1: {"step": np.array([6, 6]), "rank": np.array([0, 3])}}
    assert head.newest_by_rank(1).tolist() == [4]  # staged, not committed: nothing yet
    head.commit(staged)
    assert head.newest_by_rank(1).tolist() == [6, -1, -1, 6]
    assert head.newest_by_rank(9).tolist() == [1]
    assert head.last_step == {1: 6, 9: 1}
    assert head.stale == {1: {5}}  # 2 and 3 recomputed, 5 newly stale
    assert head.dirty == {1: {0, 4}}
    assert head.tail_points == 2
    rebuilt = Staged()
    rebuilt.rebuilt = {1: {0, 4}}
    rebuilt.refreshed = {1: {5}}
    rebuilt.tails = {1: None}  # the open step closed
    head.commit(rebuilt)
    assert head.stale == {} and head.dirty == {} and head.tails == {}
    assert head.tail_points == 0


def test_open_steps_past_the_cap_drop_the_oldest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(head_module, "TAIL_POINTS", 5)
    head = Head()
    for sid in (1, 2, 3):
        staged = Staged()
        staged.tails = {sid: {"step": np.full(2, 10), "rank": np.arange(2)}}
        head.commit(staged)
    assert list(head.tails) == [2, 3] and head.tail_points == 4
    staged = Staged()  # a series written again moves to the newest end
    staged.tails = {2: {"step": np.full(3, 11), "rank": np.arange(3)}}
    head.commit(staged)
    assert list(head.tails) == [3, 2] and head.tail_points == 5


def test_remembered_spreads_keep_the_last_qualifying_steps() -> None:
    head = Head()
    staged = Staged()
    staged.spreads = [(1, np.array([0]), np.array([4]), np.array([1.0]))]
    head.commit(staged)
    assert 1 not in head.spreads  # only a series whose spreads were loaded is kept
    head.spreads[1] = (np.empty(0, dtype=np.int64), np.empty(0))
    steps = np.arange(100, dtype=np.int64)
    n = np.where(steps % 10 == 0, 1, 4)  # a step with one finite value does not qualify
    staged = Staged()
    staged.spreads = [(1, steps, n, np.ones(100))]
    head.commit(staged)
    kept, spreads = head.spreads[1]
    assert len(kept) == REFERENCE_STEPS - 1
    assert kept[-1] == 99 and not np.isin(kept, steps[n == 1]).any()
    assert (spreads > 0).all()


def test_window_floors_are_a_bounded_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(head_module, "CACHED_SERIES", 2)
    head = Head()
    head.remember_floor(1, 20, None)
    assert head.floors == {}
    head.remember_floor(1, 20, 100)
    head.remember_floor(2, 20, 50)
    head.remember_floor(3, 20, 70)  # past the bound: started again
    assert head.floors == {(3, 20): 70}
