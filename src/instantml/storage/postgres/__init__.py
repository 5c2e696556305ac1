"""The metadata stores on PostgreSQL (``postgresql://user:pass@host:port/db``): tenancy,
runs and the ledger, shared by any number of server processes. Needs the ``postgres``
extra (psycopg 3 and its pool)."""

from __future__ import annotations

from .engine import PgEngine
from .health import PgHealth
from .ledger import PgLedger
from .runs import PgRuns
from .tenancy import PgTenancy

__all__ = ["PgEngine", "PgHealth", "PgLedger", "PgRuns", "PgTenancy"]
