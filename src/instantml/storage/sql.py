"""What the SQL written once for DuckDB and PostgreSQL runs through.

``tenancy_sql``, ``runs_sql``, ``health_sql`` and the migrations runner write their
statements with ``%s`` placeholders against an ``Execute``: each engine supplies one that
runs a statement (translating the placeholders where it must) and returns its rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Execute = Callable[[str, Sequence[Any]], list[tuple[Any, ...]]]
