"""The storage conformance suite's fixtures: every test here runs against every backend.

A backend is a pair of store URLs; ``open_stores`` builds a (reopenable) set of stores for
a test. Only the embedded DuckDB backend exists today; a scale-out backend joins by adding
its URLs to BACKENDS (behind a marker when it needs services CI starts)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from instantml.storage import open_stores as _open
from instantml.storage.protocols import Stores


def _duckdb(root: Path) -> tuple[str, str]:
    url = f"duckdb://{root / 'stores.duckdb'}"
    return url, url


def _duckdb_split(root: Path) -> tuple[str, str]:
    # Metadata and points in two files: two engines, a unit over both (points commit first).
    return f"duckdb://{root / 'meta.duckdb'}", f"duckdb://{root / 'points.duckdb'}"


BACKENDS: dict[str, Callable[[Path], tuple[str, str]]] = {
    "duckdb": _duckdb,
    "duckdb-split": _duckdb_split,
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
