"""What the SQL written once for DuckDB and PostgreSQL runs through.

``tenancy_sql``, ``health_sql`` and the migrations runner write their statements with
``%s`` placeholders against an ``Execute``: each engine supplies one that runs a statement
(translating the placeholders where it must) and returns its rows. ``runs_sql`` and
``deletion_sql`` take a ``SqlEngine``: reads, a unit's statements, and its participants.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from .unit import Participant

Execute = Callable[[str, Sequence[Any]], list[tuple[Any, ...]]]


class SqlEngine(Protocol):
    def read(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        """Committed data (outside a unit), or what this thread's unit sees."""

    def execute(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        """A statement of this thread's unit, on its connection."""

    def changed(self, sql: str, params: Sequence[Any]) -> int:
        """A statement of this thread's unit that changes rows (an UPDATE, a DELETE), on
        its connection: how many it changed."""

    def storable(self, *texts: str | None) -> bool:
        """Whether the engine can hold these texts at all (else no row has them)."""

    @property
    def in_unit(self) -> bool: ...

    def join(self, participant: Participant) -> None: ...

    def staged(self, participant: Participant) -> Any: ...
