"""The unit of work, once for every engine.

A store that writes within units is a *participant*: it stages what a unit asks of it
(``begin`` makes a fresh staging object; its write methods add to the one
:meth:`Units.staged` gives back), writes it all at the end (``flush``, inside the engine's
transaction), and learns what was committed only after the commit (``committed``): a
unit cut short leaves no trace in any participant's memory, its staging is dropped.

Units are per thread; a unit inside a unit joins the outer one. What a transaction is
comes from the engine: DuckDB's one writing connection (one unit at a time, process
wide), a PostgreSQL connection from the pool (a unit per thread at once), or nothing
(ClickHouse: every write idempotent by data, so a unit cut short is completed by its
retry).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol


class Participant(Protocol):
    def begin(self) -> Any: ...

    def flush(self, staged: Any) -> None: ...

    def committed(self, staged: Any) -> None: ...


class Units:
    def __init__(self, transaction: Callable[[], AbstractContextManager[Any]]) -> None:
        """``transaction``: the engine's, entered around a unit's staging and flush."""
        self._transaction = transaction
        self._participants: list[Participant] = []
        self._local = threading.local()

    def join(self, participant: Participant) -> None:
        """Take part in every unit from now on (flushed in the order joined)."""
        self._participants.append(participant)

    @property
    def in_unit(self) -> bool:
        """Whether this thread is inside a unit (its reads may see the unit's writes)."""
        return getattr(self._local, "staged", None) is not None

    def staged(self, participant: Participant) -> Any:
        """What ``participant`` staged in this thread's unit (outside one: a fresh, empty
        staging, so reads see committed data only)."""
        staged = getattr(self._local, "staged", None)
        return participant.begin() if staged is None else staged[id(participant)]

    @contextmanager
    def unit(self) -> Iterator[None]:
        if self.in_unit:
            yield
            return
        with self._transaction():
            staged = {id(p): p.begin() for p in self._participants}
            self._local.staged = staged
            try:
                yield
                for participant in self._participants:
                    participant.flush(staged[id(participant)])
            finally:
                self._local.staged = None
        for participant in self._participants:  # only a committed unit teaches caches
            participant.committed(staged[id(participant)])
