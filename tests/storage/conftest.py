"""The storage conformance suite's fixtures: every test here runs against every backend.

A backend is a pair of store URLs; ``open_stores`` builds a (reopenable) set of stores for
a test: the embedded DuckDB (one file, or two), and PostgreSQL for metadata (a throwaway
cluster, skipped where PostgreSQL is not installed) with DuckDB or ClickHouse for points:
its engine in process (chdb) or over its HTTP interface (tests/clickhouse_http.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from instantml.storage import open_stores as _open
from instantml.storage.protocols import Stores
from tests.engines import Engines


def _duckdb(engines: Engines, root: Path) -> tuple[str, str]:
    url = f"duckdb://{root / 'stores.duckdb'}"
    return url, url


def _duckdb_split(engines: Engines, root: Path) -> tuple[str, str]:
    # Metadata and points in two files: two engines, a unit over both (points commit first).
    return f"duckdb://{root / 'meta.duckdb'}", f"duckdb://{root / 'points.duckdb'}"


def _postgres_duckdb(engines: Engines, root: Path) -> tuple[str, str]:
    # Metadata on PostgreSQL (one fresh database per call), points in DuckDB.
    return engines.postgres().new_database(), f"duckdb://{root / 'points.duckdb'}"


def _postgres_chdb(engines: Engines, root: Path) -> tuple[str, str]:
    # The scale-out pair: metadata on PostgreSQL, points in ClickHouse's engine (chdb).
    return engines.postgres().new_database(), f"chdb://{root / 'points-ch'}"


def _postgres_clickhouse(engines: Engines, root: Path) -> tuple[str, str]:
    # The same, with points reached over ClickHouse's HTTP interface (clickhouse://).
    return engines.postgres().new_database(), engines.clickhouse().url()


BACKENDS: dict[str, Callable[[Engines, Path], tuple[str, str]]] = {
    "duckdb": _duckdb,
    "duckdb-split": _duckdb_split,
    "postgres+duckdb": _postgres_duckdb,
    "postgres+chdb": _postgres_chdb,
    "postgres+clickhouse": _postgres_clickhouse,
}

OpenStores = Callable[[], Stores]

# Runs the same SQL as postgres+chdb: over HTTP only the transport is new, so the
# property-based tests draw fewer examples there (each statement is a round trip).
TRANSPORT_ONLY = {"postgres+clickhouse"}


def examples(backend: str, n: int) -> settings:
    """Hypothesis settings for a property-based test of ``n`` examples on ``backend``."""
    return settings(
        max_examples=min(n, 6) if backend in TRANSPORT_ONLY else n,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture],
    )


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store_urls(backend: str, engines: Engines, tmp_path: Path) -> tuple[str, str]:
    """This test's (metadata, points) URLs, for a process of its own to open."""
    return BACKENDS[backend](engines, tmp_path)


@pytest.fixture
def open_stores(store_urls: tuple[str, str]) -> Iterator[OpenStores]:
    """Open (or reopen: the same files) this test's stores; all closed at the end."""
    opened: list[Stores] = []
    metadata_url, points_url = store_urls

    def open_() -> Stores:
        stores = _open(metadata_url, points_url)
        opened.append(stores)
        return stores

    yield open_
    for stores in opened:
        stores.close()


@pytest.fixture
def stores(open_stores: OpenStores) -> Stores:
    return open_stores()
