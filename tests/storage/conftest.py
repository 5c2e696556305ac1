"""The storage conformance suite's fixtures: every test here runs against every backend.

A backend is a pair of store URLs; ``open_stores`` builds a (reopenable) set of stores for
a test. Only the embedded DuckDB backend exists today; a scale-out backend joins by adding
its URLs to BACKENDS (behind a marker when it needs services CI starts)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from instantml.storage import open_stores as _open
from instantml.storage.protocols import Stores
from tests.postgres import Cluster


def _duckdb(root: Path) -> tuple[str, str]:
    url = f"duckdb://{root / 'stores.duckdb'}"
    return url, url


def _duckdb_split(root: Path) -> tuple[str, str]:
    # Metadata and points in two files: two engines, a unit over both (points commit first).
    return f"duckdb://{root / 'meta.duckdb'}", f"duckdb://{root / 'points.duckdb'}"


def _postgres_duckdb(root: Path) -> tuple[str, str]:
    # Metadata on PostgreSQL (one fresh database per call), points in DuckDB.
    return _postgres().new_database(), f"duckdb://{root / 'points.duckdb'}"


_cluster: list[Cluster] = []


def _postgres() -> Cluster:
    if not _cluster:
        try:
            _cluster.append(Cluster())
        except (FileNotFoundError, subprocess.CalledProcessError) as exc:
            pytest.skip(f"no PostgreSQL here ({exc}); scripts/test.sh installs it")
    return _cluster[0]


@pytest.fixture(scope="session", autouse=True)
def _stop_postgres() -> Iterator[None]:
    yield
    for cluster in _cluster:
        cluster.stop()


def _postgres_chdb(root: Path) -> tuple[str, str]:
    # The scale-out pair: metadata on PostgreSQL, points in ClickHouse's engine (chdb).
    return _postgres().new_database(), f"chdb://{root / 'points-ch'}"


BACKENDS: dict[str, Callable[[Path], tuple[str, str]]] = {
    "duckdb": _duckdb,
    "duckdb-split": _duckdb_split,
    "postgres+duckdb": _postgres_duckdb,
    "postgres+chdb": _postgres_chdb,
}

OpenStores = Callable[[], Stores]


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def open_stores(backend: str, tmp_path: Path) -> Iterator[OpenStores]:
    """Open (or reopen: the same files) this test's stores; all closed at the end."""
    opened: list[Stores] = []
    metadata_url, points_url = BACKENDS[backend](tmp_path)

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
