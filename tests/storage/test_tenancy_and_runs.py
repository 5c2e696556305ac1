"""Conformance: Tenancy (orgs, keys, limits) and Runs (runs, series, extents, attributes),
on every backend."""

from __future__ import annotations

import pytest

from instantml.storage.protocols import Stores
from instantml.storage.records import RANK, SCALAR, RunConflict, RunSpec
from tests.storage.conftest import OpenStores


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
