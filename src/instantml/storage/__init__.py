"""Storage backends behind one interface, chosen by URL scheme.

``duckdb:///path/to/file.duckdb`` (the embedded default) or ``duckdb://:memory:``.
PostgreSQL + ClickHouse register here when they exist; routes never know which it is.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

from .base import Store


def _open_duckdb(url: str) -> Store:
    from .duckdb_store import DuckDBStore

    path = url.split("://", 1)[1]
    return DuckDBStore(path or ":memory:")


BACKENDS: dict[str, Callable[[str], Store]] = {"duckdb": _open_duckdb}


def open_store(url: str) -> Store:
    """Open the store a URL names, e.g. ``duckdb:///var/lib/instantml/points.duckdb``."""
    scheme = urlsplit(url).scheme
    factory = BACKENDS.get(scheme)
    if factory is None:
        known = ", ".join(f"{name}://" for name in sorted(BACKENDS))
        raise ValueError(f"storage URL {url!r}: unknown scheme {scheme!r} (known: {known})")
    return factory(url)


__all__ = ["BACKENDS", "Store", "open_store"]
