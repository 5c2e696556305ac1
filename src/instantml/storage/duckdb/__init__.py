"""The embedded backend: one DuckDB file (by default) holds every store, so a unit of work
is one transaction over a write, its Idempotency-Key answer and its usage charge.

Each concern is its own module (``tenancy``, ``ledger``, ``points``, ``health``, with
``engine`` beneath them, ``schema`` its metadata tables by version; runs are
``storage/runs_sql.py``, shared with PostgreSQL); what each keeps in process memory, and why that is safe only
while one process owns the file, is listed in docs/architecture.md.
"""

from __future__ import annotations

from .engine import Engine
from .health import DuckDBHealth
from .ledger import DuckDBLedger
from .points import DuckDBPoints
from .schema import migrate_metadata
from .tenancy import DuckDBTenancy


def engine_path(url: str) -> str:
    """``duckdb:///abs/path.duckdb``, ``duckdb://rel/path.duckdb`` or ``duckdb://:memory:``."""
    return url.split("://", 1)[1] or ":memory:"


__all__ = [
    "DuckDBHealth",
    "DuckDBLedger",
    "DuckDBPoints",
    "DuckDBTenancy",
    "Engine",
    "engine_path",
    "migrate_metadata",
]
