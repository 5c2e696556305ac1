"""Storage backends behind one interface, chosen by URL scheme.

``duckdb:///path/to/file.duckdb`` (the embedded default) or ``duckdb://:memory:``.
PostgreSQL + ClickHouse register here when they exist; routes never know which it is.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

from .base import Store
from .usage import UsagePolicy


def _open_duckdb(url: str, usage: UsagePolicy) -> Store:
    from .duckdb_store import DuckDBStore

    path = url.split("://", 1)[1]
    return DuckDBStore(path or ":memory:", usage)


BACKENDS: dict[str, Callable[[str, UsagePolicy], Store]] = {"duckdb": _open_duckdb}


def open_store(url: str, usage: UsagePolicy | None = None) -> Store:
    """Open the store a URL names, e.g. ``duckdb:///var/lib/instantml/points.duckdb``;
    ``usage`` is the monthly guardrail's policy (default: unlimited)."""
    scheme = urlsplit(url).scheme
    factory = BACKENDS.get(scheme)
    if factory is None:
        known = ", ".join(f"{name}://" for name in sorted(BACKENDS))
        raise ValueError(f"storage URL {url!r}: unknown scheme {scheme!r} (known: {known})")
    return factory(url, usage or UsagePolicy())


__all__ = ["BACKENDS", "Store", "UsagePolicy", "open_store"]
