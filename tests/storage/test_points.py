"""Conformance: the PointStore (points, their per-step aggregates, summary reads), on every
backend. Aggregates are held to the numpy reference of docs/reference.md through the same
assembly the server answers with."""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import duckdb
import numpy as np
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from instantml.rankmath.covers import LEVELS
from instantml.rankmath.params import SummaryParams
from instantml.server.responses import JSONResponse
from instantml.storage import open_stores as _open_stores
from instantml.storage.duckdb import block_tables as duckdb_blocks
from instantml.storage.duckdb import head as head_module
from instantml.storage.duckdb import points as points_module
from instantml.storage.duckdb.summary_tables import DuckDBSummaryTables
from instantml.storage.protocols import Stores
from instantml.storage.records import RANK, RANK_COLUMNS, ScalarPoint
from instantml.summary.assemble import assemble
from instantml.summary.coverage import seen_before
from tests.helpers import store_rank_rows, store_scalar_rows
from tests.storage.conftest import OpenStores, examples
from tests.summary.compare import assert_matches
from tests.summary.reference import Point, reference


class Writer:
    """Writes Points into a fresh series, one unit per call, numbering writes in order."""

    def __init__(self, stores: Stores, run_id: str = "r") -> None:
        self.stores = stores
        org, _ = stores.tenancy.ensure_org("o")
        self.org, self.run_id = org, run_id
        with stores.unit():
            from instantml.storage.records import RunSpec

            stores.runs.create(RunSpec(org, run_id, "p", None, {}, [], {}))
            run = stores.runs.resolve(org, [run_id])[run_id]
            assert run is not None
            (self.sid,) = stores.runs.series_ids(run, RANK, ["loss"])
        self.seq = 0

    def write(self, points: list[Point]) -> None:
        with self.stores.unit():
            self.stores.points.write_rank(self.sid, self.columns(points))

    def columns(self, points: list[Point]) -> dict[str, np.ndarray]:
        rows = [
            (p.step, p.rank, p.world_size, -1 if p.local_rank is None else p.local_rank,
             p.value, p.weight, 0.0, self.seq + i)
            for i, p in enumerate(points)
        ]  # fmt: skip
        self.seq += len(points)
        return {
            name: np.array(column, dtype=dtype)
            for (name, dtype), column in zip(RANK_COLUMNS.items(), zip(*rows), strict=True)
        }

    def summary(self, settle: str = "refresh", **params: object) -> dict[str, object]:
        """The summary as the server answers it (a zoom's missing ranks last seen before
        it, as the route says), after the aggregates are brought up to date one way:
        ``refresh`` (every aggregate), ``upkeep`` (background work until the store says a
        summary need not wait, as the server asks it) or ``drain`` (all the background
        work)."""
        points = self.stores.points
        if settle == "refresh":
            with self.stores.unit():
                points.refresh(self.sid)
        else:
            while points.needs_refresh(self.sid) or settle == "drain":
                with self.stores.unit():
                    if not points.maintain():
                        break
            assert not points.needs_refresh(self.sid)
        query = SummaryParams(**params)  # type: ignore[arg-type]
        answer = assemble(self.stores.points.summary_rows(self.sid, query))
        last_steps_of = partial(self.stores.points.last_steps_of, self.sid)
        answer["coverage"]["missing"] = seen_before(answer, query.step_min, last_steps_of)
        return orjson.loads(JSONResponse(answer).body)  # as the server sends it


def test_the_latest_write_of_a_point_wins(open_stores: OpenStores) -> None:
    writer = Writer(open_stores())
    points = writer.stores.points
    with writer.stores.unit():  # twice in one unit: the later (higher seq) wins
        points.write_rank(writer.sid, writer.columns([Point(0, 0, 1.0), Point(0, 1, 2.0)]))
        points.write_rank(writer.sid, writer.columns([Point(0, 0, 5.0)]))
    writer.write([Point(0, 1, 7.0), Point(1, 0, 3.0)])  # a rewrite, in a later unit
    writer.stores.close()
    again = open_stores()
    rows = store_rank_rows(again, writer.sid)
    assert [(s, r, v) for s, r, v, *_ in rows] == [(0, 0, 5.0), (0, 1, 7.0), (1, 0, 3.0)]
    assert again.points.counts([writer.sid]) == {writer.sid: (3, 1)}


def test_late_points_are_brought_up_to_date(open_stores: OpenStores) -> None:
    stores = open_stores()
    writer = Writer(stores)
    writes = [Point(s, r, float(r + s)) for s in range(10) for r in range(4)]
    writer.write(writes)
    late = [Point(2, 1, 50.0), Point(3, 5, -4.0), Point(0, 0, math.nan)]
    writer.write(late)  # older steps than the series' newest: their aggregates go stale
    assert stores.points.needs_refresh(writer.sid) and stores.points.backlog() >= 3
    while True:
        with stores.unit():
            more = stores.points.maintain()
        if not more:
            break
    assert stores.points.backlog() == 0 and not stores.points.needs_refresh(writer.sid)
    assert_matches(writer.summary(), reference(writes + late), 1.0)


def test_steps_written_before_earlier_ones_are_summarised_in_order(
    open_stores: OpenStores,
) -> None:
    # Their step rows are stored after the later steps' (the embedded store reads them
    # without ORDER BY, and past 2,048 rows DuckDB scans the table rather than the
    # primary key's index): the summary's steps still ascend, each with its own reducers.
    writer = Writer(open_stores())
    later = [Point(s, r, float(s % 7 + r)) for s in range(2500, 5000) for r in range(2)]
    earlier = [Point(s, r, float(s % 5 - r)) for s in range(2500) for r in range(2)]
    writer.write(later)
    writer.write(earlier)
    answer = writer.summary(max_points=10_000, heatmap_steps=7)
    assert [s["step"] for s in answer["steps"]] == list(range(5000))  # type: ignore[index]
    assert_matches(answer, reference(later + earlier, max_points=10_000, heatmap_steps=7), 1.0)


def test_a_large_unit_keeps_its_marks(open_stores: OpenStores) -> None:
    # Large writes go to the engine as registered arrays (DuckDB reads a NaN there as
    # NULL): a mark, and a step whose every rank sent one, stay marks.
    writer = Writer(open_stores())
    writes = [
        Point(s, r, math.nan if r == 3 or s == 9 else float(r), 1.0, None, 8)
        for s in range(10)
        for r in range(8)
    ]
    later = [Point(2, 5, math.inf, 1.0, None, 8), *writes[:70]]  # rewrites, stale steps
    writer.write(writes)
    writer.write(later)
    assert_matches(writer.summary(), reference([*writes, *later]), 10.0)


def test_a_store_written_before_blocks_gets_them(open_stores: OpenStores) -> None:
    # Blocks are derived data: a store from before they existed (its block rows gone here)
    # has them rebuilt when opened, and its summaries still equal the reference.
    writer = Writer(open_stores())
    writes = [
        Point(s, r, float((s * 7 + r * 3) % 11), 1.0, r % 2, 4) for s in range(40) for r in range(4)
    ]
    writer.write(writes)
    writer.summary()  # every aggregate up to date
    _forget_blocks(writer.stores)
    writer.stores.close()
    writer.stores = open_stores()
    while True:
        with writer.stores.unit():
            if not writer.stores.points.maintain():
                break
    assert_matches(
        writer.summary(step_min=3, step_max=37, heatmap_steps=5),
        reference(writes, step_min=3, step_max=37, heatmap_steps=5),
        1.0,
    )


def test_a_block_is_built_once_the_run_passes_its_end(open_stores: OpenStores) -> None:
    # Background upkeep leaves a block unbuilt while its series has no step past its end
    # (no summary can use it yet); a later write past it, however far (sparse steps),
    # gets it built. Summaries read in between, without waiting on the writer, hold
    # every point.
    stores = open_stores()
    writer = Writer(stores)
    first = [
        Point(s, r, float((s * 5 + r) % 7), 1.0, r % 2, 8) for s in range(14) for r in range(8)
    ]
    writer.write(first)
    params = {"heatmap_steps": 1, "outlier_limit": 10_000}
    assert_matches(writer.summary("drain", **params), reference(first, **params), 1.0)
    later = [Point(40, r, float(r), 1.0, None, 8) for r in range(8)]
    writer.write(later)
    # The range [0, 40] is one bucket: covered by the level-2 block [0, 16), two level-1
    # blocks and step 40, read before and after the upkeep that builds the block.
    assert_matches(writer.summary("upkeep", **params), reference(first + later, **params), 1.0)
    assert_matches(writer.summary("drain", **params), reference(first + later, **params), 1.0)
    con = getattr(getattr(stores.points, "_engine", None), "con", None)
    if isinstance(con, duckdb.DuckDBPyConnection):  # the embedded store: built once, complete
        kept = con.execute(
            " UNION ALL ".join(
                f"SELECT {level}, start, count(*) FROM {duckdb_blocks.table(level)} GROUP BY start"
                for level in range(2, LEVELS + 1)
            )
            + " ORDER BY 1, 2"
        ).fetchall()
        assert kept == [(2, 0, 8)]


def test_a_store_with_every_level_in_one_table_moves_its_blocks(
    open_stores: OpenStores,
) -> None:
    # The embedded store kept every level's blocks in one table (``rank_blocks``) before
    # it kept a table per level: opened, such a store has its rows moved, once, and its
    # summaries read them (nothing is marked stale, so they are read as blocks).
    writer = Writer(open_stores())
    con = getattr(getattr(writer.stores.points, "_engine", None), "con", None)
    if not isinstance(con, duckdb.DuckDBPyConnection):
        pytest.skip("the embedded store's layout")
    writes = [
        Point(s, r, float((s * 5 + r * 3) % 13), 1.0, r % 3, 4) for s in range(70) for r in range(4)
    ]
    writer.write(writes)
    writer.summary()  # every block built
    tables = [duckdb_blocks.table(level) for level in range(1, LEVELS + 1)]
    counts = [con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0] for t in tables]
    assert counts[:3] == [17 * 4, 4 * 4, 4]  # steps 0-69: the blocks that end by 69
    con.execute(
        "CREATE TABLE rank_blocks AS "
        + " UNION ALL ".join(
            f"SELECT series_id, {level}::TINYINT AS level, * EXCLUDE (series_id) FROM {t}"
            for level, t in enumerate(tables, 1)
        )
    )
    for t in tables:
        con.execute(f"DROP TABLE {t}")
    writer.stores.close()
    writer.stores = open_stores()
    con = writer.stores.points._engine.con  # type: ignore[attr-defined]
    assert [con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0] for t in tables] == counts
    assert not con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'rank_blocks'"
    ).fetchall()[0][0]
    assert not con.execute("SELECT count(*) FROM stale_blocks").fetchall()[0][0]
    params = {"heatmap_steps": 7, "outlier_limit": 10_000}
    assert_matches(writer.summary(**params), reference(writes, **params), 1.0)


def test_a_store_written_before_step_blocks_builds_them(open_stores: OpenStores) -> None:
    # A store from before the step series had blocks: opened, every block is built again
    # once, and the band's buckets (one step block each, here of 64 steps) hold every step.
    writer = Writer(open_stores())
    writes = [
        Point(s, r, float((s * 5 + r * 3) % 13), 1.0, r % 3, 4)
        for s in range(700)
        for r in range(4)
        if not (r == 1 and s % 50 == 7)
    ]
    writer.write(writes)
    params = {"max_points": 20, "heatmap_steps": 7, "outlier_limit": 10_000}
    want = reference(writes, **params)
    assert_matches(writer.summary("drain", **params), want, 1.0)
    points = writer.stores.points
    if hasattr(points, "_engine") and hasattr(points._engine, "con"):  # DuckDB
        points._engine.con.execute("DROP TABLE step_blocks")
    else:  # ClickHouse
        with points._engine.guarded() as client:  # type: ignore[attr-defined]
            client.command(f"TRUNCATE TABLE {points._engine.table('step_blocks')}")  # type: ignore[attr-defined]
    writer.stores.close()
    writer.stores = open_stores()
    assert_matches(writer.summary("upkeep", **params), want, 1.0)
    assert_matches(writer.summary("drain", **params), want, 1.0)


def _forget_blocks(stores: Stores) -> None:
    points = stores.points
    if hasattr(points, "_engine") and hasattr(points._engine, "con"):  # DuckDB
        for level in range(1, LEVELS + 1):
            points._engine.con.execute(f"DROP TABLE {duckdb_blocks.table(level)}")
        points._engine.con.execute("DELETE FROM stale_blocks")
    else:  # ClickHouse
        with points._engine.guarded() as client:  # type: ignore[attr-defined]
            client.command(f"TRUNCATE TABLE {points._engine.table('rank_blocks')}")  # type: ignore[attr-defined]


def test_scalar_points_replace_by_step(stores: Stores) -> None:
    org, _ = stores.tenancy.ensure_org("o")
    with stores.unit():
        from instantml.storage.records import SCALAR, RunSpec

        stores.runs.create(RunSpec(org, "r", "p", None, {}, [], {}))
        run = stores.runs.resolve(org, ["r"])["r"]
        assert run is not None
        (sid,) = stores.runs.series_ids(run, SCALAR, ["acc"])
        stores.points.write_scalars([ScalarPoint(sid, 1, 0.5, 0.0, False)])
    with stores.unit():
        stores.points.write_scalars(
            [ScalarPoint(sid, 1, 0.7, 0.0, False), ScalarPoint(sid, 2, math.inf, 0.0, True)]
        )
    assert store_scalar_rows(stores, sid) == [(1, 0.7), (2, math.inf)]


@st.composite
def batches(draw: st.DrawFn) -> list[list[Point]]:
    world = draw(st.sampled_from([1, 3, 8]))
    out = []
    for _ in range(draw(st.integers(1, 4))):
        out.append(
            [
                Point(
                    draw(st.integers(0, 12)),
                    r,
                    draw(st.sampled_from([0.5, 1.0, 2.0, 9.0, -1.0, math.nan, math.inf])),
                    draw(st.sampled_from([1.0, 3.0])),
                    draw(st.sampled_from([None, 0, 1])),
                    world,
                )
                for r in draw(st.lists(st.integers(0, world - 1), min_size=1, max_size=world))
            ]
        )
    return out


def test_aggregates_equal_the_reference(open_stores: OpenStores, backend: str) -> None:
    @examples(backend, 40)
    @given(batches=batches(), z=st.sampled_from([3.0, 0.5]))
    def check(batches: list[list[Point]], z: float) -> None:
        # Each example in series of its own run: the stores are shared between examples.
        writer = Writer(open_stores(), f"r{np.random.default_rng().integers(1 << 60)}")
        for batch in batches:  # a later batch may rewrite, fill in or precede earlier steps
            writer.write(batch)
        writes = [p for batch in batches for p in batch]
        assert_matches(
            writer.summary(z=z, outlier_limit=10_000, max_points=4, heatmap_steps=3),
            reference(writes, z=z, outlier_limit=10_000, max_points=4, heatmap_steps=3),
            9.0,
            z,
        )

    check()


@st.composite
def spread_batches(draw: st.DrawFn) -> list[list[Point]]:
    """Batches over steps spread across several block levels (4, 16, 64, 256, 1,024),
    sparse and ragged, later batches rewriting or preceding earlier steps."""
    world = draw(st.sampled_from([2, 5]))
    span = draw(st.sampled_from([40, 300, 3000]))
    out = []
    for _ in range(draw(st.integers(1, 4))):
        steps = draw(st.lists(st.integers(0, span), min_size=1, max_size=25, unique=True))
        out.append(
            [
                Point(
                    step,
                    rank,
                    draw(st.sampled_from([0.5, 1.0, 2.0, 9.0, -1.0, 40.0, math.nan])),
                    draw(st.sampled_from([1.0, 3.0])),
                    draw(st.sampled_from([None, 0, 1])),
                    world,
                )
                for step in steps
                for rank in draw(st.lists(st.integers(0, world - 1), min_size=1, unique=True))
            ]
        )
    return out


def test_summaries_over_any_range_equal_the_reference(
    open_stores: OpenStores, backend: str
) -> None:
    # Ranges whose ends fall anywhere relative to block edges, read between writes (so
    # aggregates are brought up to date piecemeal), at several resolutions.
    @examples(backend, 40)
    @given(
        batches=spread_batches(),
        ends=st.tuples(st.integers(0, 3000), st.integers(0, 3000)),
        whole=st.booleans(),
        max_points=st.sampled_from([3, 7, 500]),
        heatmap_steps=st.sampled_from([2, 5, 13, 200]),
        scan_ratio=st.sampled_from([0, 10**9]),
        settle=st.sampled_from(["refresh", "upkeep", "drain"]),
    )
    def check(
        batches: list[list[Point]],
        ends: tuple[int, int],
        whole: bool,
        max_points: int,
        heatmap_steps: int,
        scan_ratio: int,
        settle: str,
    ) -> None:
        # The embedded store reads a short range's cells from its points and a long one's
        # from blocks: both ways, whatever the range.
        DuckDBSummaryTables.scan_ratio = scan_ratio
        writer = Writer(open_stores(), f"r{np.random.default_rng().integers(1 << 60)}")
        lo, hi = (None, None) if whole else (min(ends), max(ends))
        params = {"step_min": lo, "step_max": hi, "max_points": max_points,
                  "heatmap_steps": heatmap_steps, "outlier_limit": 10_000}  # fmt: skip
        writes: list[Point] = []
        for batch in batches:
            writer.write(batch)
            writes += batch
            assert_matches(writer.summary(settle, **params), reference(writes, **params), 40.0)

    default_ratio = DuckDBSummaryTables.scan_ratio
    try:
        check()
    finally:
        DuckDBSummaryTables.scan_ratio = default_ratio


@st.composite
def split_stream(draw: st.DrawFn) -> list[list[Point]]:
    """A run's points in step order (ranks missing here and there, some values marks),
    cut into batches wherever the cuts fall, as an uploader's fixed-size batches split
    steps (all of 64 points or more, or any size); a batch may begin by sending again, with
    new values, some points the one before ended with (rewrites across the cut)."""
    world = draw(st.sampled_from([8, 24, 100]))
    values = st.sampled_from([0.5, 1.0, 2.0, 9.0, -1.0, 40.0, math.nan])
    stream = [
        Point(step, rank, draw(values), draw(st.sampled_from([1.0, 3.0])), None, world)
        for step in range(draw(st.integers(2, 12)))
        for rank in range(world)
        if draw(st.integers(0, 9))  # else this rank skipped this step
    ]
    smallest = draw(st.sampled_from([1, 64]))
    batches: list[list[Point]] = []
    at = 0
    while at < len(stream):
        size = draw(st.integers(smallest, 400))
        if len(stream) - (at + size) < smallest:
            size = len(stream) - at  # the rest, not a batch below the smallest
        batch = stream[at : at + size]
        if batches and draw(st.booleans()):
            again = draw(st.integers(1, 5))
            batch = [
                Point(p.step, p.rank, draw(values), p.weight, None, world)
                for p in batches[-1][-again:]
            ] + batch
        batches.append(batch)
        at += size
    return batches


def test_keys_written_in_one_unit_are_each_scored_alone(
    open_stores: OpenStores, backend: str
) -> None:
    """Several keys' points in each unit (as one batch of rank events brings them) and
    brought up to date together (the ClickHouse store refreshes every series of a chunk
    with one read and one insert a table): each key's summary is its own points'."""

    @examples(backend, 15)
    @given(
        keys=st.lists(spread_batches(), min_size=2, max_size=4),
        settle=st.sampled_from(["refresh", "drain"]),
    )
    def check(keys: list[list[list[Point]]], settle: str) -> None:
        stores = open_stores()
        writer = Writer(stores, f"r{np.random.default_rng().integers(1 << 60)}")
        with stores.unit():
            run = stores.runs.resolve(writer.org, [writer.run_id])[writer.run_id]
            assert run is not None
            sids = list(stores.runs.series_ids(run, RANK, [f"k{i}" for i in range(len(keys))]))
        for i in range(max(len(batches) for batches in keys)):
            with stores.unit():
                for sid, batches in zip(sids, keys, strict=True):
                    if i < len(batches):
                        stores.points.write_rank(sid, writer.columns(batches[i]))
        if settle == "refresh":  # every key in one unit, as a summary of each would ask
            with stores.unit():
                for sid in sids:
                    stores.points.refresh(sid)
        params = {"outlier_limit": 10_000, "max_points": 4, "heatmap_steps": 3}
        for sid, batches in zip(sids, keys, strict=True):
            writer.sid = sid
            assert_matches(
                writer.summary("upkeep" if settle == "refresh" else "drain", **params),
                reference([p for batch in batches for p in batch], **params),  # type: ignore[arg-type]
                9.0,
                3.0,
            )

    check()


def test_a_step_split_across_batches_is_scored_whole(open_stores: OpenStores, backend: str) -> None:
    # A batch that ends inside a step leaves it open; the batch with the step's other ranks
    # scores it again whole (the embedded store keeps the open step's points in memory, and
    # without them, or past its cap, marks the step stale): every summary in between holds
    # exactly the points written. On the embedded store a stream of batches of 64 points
    # or more leaves a step stale only when a batch rewrites a step before the newest, or
    # the newest once all its ranks are in.
    @examples(backend, 40)
    @given(batches=split_stream(), tail_points=st.sampled_from([0, 150, 1 << 18]))
    def check(batches: list[list[Point]], tail_points: int) -> None:
        head_module.TAIL_POINTS = tail_points
        stores = open_stores()
        writer = Writer(stores, f"r{np.random.default_rng().integers(1 << 60)}")
        params = {"max_points": 500, "heatmap_steps": 200, "outlier_limit": 10_000}
        exact = (
            isinstance(stores.points, points_module.DuckDBPoints)
            and tail_points == 1 << 18
            and all(len(b) >= points_module.FRESH_MIN_POINTS for b in batches)
        )
        writes: list[Point] = []
        ranks_at: dict[int, set[int]] = {}
        for batch in batches:
            newest = max(ranks_at, default=-1)
            whole = newest >= 0 and len(ranks_at[newest]) >= batch[0].world_size
            stale = any(p.step < newest or (p.step == newest and whole) for p in batch)
            writer.write(batch)
            writes += batch
            for p in batch:
                ranks_at.setdefault(p.step, set()).add(p.rank)
            if exact:
                assert stores.points.needs_refresh(writer.sid) == stale
            assert_matches(writer.summary("upkeep", **params), reference(writes, **params), 40.0)

    kept = head_module.TAIL_POINTS
    try:
        check()
    finally:
        head_module.TAIL_POINTS = kept


def test_integer_scalar_steps_of_an_earlier_store_are_kept(tmp_path: Path) -> None:
    # Before fractional scalar steps, scalar_points.step was BIGINT (DuckDB) or Int64
    # (ClickHouse, table scalar_points): opening such a store keeps every point.
    duck = tmp_path / "old.duckdb"
    con = duckdb.connect(str(duck))
    con.execute(
        "CREATE TABLE scalar_points (series_id INTEGER NOT NULL, step BIGINT NOT NULL,"
        " value DOUBLE NOT NULL, ts DOUBLE NOT NULL, preview BOOLEAN NOT NULL,"
        " PRIMARY KEY (series_id, step))"
    )
    con.execute(
        "INSERT INTO scalar_points VALUES (1, 3, 0.5, 0, false), (1, 9007199254740991, 2.0, 0, false)"
    )
    con.close()
    ch = tmp_path / "old-ch"
    pytest.importorskip("chdb")
    from instantml.storage.clickhouse.engine import ChEngine

    engine = ChEngine(f"chdb://{ch}")
    with engine.guarded() as client:
        client.command(
            "CREATE TABLE instantml.scalar_points (series_id UInt64, step Int64, value Float64,"
            " ts Float64, preview UInt8, version UInt64) ENGINE = ReplacingMergeTree(version)"
            " ORDER BY (series_id, step)"
        )
        client.command(
            "INSERT INTO instantml.scalar_points VALUES (1, 3, 0.5, 0, 0, 1), (1, 4, 2.0, 0, 0, 1)"
        )
    engine.close()
    for url, expected in (
        (f"duckdb://{duck}", [(3, 0.5), (2**53 - 1, 2.0)]),
        (f"chdb://{ch}", [(3, 0.5), (4, 2.0)]),
    ):
        stores = _open_stores(f"duckdb://{tmp_path / 'meta.duckdb'}", url)
        try:
            assert store_scalar_rows(stores, 1) == expected
        finally:
            stores.close()


def test_windows_of_the_last_steps_follow_the_run(open_stores: OpenStores) -> None:
    # The health monitor's reads. The embedded store reads the step rows from the last
    # look's first step on: steps arriving late, out of order, in the window's gaps or
    # below it, and windows growing and shrinking must all read as the whole run would.
    stores = open_stores()
    writer = Writer(stores)
    rng = np.random.default_rng(7)
    written: dict[tuple[int, int], float] = {}
    plan = [list(range(100, 300, 10))]  # sparse steps: a window spans gaps
    plan += [[295, 305], [3], [306, 307, 290], list(range(400, 440)), [399, 1], [441]]
    for steps in plan:
        batch = []
        for step in steps:
            for rank in rng.choice(4, size=int(rng.integers(1, 5)), replace=False).tolist():
                value = math.nan if rng.random() < 0.1 else float(rng.normal())
                batch.append(Point(step, rank, value, world_size=4))
                written[(step, rank)] = value
        writer.write(batch)
        distinct = sorted({step for step, _ in written})
        for n in (3, 8, 3, 40, 8, 1000):
            first = distinct[-n:][0]
            inside = sorted(key for key in written if key[0] >= first)
            got = stores.points.window_points(writer.sid, n)
            assert list(zip(got["step"].tolist(), got["rank"].tolist(), strict=True)) == inside
            np.testing.assert_array_equal(got["value"], [written[key] for key in inside])
            span, medians = stores.points.window_medians(writer.sid, n)
            assert span == (first, distinct[-1])
            expected = {}
            for rank in range(4):
                finite = [(s, v) for (s, r), v in written.items()
                          if r == rank and s >= first and math.isfinite(v)]  # fmt: skip
                if finite:
                    median = float(np.median([v for _, v in finite]))
                    expected[rank] = (median, len({s for s, _ in finite}))
            assert medians.keys() == expected.keys()
            for rank, (median, count) in expected.items():
                assert medians[rank][0] == pytest.approx(median) and medians[rank][1] == count


def test_two_refreshes_under_one_parent_at_once_leave_every_ancestor_whole(
    open_stores: OpenStores, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two server processes refresh steps 1 and 60 of one series at once: level-2 blocks
    # 0 and 48, under one level-3 block. The second reads and writes all its blocks
    # between the first's read of its children and its write, so it reads the first's
    # level-2 block as it was; the first's ancestors, older, lose to the second's. Only
    # the first's check after its write (a child it read or an ancestor it wrote is no
    # longer the newest) makes it read and write again.
    if "clickhouse" not in backend and "chdb" not in backend:
        pytest.skip("the embedded store rebuilds its blocks in one process's transaction")
    from instantml.storage.clickhouse import block_tables as ch_blocks
    from instantml.storage.clickhouse.points import ChPoints

    stores = open_stores()
    writer = Writer(stores)
    writer.write([Point(s, 0, float(s), world_size=1) for s in range(64)])
    writer.summary()
    points = stores.points
    assert isinstance(points, ChPoints)
    other = ChPoints(points._engine)  # another process's store, on the same tables
    writer.write([Point(1, 0, 100.0, world_size=1)])
    read = ch_blocks._Plan.read
    reads = []

    def interleaved(plan: object, engine: object) -> None:
        read(plan, engine)  # type: ignore[arg-type]
        reads.append(plan)
        if len(reads) == 1:
            writer.write([Point(60, 0, -50.0, world_size=1)])
            other._refresh({writer.sid: [60]})

    monkeypatch.setattr(ch_blocks._Plan, "read", interleaved)
    while points.needs_refresh(writer.sid):
        points._refresh(points._stale([writer.sid], 64))
    assert len(reads) > 4  # the first refresh read again: two plans, a second try
    total = sum(range(64)) - 1 + 100 - 60 - 50
    engine = points._engine
    ranks = engine.rows(
        f"SELECT level, total, n FROM {engine.table('rank_blocks')} FINAL"
        " WHERE series_id = {sid:UInt64} AND level >= 3 ORDER BY level",
        {"sid": writer.sid},
    )
    assert ranks == [(level, total, 64) for level in range(3, LEVELS + 1)]
    steps = engine.rows(
        f"SELECT level, mean, min, max, steps FROM {engine.table('step_blocks')} FINAL"
        " WHERE series_id = {sid:UInt64} AND level >= 3 ORDER BY level",
        {"sid": writer.sid},
    )
    assert steps == [(level, total, -50.0, 100.0, 64) for level in range(3, LEVELS + 1)]


def test_blocks_stale_by_single_requests_are_stale_after_a_restart(
    open_stores: OpenStores, backend: str
) -> None:
    # Single requests' points all go stale; their blocks are stale by those steps' rows
    # (the embedded store lists no block of a stale step): after a restart they are
    # still rebuilt, and a summary read before they are reads their points.
    stores = open_stores()
    writer = Writer(stores)
    writes = [Point(s, r, float((s * 7 + r) % 11)) for s in range(40) for r in range(4)]
    writer.write(writes)
    writer.summary()  # every block built
    singles = [Point(41, r, float(r)) for r in range(4)] + [Point(5, 2, 99.0)]
    for point in singles:
        writer.write([point])
    if "chdb" not in backend and "clickhouse" not in backend:
        con = stores.points._engine.con  # type: ignore[attr-defined]
        listed = {start for (start,) in con.execute("SELECT start FROM stale_blocks").fetchall()}
        assert not listed & {4, 40}  # blocks of stale steps: no row of their own
        tables = DuckDBSummaryTables(stores.points._engine.cursor())  # type: ignore[attr-defined]
        assert {4, 40} <= set(tables.stale_blocks(writer.sid).tolist())
    stores.close()
    again = open_stores()
    if "chdb" not in backend and "clickhouse" not in backend:
        assert {4, 40} <= again.points._head.dirty[writer.sid]  # type: ignore[attr-defined]
    with again.unit():  # the stale steps scored again; their blocks not rebuilt yet
        again.points.maintain()
    if "chdb" not in backend and "clickhouse" not in backend:
        con = again.points._engine.con  # type: ignore[attr-defined]
        listed = {start for (start,) in con.execute("SELECT start FROM stale_blocks").fetchall()}
        assert {4, 40} <= listed  # now by rows of their own
    again.close()
    writer.stores = again = open_stores()
    late = [p for p in writes if (p.step, p.rank) != (5, 2)] + singles
    assert_matches(writer.summary("upkeep"), reference(late), 1.0)
    assert_matches(writer.summary("drain"), reference(late), 1.0)
    assert again.points.backlog() == 0


def test_a_late_point_before_a_gap_marks_only_the_blocks_that_hold_points(
    open_stores: OpenStores, backend: str
) -> None:
    # A late point's score reaches the next 63 scored steps, here across a gap of a
    # million steps (a job that resumed at another step count): the blocks to rebuild are
    # those of the steps it scored again, not of every step number in between (250,000
    # blocks, which once made each such refresh take seconds of the writer).
    if "chdb" in backend or "clickhouse" in backend:
        pytest.skip("the embedded store's block marks")
    stores = open_stores()
    writer = Writer(stores)
    far = 1_000_000
    writer.write(
        [Point(s, r, float(s + r)) for s in [*range(10), *range(far, far + 10)] for r in (0, 1)]
    )
    writer.summary()
    writer.write([Point(5, 0, 50.0)])
    with stores.unit():
        stores.points.maintain()  # the stale step and the steps its score reaches
    engine = stores.points._engine  # type: ignore[attr-defined]
    marked = engine.con.execute("SELECT start FROM stale_blocks ORDER BY start").fetchall()
    assert [start for (start,) in marked] == [4, 8, far, far + 4, far + 8]
    assert_matches(writer.summary(), reference(
        [Point(s, r, float(s + r)) for s in [*range(10), *range(far, far + 10)] for r in (0, 1)]
        + [Point(5, 0, 50.0)]
    ), 1.0)  # fmt: skip
