"""The DuckDB file's metadata schema, by version (``storage/migrations.py`` runs them).

Version 1 is every metadata table as the embedded store has had them (``IF NOT EXISTS``: a
file from before versions were recorded is adopted as it is). Version 2 gives runs, series
and attributes their ids from sequences named as PostgreSQL names a serial column's, so
the SQL that writes them is shared (``storage/runs_sql.py``), each starting after the ids
a file already holds. The point tables and the Idempotency-Key partitions are the point
store's and the ledger's own (``point_tables.py``, ``block_tables.py``, ``ledger.py``).
"""

from __future__ import annotations

from ..migrations import Migration, migrate
from ..sql import Execute
from . import growth
from .engine import Engine

_VERSION_1 = """
CREATE TABLE IF NOT EXISTS orgs (
    org_id INTEGER PRIMARY KEY, name VARCHAR UNIQUE NOT NULL,
    monthly_limit BIGINT, created_at DOUBLE NOT NULL);
CREATE TABLE IF NOT EXISTS api_keys (
    key_id VARCHAR PRIMARY KEY, org_id INTEGER NOT NULL, key_hash VARCHAR NOT NULL,
    scopes VARCHAR NOT NULL, created_at DOUBLE NOT NULL, revoked_at DOUBLE);
CREATE TABLE IF NOT EXISTS runs (
    run_seq INTEGER PRIMARY KEY, org_id INTEGER NOT NULL, run_id VARCHAR NOT NULL,
    project VARCHAR NOT NULL, name VARCHAR, status VARCHAR NOT NULL,
    config VARCHAR NOT NULL, tags VARCHAR NOT NULL, metadata VARCHAR NOT NULL,
    created_at DOUBLE NOT NULL, updated_at DOUBLE NOT NULL,
    world_size INTEGER, last_step BIGINT, UNIQUE (org_id, run_id));
CREATE TABLE IF NOT EXISTS series (
    series_id INTEGER PRIMARY KEY, run_seq INTEGER NOT NULL, kind TINYINT NOT NULL,
    key VARCHAR NOT NULL, UNIQUE (run_seq, kind, key));
CREATE TABLE IF NOT EXISTS attributes (
    run_seq INTEGER NOT NULL, seq BIGINT NOT NULL, path VARCHAR, type VARCHAR,
    step BIGINT, value VARCHAR, ts DOUBLE NOT NULL);
CREATE TABLE IF NOT EXISTS run_ranks (
    run_seq INTEGER NOT NULL, rank INTEGER NOT NULL, first_seen DOUBLE NOT NULL,
    last_seen DOUBLE NOT NULL, finished_at DOUBLE, PRIMARY KEY (run_seq, rank));
-- Append-only, one row per unit that charged points, read as a SUM: a plain insert costs
-- a third of an upsert, and every write group pays it.
CREATE TABLE IF NOT EXISTS usage_log (
    org_id INTEGER NOT NULL, month VARCHAR NOT NULL, points BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS alerts (
    alert_id VARCHAR PRIMARY KEY, org_id INTEGER NOT NULL, run_id VARCHAR NOT NULL,
    kind VARCHAR NOT NULL, rank INTEGER NOT NULL, key VARCHAR NOT NULL,
    since_step BIGINT NOT NULL, since_time DOUBLE NOT NULL, message VARCHAR NOT NULL,
    opened_at DOUBLE NOT NULL, resolved_at DOUBLE);
CREATE TABLE IF NOT EXISTS webhooks (
    webhook_id VARCHAR PRIMARY KEY, org_id INTEGER NOT NULL, url VARCHAR NOT NULL,
    kinds VARCHAR NOT NULL, secret VARCHAR NOT NULL, created_at DOUBLE NOT NULL);
CREATE TABLE IF NOT EXISTS deliveries (
    delivery_id VARCHAR PRIMARY KEY, webhook_id VARCHAR NOT NULL, alert_id VARCHAR NOT NULL,
    body VARCHAR NOT NULL, attempts INTEGER NOT NULL, next_at DOUBLE NOT NULL,
    delivered_at DOUBLE, failed_at DOUBLE, last_error VARCHAR)
"""

# (table, id column): each id's sequence is <table>_<column>_seq, as PostgreSQL's serial.
_SEQUENCED = (("runs", "run_seq"), ("series", "series_id"), ("attributes", "seq"))


def _sequences(execute: Execute) -> None:
    for table, column in _SEQUENCED:
        ((used,),) = execute(f"SELECT coalesce(max({column}), 0) FROM {table}", [])
        name = f"{table}_{column}_seq"
        execute(f"CREATE SEQUENCE {name} START {int(used) + 1}", [])
        execute(f"ALTER TABLE {table} ALTER COLUMN {column} SET DEFAULT nextval('{name}')", [])


# Each run's points (what it cost), projects' retention, and the series whose points a
# deleted run left to remove from the point store (done in bounded units, resumed on start).
_VERSION_3 = """
ALTER TABLE runs ADD COLUMN points BIGINT DEFAULT 0;
CREATE TABLE retention (
    org_id INTEGER NOT NULL, project VARCHAR NOT NULL, days INTEGER,
    PRIMARY KEY (org_id, project));
CREATE TABLE purges (series_id BIGINT PRIMARY KEY, queued_at DOUBLE NOT NULL)
"""

# The host each rank said it runs on (the latest).
_VERSION_4 = "ALTER TABLE run_ranks ADD COLUMN node VARCHAR"

MIGRATIONS: dict[int, Migration] = {
    1: _VERSION_1, 2: _sequences, 3: _VERSION_3, 4: _VERSION_4,
    # What units add to runs and usage, folded in later (growth.py), and runs seen with it.
    5: growth.SCHEMA,
}  # fmt: skip


def migrate_metadata(engine: Engine) -> None:
    migrate(engine.statements, MIGRATIONS, "DuckDB")
