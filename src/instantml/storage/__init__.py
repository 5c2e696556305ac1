"""Storage by concern, chosen by two URLs (docs/architecture.md): the metadata stores
(tenancy, runs, the ledger) and the point store.

A registry maps each URL scheme to a factory; ``duckdb://`` (the embedded default) serves
both. PostgreSQL and ClickHouse register here when they exist; routes and the write
service only ever see the protocols of :mod:`.protocols`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from .export import ExportTables
from .protocols import Deletions, HealthStore, Ledger, PointStore, Runs, Stores, Tenancy


@dataclass
class Metadata:
    tenancy: Tenancy
    runs: Runs
    deletions: Deletions
    ledger: Ledger
    health: HealthStore
    unit: Callable[[], AbstractContextManager[None]]
    close: Callable[[], None]


@dataclass
class Points:
    points: PointStore
    export: ExportTables
    unit: Callable[[], AbstractContextManager[None]]
    close: Callable[[], None]


# Engines opened by one open_stores call, by what they open (two URLs naming one DuckDB
# file share it, and so share its transactions).
_Engines = dict[str, Any]


def _duckdb_engine(url: str, engines: _Engines) -> Any:
    from .duckdb import Engine, engine_path

    path = engine_path(url)
    if path not in engines:
        engines[path] = Engine(path)
    return engines[path]


def _duckdb_metadata(url: str, engines: _Engines) -> Metadata:
    from .deletion_sql import SqlDeletions
    from .duckdb import DuckDBHealth, DuckDBLedger, DuckDBTenancy, migrate_metadata
    from .duckdb.growth import RunGrowth
    from .runs_sql import SqlRuns

    engine = _duckdb_engine(url, engines)
    migrate_metadata(engine)
    growth = RunGrowth(engine)
    runs = SqlRuns(engine, growth)
    metadata = Metadata(
        DuckDBTenancy(engine), runs, SqlDeletions(engine, runs), DuckDBLedger(engine, growth),
        DuckDBHealth(engine), engine.unit, engine.close,
    )  # fmt: skip
    engine.join(growth)  # after the runs and the ledger, which stage into it
    return metadata


def _duckdb_points(url: str, engines: _Engines) -> Points:
    from .duckdb import DuckDBPoints
    from .duckdb.export_tables import DuckDBExportTables

    engine = _duckdb_engine(url, engines)
    return Points(DuckDBPoints(engine), DuckDBExportTables(engine), engine.unit, engine.close)


@contextmanager
def _extra(name: str, url: str) -> Iterator[None]:
    """Imports of a backend behind an extra: missing, they say which to install."""
    try:
        yield
    except ImportError as exc:
        raise ImportError(
            f"{url.split('://')[0]}:// needs the {name} extra ({exc.name} is missing):"
            f" pip install 'instantml[{name}]'"
        ) from None


def _postgres_metadata(url: str, engines: _Engines) -> Metadata:
    with _extra("postgres", url):
        from .postgres import PgEngine, PgHealth, PgLedger, PgTenancy
    from .deletion_sql import SqlDeletions
    from .runs_sql import SqlRuns

    engine = PgEngine(url)
    runs = SqlRuns(engine)
    return Metadata(
        PgTenancy(engine), runs, SqlDeletions(engine, runs), PgLedger(engine), PgHealth(engine),
        engine.unit, engine.close,
    )  # fmt: skip


METADATA_BACKENDS: dict[str, Callable[[str, _Engines], Metadata]] = {
    "duckdb": _duckdb_metadata,
    "postgresql": _postgres_metadata,
    "postgres": _postgres_metadata,
}


def _clickhouse_points(url: str, engines: _Engines) -> Points:
    with _extra("clickhouse", url):
        from .clickhouse import ChEngine, ChPoints
        from .clickhouse.export_tables import ChExportTables
    engine = ChEngine(url)
    return Points(ChPoints(engine), ChExportTables(engine), engine.unit, engine.close)


POINT_BACKENDS: dict[str, Callable[[str, _Engines], Points]] = {
    "duckdb": _duckdb_points,
    "clickhouse": _clickhouse_points,  # a ClickHouse server, over its HTTP interface
    "chdb": _clickhouse_points,  # the same engine in this process (one process only)
}


def safe_url(url: str) -> str:
    """The URL without its password (for messages and logs)."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        credentials, host = rest.rsplit("@", 1)
        user = credentials.split(":", 1)[0]
        return f"{scheme}://{user}:***@{host}"
    return url


def _factory(registry: dict[str, Callable[[str, _Engines], Any]], url: str, what: str) -> Any:
    scheme = urlsplit(url).scheme
    factory = registry.get(scheme)
    if factory is None:
        known = ", ".join(f"{name}://" for name in sorted(registry))
        raise ValueError(f"{what} URL {url!r}: unknown scheme {scheme!r} (known: {known})")
    return factory


def open_stores(metadata_url: str, points_url: str | None = None) -> Stores:
    """Open the stores two URLs name (``points_url`` defaults to ``metadata_url``). Two
    DuckDB URLs naming the same file share one engine, so a unit of work is one
    transaction over all four stores."""
    engines: _Engines = {}
    points_url = points_url or metadata_url
    metadata: Metadata = _factory(METADATA_BACKENDS, metadata_url, "metadata")(
        metadata_url, engines
    )
    points: Points = _factory(POINT_BACKENDS, points_url, "points")(points_url, engines)
    shared = points.unit == metadata.unit  # one DuckDB file: one transaction
    unit = metadata.unit if shared else _nested(metadata.unit, points.unit)

    def close() -> None:
        points.close()
        metadata.close()

    def checkpoint_due() -> bool:
        return any(engine.checkpoint_due() for engine in engines.values())

    def checkpoint() -> None:
        for engine in engines.values():
            if engine.checkpoint_due():
                engine.checkpoint()

    return Stores(
        metadata.tenancy, metadata.runs, metadata.deletions, metadata.ledger, points.points,
        points.export, unit, close, metadata.health, checkpoint_due, checkpoint,
    )  # fmt: skip


def _nested(
    outer: Callable[[], AbstractContextManager[None]],
    inner: Callable[[], AbstractContextManager[None]],
) -> Callable[[], AbstractContextManager[None]]:
    """A unit over two stores: the points (inner) commit first, then the metadata. Points
    are idempotent by data, so a metadata commit that fails after them leaves nothing a
    retry of the same request would not write again."""

    @contextmanager
    def unit() -> Iterator[None]:
        with ExitStack() as stack:
            stack.enter_context(outer())
            stack.enter_context(inner())
            yield

    return unit


__all__ = ["METADATA_BACKENDS", "POINT_BACKENDS", "Stores", "open_stores", "safe_url"]
