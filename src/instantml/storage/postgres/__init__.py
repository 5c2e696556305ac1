"""The metadata stores on PostgreSQL (``postgresql://user:pass@host:port/db``), shared by
any number of server processes: tenancy, the ledger and health (runs are
``storage/runs_sql.py``, shared with DuckDB). Needs the ``postgres`` extra (psycopg 3 and
its pool)."""

from __future__ import annotations

from .engine import PgEngine
from .health import PgHealth
from .ledger import PgLedger
from .tenancy import PgTenancy

__all__ = ["PgEngine", "PgHealth", "PgLedger", "PgTenancy"]
