"""The ClickHouse DDL with a cluster name: Replicated tables on every shard, a Distributed
table over them, all ON CLUSTER (generated and checked here; no cluster runs in CI)."""

from __future__ import annotations

import pytest

pytest.importorskip("clickhouse_connect")

from instantml.storage.clickhouse.engine import TABLES, ddl


def test_single_node_tables_are_replacing_merge_trees() -> None:
    statements = ddl("im")
    assert statements[0] == "CREATE DATABASE IF NOT EXISTS im"
    for name in TABLES:
        (create,) = [s for s in statements if f" im.{name} (" in s]
        assert "ENGINE = ReplacingMergeTree(version)" in create and "ON CLUSTER" not in create


def test_cluster_tables_are_replicated_behind_a_distributed_table() -> None:
    statements = ddl("im", cluster="prod")
    assert statements[0] == "CREATE DATABASE IF NOT EXISTS im ON CLUSTER prod"
    assert all(" ON CLUSTER prod " in s or s.endswith(" ON CLUSTER prod") for s in statements)
    for name, (_, order) in TABLES.items():
        local = next(s for s in statements if f"im.{name}_local ON CLUSTER" in s)
        assert (
            f"ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{{shard}}/im/{name}',"
            " '{replica}', version)" in local
        )
        assert f"ORDER BY ({order})" in local
        front = next(s for s in statements if f"TABLE IF NOT EXISTS im.{name} ON CLUSTER" in s)
        assert f"AS im.{name}_local" in front
        assert f"ENGINE = Distributed(prod, im, {name}_local, series_id)" in front
