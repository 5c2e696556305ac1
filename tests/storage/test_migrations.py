"""The metadata schema's numbered migrations, on both SQL engines: a database from before
(the embedded file as it was before versions were recorded, a PostgreSQL database at
version 1) is brought up to date on open, keeps its rows, and hands out ids after the ones
it holds; a database newer than the code is refused."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from instantml.storage import open_stores
from instantml.storage.duckdb.schema import MIGRATIONS as DUCKDB_MIGRATIONS
from instantml.storage.postgres.schema import MIGRATIONS as PG_MIGRATIONS
from instantml.storage.records import RunSpec, StorageError
from tests.engines import Engines

# The embedded file's metadata tables as they were before versions were recorded: ids
# handed out by the server from max + 1, no sequences.
_UNVERSIONED = str(DUCKDB_MIGRATIONS[1])
_OLD_ROWS = """
INSERT INTO orgs VALUES (1, 'acme', NULL, 0);
INSERT INTO runs VALUES (7, 1, 'old-run', 'p', NULL, 'running', '{}', '[]', '{}', 1, 1, 2, 9);
INSERT INTO series VALUES (40, 7, 1, 'loss');
INSERT INTO attributes VALUES (7, 12, 'config/lr', 'config', NULL, '0.1', 1);
"""


def _spec(run_id: str) -> RunSpec:
    return RunSpec(org_id=1, run_id=run_id, project="p", name=None, config={}, tags=[], metadata={})


def test_an_unversioned_duckdb_file_is_adopted_and_its_ids_continue(tmp_path: Path) -> None:
    path = tmp_path / "old.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute(_UNVERSIONED)
        con.execute(_OLD_ROWS)
    stores = open_stores(f"duckdb://{path}")
    try:
        old = stores.runs.get_run(1, "old-run")
        assert old is not None and old.config == {"lr": 0.1} and old.last_step == 9
        assert stores.runs.series(1, "old-run") == [(40, 1, "loss")]
        with stores.unit():
            stores.runs.create(_spec("new-run"))
            (ref,) = stores.runs.resolve(1, ["new-run"]).values()
            assert ref is not None
            (sid,) = stores.runs.series_ids(ref, 1, ["loss"])
            stores.runs.add_attributes(
                ref, [{"path": "config/lr", "type": "config", "value": 1}], 2
            )
        assert ref.seq == 8 and sid == 41
    finally:
        stores.close()
    with duckdb.connect(str(path)) as con:
        assert con.execute("SELECT version FROM schema_version").fetchall() == [
            (max(DUCKDB_MIGRATIONS),)
        ]
        assert con.execute("SELECT max(seq) FROM attributes").fetchall() == [(13,)]


def test_a_duckdb_file_newer_than_the_code_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "new.duckdb"
    stores = open_stores(f"duckdb://{path}")
    stores.close()
    with duckdb.connect(str(path)) as con:
        con.execute("UPDATE schema_version SET version = version + 1")
    with pytest.raises(StorageError, match=r"DuckDB schema is at version \d+, newer"):
        open_stores(f"duckdb://{path}")


def test_a_postgres_database_at_version_1_is_brought_up_to_date(
    engines: Engines, tmp_path: Path
) -> None:
    import psycopg

    url = engines.postgres().new_database()
    with psycopg.connect(url, autocommit=True) as con:
        con.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        con.execute(str(PG_MIGRATIONS[1]))
        con.execute("INSERT INTO schema_version VALUES (1)")
        con.execute("INSERT INTO orgs (name, created_at) VALUES ('acme', 0)")
    stores = open_stores(url, f"duckdb://{tmp_path / 'points.duckdb'}")
    try:
        with stores.unit():
            _, created = stores.runs.create(_spec("r"))
            (ref,) = stores.runs.resolve(1, ["r"]).values()
            assert ref is not None
            stores.runs.saw_ranks({ref.seq: [0, 1]}, 5.0)  # run_ranks: version 4's table
        assert created and sorted(stores.runs.rank_activity(1, "r")) == [0, 1]
    finally:
        stores.close()
    with psycopg.connect(url) as con:
        assert con.execute("SELECT version FROM schema_version").fetchall() == [
            (max(PG_MIGRATIONS),)
        ]
