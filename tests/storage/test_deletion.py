"""Deleting a run on every backend: its metadata at once, its points purged in bounded
units until no row of its series is left in any table; other runs untouched; the id free
again; retention picks only the runs past their project's days."""

from __future__ import annotations

import time

from instantml.rankmath.covers import LEVELS
from instantml.server.write.deletion import Deleter
from instantml.storage.protocols import Stores
from instantml.storage.records import RANK, SCALAR, RunSpec, ScalarPoint
from tests.helpers import store_rank_rows
from tests.storage.conftest import OpenStores
from tests.storage.test_points import Writer
from tests.summary.reference import Point

POINT_TABLES = (
    "rank_points", "step_stats", "stale_steps", "outlier_rows", "stale_blocks", "scalar_points",
    "step_blocks", *(f"rank_blocks_{level}" for level in range(1, LEVELS + 1)),
)  # fmt: skip
CH_TABLES = ("rank_points", "scores", "scalars", "step_stats", "rank_blocks", "step_blocks",
             "outlier_rows", "stale_steps")  # fmt: skip


def _fill(stores: Stores, run_id: str, steps: int, ranks: int) -> Writer:
    writer = Writer(stores, run_id)
    for start in range(0, steps, 50):
        writer.write(
            [Point(s, r, float(s + r % 3)) for s in range(start, min(start + 50, steps))
             for r in range(ranks)]
        )  # fmt: skip
    with stores.unit():
        run = stores.runs.resolve(writer.org, [run_id])[run_id]
        assert run is not None
        (sid,) = stores.runs.series_ids(run, SCALAR, ["eval/loss"])
        stores.points.write_scalars([ScalarPoint(sid, 1, 0.5, 0.0, False)])
        stores.runs.add_attributes(
            run, [{"path": "config/lr", "type": "config", "value": 0.1}], 0.0
        )
        stores.runs.count_points({run.seq: steps * ranks + 1})
    with stores.unit():
        while stores.points.maintain():  # aggregates and blocks written, as a server would
            pass
    return writer


def _clickhouse(stores: Stores) -> bool:
    return type(stores.points).__name__ == "ChPoints"


def _rows_of(stores: Stores, backend: str, sids: list[int]) -> dict[str, int]:
    """Rows of these series in every table of the point store."""
    points = stores.points
    ids = ", ".join(map(str, sids))
    counts = {}
    if _clickhouse(stores):
        engine = points._engine  # type: ignore[attr-defined]
        for name in CH_TABLES:
            ((n,),) = engine.rows(
                f"SELECT count() FROM {engine.table(name)} WHERE series_id IN ({ids})"
            )
            counts[name] = int(n)
    else:
        con = points._engine.cursor()  # type: ignore[attr-defined]
        for name in POINT_TABLES:
            counts[name] = con.execute(
                f"SELECT count(*) FROM {name} WHERE series_id IN ({ids})"
            ).fetchone()[0]
    return counts


def test_a_deleted_run_leaves_no_row_and_its_id_is_free(
    open_stores: OpenStores, backend: str
) -> None:
    stores = open_stores()
    kept = _fill(stores, "kept", 120, 8)
    gone = _fill(stores, "gone", 300, 8)
    series = [sid for sid, _, _ in stores.runs.series(gone.org, "gone") or []]
    assert len(series) == 2 and sum(_rows_of(stores, backend, series).values()) > 2400
    deleter = Deleter(stores, None, float("inf"))
    assert deleter.delete_run(gone.org, "gone") is True
    assert deleter.delete_run(gone.org, "gone") is False  # already gone
    assert stores.runs.get_run(gone.org, "gone") is None
    assert stores.runs.series(gone.org, "gone") is None
    assert stores.deletions.purges(100) == sorted(series)
    # Bounded units: a small budget takes several, each leaving fewer rows.
    import instantml.server.write.deletion as deletion

    budget, deletion.PURGE_ROWS = deletion.PURGE_ROWS, 500
    try:
        units = 0
        while deleter.purge():
            units += 1
            assert units < 1000
    finally:
        deletion.PURGE_ROWS = budget
    assert units >= (1 if _clickhouse(stores) else 4)
    assert stores.deletions.purges(100) == []
    assert set(_rows_of(stores, backend, series).values()) == {0}
    # The other run is whole.
    assert len(store_rank_rows(stores, kept.sid)) == 120 * 8
    assert stores.runs.get_run(kept.org, "kept") is not None
    # The id names a new run, with nothing of the old one.
    with stores.unit():
        record, created = stores.runs.create(RunSpec(gone.org, "gone", "p", None, {}, [], {}))
    assert created and record.points == 0 and record.last_step is None
    with stores.unit():
        run = stores.runs.resolve(gone.org, ["gone"])["gone"]
        assert run is not None
        (sid,) = stores.runs.series_ids(run, RANK, ["loss"])
    assert sid not in series and store_rank_rows(stores, sid) == []
    # Reopened (a restart), nothing comes back.
    stores.close()
    again = open_stores()
    assert again.runs.series(gone.org, "gone") == [(sid, RANK, "loss")]
    assert set(_rows_of(again, backend, series).values()) == {0}


def test_a_purge_cut_short_resumes_after_a_restart(open_stores: OpenStores, backend: str) -> None:
    stores = open_stores()
    gone = _fill(stores, "gone", 200, 4)
    series = [sid for sid, _, _ in stores.runs.series(gone.org, "gone") or []]
    assert Deleter(stores, None, float("inf")).delete_run(gone.org, "gone")
    stores.close()  # before any purge
    again = open_stores()
    deleter = Deleter(again, None, float("inf"))
    while deleter.purge():
        pass
    assert set(_rows_of(again, backend, series).values()) == {0}
    assert again.deletions.purges(10) == []
    with again.unit():  # the embedded store's head forgot them: no background work left
        while again.points.maintain():
            pass


def test_retention_picks_only_runs_past_their_projects_days(open_stores: OpenStores) -> None:
    stores = open_stores()
    org, _ = stores.tenancy.ensure_org("o")
    with stores.unit():
        for run_id, project in (("old-a", "a"), ("old-b", "b"), ("old-c", "c"), ("new-a", "a")):
            stores.runs.create(RunSpec(org, run_id, project, None, {}, [], {}))
        stores.deletions.set_retention(org, "b", 30)
        stores.deletions.set_retention(org, "c", None)  # for ever, whatever the default
    now = time.time()
    later = now + 10 * 86_400  # ten days on: the runs were last written ten days before
    assert stores.deletions.expired(later, None, 100) == []  # b's 30 days not reached
    assert sorted(stores.deletions.expired(later, 7, 100)) == [(org, "new-a"), (org, "old-a")]
    assert stores.deletions.expired(now + 31 * 86_400, None, 100) == [(org, "old-b")]
    assert stores.deletions.retention(org, "c") == (True, None)
    assert stores.deletions.retention(org, "z") == (False, None)
