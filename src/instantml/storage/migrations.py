"""Numbered schema migrations for the metadata stores, one runner for DuckDB and PostgreSQL.

Each engine lists its migrations by the version they bring the database to (its
``schema.py``); a database records the version it is at in ``schema_version``, and is
brought up to date on start, one version at a time, each in a transaction of its own, so a
start cut short resumes at the version it reached. Version 1 is written with ``IF NOT
EXISTS``: a database from before versions were recorded is adopted by it. A database newer
than the code is refused rather than written by a server that does not know its tables.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager

from .records import StorageError
from .sql import Execute

# DDL text (statements separated by ";", none of which holds one), or a step that needs
# to look at the database first (a sequence that starts after the ids already used).
Migration = str | Callable[[Execute], None]


def migrate(
    transaction: Callable[[], AbstractContextManager[Execute]],
    migrations: Mapping[int, Migration],
    engine: str,
) -> int:
    """Bring the database to ``max(migrations)``; the version it is at now."""
    latest = max(migrations)
    with transaction() as execute:
        execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)", [])
        ((found,),) = execute("SELECT max(version) FROM schema_version", [])
    version = 0 if found is None else int(found)
    if version > latest:
        raise StorageError(
            f"the {engine} schema is at version {version}, newer than this server's"
            f" {latest}: upgrade instantml"
        )
    for target in range(version + 1, latest + 1):
        with transaction() as execute:
            step = migrations[target]
            if callable(step):
                step(execute)
            else:
                for statement in step.split(";"):
                    if statement.strip():
                        execute(statement, [])
            execute("DELETE FROM schema_version", [])
            execute("INSERT INTO schema_version VALUES (%s)", [target])
    return latest
