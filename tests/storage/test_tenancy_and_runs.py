"""Conformance: Tenancy (orgs, keys, limits) and Runs (runs, series, extents, attributes),
on every backend."""

from __future__ import annotations

import subprocess
import sys

import pytest

from instantml.storage.duckdb.growth import FOLD_ROWS
from instantml.storage.protocols import Stores
from instantml.storage.records import RANK, SCALAR, RunConflict, RunRef, RunSpec, StorageError
from tests.storage.conftest import OpenStores

MONTH = "2026-12"


def _spec(org: int, run_id: str, project: str = "p", **extra: object) -> RunSpec:
    return RunSpec(org, run_id, project, extra.get("name"), {"lr": 0.1}, ["t"], {})  # type: ignore[arg-type]


def test_orgs_keys_and_limits_persist(open_stores: OpenStores) -> None:
    stores = open_stores()
    tenancy = stores.tenancy
    org, created = tenancy.ensure_org("vision")
    assert created and tenancy.ensure_org("vision") == (org, False)
    other, _ = tenancy.ensure_org("nlp")
    assert other != org and tenancy.org_id("nlp") == other and tenancy.org_name(org) == "vision"
    assert tenancy.org_id("nope") is None and tenancy.org_name(10_000) is None
    tenancy.add_api_key(org, "k1", "hash1", frozenset({"ingest", "read"}))
    tenancy.add_api_key(other, "k2", "hash2", frozenset({"admin"}))
    assert tenancy.count_api_keys() == 2
    found = tenancy.find_api_key("k1")
    assert found is not None and (found.org_id, found.key_hash, found.revoked) == (
        org,
        "hash1",
        False,
    )
    assert found.scopes == {"ingest", "read"}
    assert tenancy.revoke_api_key("k1", other) is False  # another org's key: not found
    assert tenancy.revoke_api_key("k1", org) is True
    assert tenancy.revoke_api_key("k1", org) is False  # already revoked
    revoked = tenancy.find_api_key("k1")
    assert revoked is not None and revoked.revoked
    assert [k["key_id"] for k in tenancy.list_api_keys(org)] == ["k1"]
    assert {k["key_id"] for k in tenancy.list_api_keys(None)} == {"k1", "k2"}
    assert tenancy.monthly_limit(org) is None
    tenancy.set_monthly_limit(org, 500)
    stores.close()
    again = open_stores().tenancy
    assert again.monthly_limit(org) == 500 and again.org_id("vision") == org
    assert again.find_api_key("k1").revoked  # type: ignore[union-attr]
    again.set_monthly_limit(org, None)
    assert again.monthly_limit(org) is None


def test_create_attach_and_conflict(stores: Stores) -> None:
    org, _ = stores.tenancy.ensure_org("o")
    runs = stores.runs
    with stores.unit():
        record, created = runs.create(_spec(org, "r1", name="first"))
        assert created and record.status == "running" and record.config == {"lr": 0.1}
        # Visible to the rest of the unit before it commits.
        ref = runs.resolve(org, ["r1", "nope"])
        assert ref["nope"] is None and ref["r1"] is not None and ref["r1"].project == "p"
        again, created = runs.create(_spec(org, "r1"))
        assert not created and again.run_id == "r1"
        with pytest.raises(RunConflict) as conflict:
            runs.create(_spec(org, "r1", project="elsewhere"))
        assert conflict.value.project == "p"
    assert runs.get_run(org, "r1").name == "first"  # type: ignore[union-attr]
    assert runs.get_run(org + 1, "r1") is None  # runs are per org
    with stores.unit():
        _, created = runs.create(_spec(org + 1, "r1", project="elsewhere"))
    assert created


def test_a_failed_unit_leaves_nothing(open_stores: OpenStores) -> None:
    stores = open_stores()
    org, _ = stores.tenancy.ensure_org("o")
    with pytest.raises(RuntimeError), stores.unit():
        stores.runs.create(_spec(org, "lost"))
        run = stores.runs.resolve(org, ["lost"])["lost"]
        assert run is not None
        stores.runs.series_ids(run, RANK, ["a"])
        raise RuntimeError("storage failed mid-unit")
    assert stores.runs.get_run(org, "lost") is None
    assert stores.runs.resolve(org, ["lost"]) == {"lost": None}
    with stores.unit():  # the ids it had taken are free again, and the store still works
        stores.runs.create(_spec(org, "kept"))
    stores.close()
    assert open_stores().runs.get_run(org, "kept") is not None


def test_series_extents_status_and_attributes(open_stores: OpenStores) -> None:
    stores = open_stores()
    org, _ = stores.tenancy.ensure_org("o")
    runs = stores.runs
    with stores.unit():
        runs.create(_spec(org, "r"))
        run = runs.resolve(org, ["r"])["r"]
        assert run is not None
        a, b = runs.series_ids(run, RANK, ["a", "b"])
        assert a != b and runs.series_ids(run, RANK, ["b", "a"]) == [b, a]
        (scalar_a,) = runs.series_ids(run, SCALAR, ["a"])
        assert scalar_a not in (a, b)  # kind is part of a series
        runs.extend({run.seq: (8, 10)})
        runs.extend({run.seq: (4, 12)})  # each only ever grows
        runs.add_attributes(run, [{"path": "config/batch", "type": "config", "value": 64}], 0.0)
    record = runs.get_run(org, "r")
    assert record is not None and (record.world_size, record.last_step) == (8, 12)
    assert record.config == {"lr": 0.1, "batch": 64}
    assert runs.series_id(org, "r", RANK, "a") == a and runs.series_id(org, "r", RANK, "z") is None
    with stores.unit():
        done = runs.set_status(run, "finished")
    assert done.status == "finished" and done.world_size == 8
    for extent, want in [((4, 15), (8, 15)), ((16, 13), (16, 15)), ((0, 20), (16, 20))]:
        with stores.unit():  # across units: a world size known not to grow is left alone
            runs.extend({run.seq: extent})
            runs.count_points({run.seq: 3})
        record = runs.get_run(org, "r")
        assert record is not None and (record.world_size, record.last_step) == want
    assert record.points == 9
    stores.close()
    again = open_stores().runs
    assert sorted(again.series(org, "r") or []) == sorted(
        [(a, RANK, "a"), (b, RANK, "b"), (scalar_a, SCALAR, "a")]
    )
    assert [r.run_id for r in again.list_runs(org, "p", 10)] == ["r"]
    assert again.list_runs(org, "other", 10) == [] and again.series(org, "nope") is None


# A unit of one run writes its growth as one row on the embedded store, folded into the
# runs every FOLD_ROWS units: these cross that boundary twice.
UNITS = 2 * FOLD_ROWS + 5


def _grow(stores: Stores, org: int, run: RunRef, i: int) -> None:
    with stores.unit():
        assert stores.ledger.charge(org, MONTH, 3, None)
        stores.runs.extend({run.seq: (8 + i // 100, i)})
        stores.runs.count_points({run.seq: 3})


def _assert_grown(stores: Stores, org: int, units: int) -> None:
    want = (8 + (units - 1) // 100, units - 1, 3 * units)
    record = stores.runs.get_run(org, "g")
    assert record is not None and (record.world_size, record.last_step, record.points) == want
    (listed,) = stores.runs.list_runs(org, "p", 10)
    assert (listed.world_size, listed.last_step, listed.points) == want
    assert stores.ledger.used(org, MONTH) == 3 * units


def test_run_extents_and_usage_in_every_unit_and_after_a_crash(
    open_stores: OpenStores, store_urls: tuple[str, str]
) -> None:
    """Every committed unit's extent, points and usage are read back at once, and after
    the process that wrote them died without closing its stores."""
    stores = open_stores()
    org, _ = stores.tenancy.ensure_org("o")
    with stores.unit():
        stores.runs.create(_spec(org, "g"))
    run = stores.runs.resolve(org, ["g"])["g"]
    assert run is not None
    for i in range(UNITS):
        _grow(stores, org, run, i)
        _assert_grown(stores, org, i + 1)
    with stores.unit():  # the answered record holds the unit's own growth
        stores.runs.extend({run.seq: (0, UNITS)})
        stores.runs.count_points({run.seq: 1})
        assert stores.runs.set_status(run, "finished").points == 3 * UNITS + 1
    stores.close()
    code = f"""
import os
from instantml.storage import open_stores
stores = open_stores({store_urls[0]!r}, {store_urls[1]!r})
org, _ = stores.tenancy.ensure_org("o")
run = stores.runs.resolve(org, ["g"])["g"]
for i in range(40):
    with stores.unit():
        assert stores.ledger.charge(org, {MONTH!r}, 2, None)
        stores.runs.extend({{run.seq: (0, {UNITS} + 1 + i)}})
        stores.runs.count_points({{run.seq: 2}})
os._exit(0)  # no close: what the units committed is all there is
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    stores = open_stores()
    record = stores.runs.get_run(org, "g")
    assert record is not None
    assert (record.last_step, record.points) == (UNITS + 40, 3 * UNITS + 1 + 80)
    assert stores.ledger.used(org, MONTH) == 3 * UNITS + 80
    for _ in range(FOLD_ROWS):  # and on, through a fold of what the dead process left
        with stores.unit():
            stores.runs.count_points({run.seq: 1})
    record = stores.runs.get_run(org, "g")
    assert record is not None and record.points == 3 * UNITS + 81 + FOLD_ROWS


def test_units_of_many_runs_and_orgs_and_of_a_deleted_run(open_stores: OpenStores) -> None:
    stores = open_stores()
    org, _ = stores.tenancy.ensure_org("o")
    other, _ = stores.tenancy.ensure_org("other")
    with stores.unit():
        for org_id, run_id in ((org, "a"), (org, "b"), (other, "c"), (org, "gone")):
            stores.runs.create(_spec(org_id, run_id))
    refs = {
        run_id: stores.runs.resolve(org_id, [run_id])[run_id]
        for org_id, run_id in ((org, "a"), (org, "b"), (other, "c"), (org, "gone"))
    }
    a, b, c, gone = refs["a"], refs["b"], refs["c"], refs["gone"]
    assert a is not None and b is not None and c is not None and gone is not None
    with stores.unit():  # two runs, one org's charge
        assert stores.ledger.charge(org, MONTH, 5, None)
        stores.runs.extend({a.seq: (2, 7), b.seq: (4, 9)})
        stores.runs.count_points({a.seq: 2, b.seq: 3})
    with stores.unit():  # two orgs' charges, three runs
        assert stores.ledger.charge(org, MONTH, 1, None)
        assert stores.ledger.charge(other, MONTH, 6, None)
        stores.runs.extend({a.seq: (0, 8), c.seq: (1, 0)})
        stores.runs.count_points({a.seq: 1, c.seq: 6})
    with stores.unit():  # a charge with no run grown
        assert stores.ledger.charge(other, MONTH, 4, None)
    grown = {
        run_id: (r.world_size, r.last_step, r.points)
        for org_id, run_id in ((org, "a"), (org, "b"), (other, "c"))
        if (r := stores.runs.get_run(org_id, run_id)) is not None
    }
    assert grown == {"a": (2, 8, 3), "b": (4, 9, 3), "c": (1, 0, 6)}
    assert (stores.ledger.used(org, MONTH), stores.ledger.used(other, MONTH)) == (6, 10)
    with stores.unit():
        assert stores.deletions.delete_run(org, "gone") is not None
    for runs in ({gone.seq: 1}, {gone.seq: 1, a.seq: 1}):  # a ref this process still held
        with pytest.raises(StorageError, match="deleted while being written"), stores.unit():
            assert stores.ledger.charge(org, MONTH, 1, None)
            stores.runs.extend({seq: (1, 50) for seq in runs})
            stores.runs.count_points(runs)
    a_now = stores.runs.get_run(org, "a")
    assert a_now is not None and (a_now.last_step, a_now.points) == (8, 3)
    assert stores.ledger.used(org, MONTH) == 6  # nothing of the failed units was kept
