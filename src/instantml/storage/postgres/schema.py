"""The PostgreSQL metadata schema, by version (``storage/migrations.py`` runs them).

Ids come from the serial columns' sequences (``<table>_<column>_seq``), as the SQL shared
with DuckDB, which names its sequences the same, expects.
"""

from __future__ import annotations

from ..migrations import Migration

_VERSION_1 = """
CREATE TABLE IF NOT EXISTS orgs (
    org_id BIGSERIAL PRIMARY KEY, name TEXT UNIQUE NOT NULL, monthly_limit BIGINT,
    created_at DOUBLE PRECISION NOT NULL);
CREATE TABLE IF NOT EXISTS api_keys (
    key_id TEXT PRIMARY KEY, org_id BIGINT NOT NULL, key_hash TEXT NOT NULL,
    scopes TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL, revoked_at DOUBLE PRECISION);
CREATE TABLE IF NOT EXISTS runs (
    run_seq BIGSERIAL PRIMARY KEY, org_id BIGINT NOT NULL, run_id TEXT NOT NULL,
    project TEXT NOT NULL, name TEXT, status TEXT NOT NULL, config TEXT NOT NULL,
    tags TEXT NOT NULL, metadata TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL, world_size INTEGER, last_step BIGINT,
    UNIQUE (org_id, run_id));
CREATE TABLE IF NOT EXISTS series (
    series_id BIGSERIAL PRIMARY KEY, run_seq BIGINT NOT NULL, kind SMALLINT NOT NULL,
    key TEXT NOT NULL, UNIQUE (run_seq, kind, key));
CREATE TABLE IF NOT EXISTS attributes (
    seq BIGSERIAL PRIMARY KEY, run_seq BIGINT NOT NULL, path TEXT, type TEXT, step BIGINT,
    value TEXT, ts DOUBLE PRECISION NOT NULL);
CREATE INDEX IF NOT EXISTS attributes_run ON attributes (run_seq);
CREATE TABLE IF NOT EXISTS usage (
    org_id BIGINT NOT NULL, month TEXT NOT NULL, used BIGINT NOT NULL,
    PRIMARY KEY (org_id, month));
CREATE TABLE IF NOT EXISTS answers (
    org_id BIGINT NOT NULL, key_hi BIGINT NOT NULL, key_lo BIGINT NOT NULL,
    fingerprint BIGINT NOT NULL, status SMALLINT NOT NULL, body TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (org_id, key_hi, key_lo));
CREATE INDEX IF NOT EXISTS answers_created ON answers (created_at);
CREATE TABLE IF NOT EXISTS claims (
    org_id BIGINT NOT NULL, key_hi BIGINT NOT NULL, key_lo BIGINT NOT NULL,
    expires DOUBLE PRECISION NOT NULL, PRIMARY KEY (org_id, key_hi, key_lo));
"""
MIGRATIONS: dict[int, Migration] = {
    1: _VERSION_1,
    2: """
CREATE TABLE upload_batches (
    org_id BIGINT NOT NULL, session TEXT NOT NULL, seq BIGINT NOT NULL,
    clean BOOLEAN NOT NULL, created_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (org_id, session, seq));
CREATE INDEX upload_batches_created ON upload_batches (created_at);
""",
    3: """
CREATE TABLE alerts (
    alert_id TEXT PRIMARY KEY, org_id BIGINT NOT NULL, run_id TEXT NOT NULL,
    kind TEXT NOT NULL, rank INTEGER NOT NULL, key TEXT NOT NULL,
    since_step BIGINT NOT NULL, since_time DOUBLE PRECISION NOT NULL, message TEXT NOT NULL,
    opened_at DOUBLE PRECISION NOT NULL, resolved_at DOUBLE PRECISION);
CREATE UNIQUE INDEX alerts_open ON alerts (org_id, run_id, kind, rank, key)
    WHERE resolved_at IS NULL;
CREATE INDEX alerts_run ON alerts (org_id, run_id);
CREATE TABLE webhooks (
    webhook_id TEXT PRIMARY KEY, org_id BIGINT NOT NULL, url TEXT NOT NULL,
    kinds TEXT NOT NULL, secret TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL);
CREATE TABLE deliveries (
    delivery_id TEXT PRIMARY KEY, webhook_id TEXT NOT NULL, alert_id TEXT NOT NULL,
    body TEXT NOT NULL, attempts INTEGER NOT NULL, next_at DOUBLE PRECISION NOT NULL,
    delivered_at DOUBLE PRECISION, failed_at DOUBLE PRECISION, last_error TEXT);
CREATE INDEX deliveries_due ON deliveries (next_at) WHERE delivered_at IS NULL;
""",
    4: """
CREATE TABLE run_ranks (
    run_seq BIGINT NOT NULL, rank INTEGER NOT NULL, first_seen DOUBLE PRECISION NOT NULL,
    last_seen DOUBLE PRECISION NOT NULL, finished_at DOUBLE PRECISION,
    PRIMARY KEY (run_seq, rank));
""",
    5: """
ALTER TABLE runs ADD COLUMN points BIGINT DEFAULT 0;
CREATE TABLE retention (
    org_id BIGINT NOT NULL, project TEXT NOT NULL, days INTEGER,
    PRIMARY KEY (org_id, project));
CREATE TABLE purges (series_id BIGINT PRIMARY KEY, queued_at DOUBLE PRECISION NOT NULL);
""",
    6: "ALTER TABLE run_ranks ADD COLUMN node TEXT",
    # A claim's request token: a request releases its own claims, one index range.
    7: """
ALTER TABLE claims ADD COLUMN owner BIGINT NOT NULL DEFAULT 0;
CREATE INDEX claims_owner ON claims (owner);
""",
}
