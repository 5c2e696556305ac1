"""The point store on ClickHouse (``clickhouse://[user:pass@]host:port/db`` over HTTP, or
``chdb://DIR`` in-process): insert-only, versioned rows. Needs the ``clickhouse`` extra."""

from __future__ import annotations

from .engine import ChEngine
from .points import ChPoints

__all__ = ["ChEngine", "ChPoints"]
