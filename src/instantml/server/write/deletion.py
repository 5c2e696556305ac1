"""Deleting runs on the writer thread: a run's metadata in one unit, then its points in
bounded units (``PURGE_ROWS`` rows each) between write groups, so a large run's deletion
never holds ingest up for longer than one such unit; and retention, which deletes the
runs past their project's days the same way.

A write that arrives after a run's deletion finds no run (404, as any unknown run); one
that a unit had resolved just before is refused by that unit (``runs_sql``'s check that
its runs still exist) and answered 503, and its retry gets the 404.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ...storage.protocols import Stores

log = logging.getLogger(__name__)

PURGE_ROWS = 200_000  # rows removed per unit of a deleted run's purge
PURGE_SERIES = 64  # series purged together in one unit
# Runs past their retention deleted per look: a look between write groups holds them up
# for at most this many small units (more due: looked at again at once).
EXPIRED_PER_CHECK = 10
FIRST_CHECK_SECONDS = 60.0
RETRY_SECONDS = 1.0  # a purge that failed in storage is tried again after this


class Deleter:
    def __init__(self, stores: Stores, retention_days: int | None, check_seconds: float) -> None:
        self.stores = stores
        self.retention_days = retention_days
        self.check_seconds = check_seconds
        # The first look a little after start, once the server is taking writes.
        self._next_check = time.monotonic() + min(check_seconds, FIRST_CHECK_SECONDS)
        self.pending = True  # a purge may be left from before a restart: look once
        # Told each run deleted (org id, run id): the health monitor forgets it.
        self.on_deleted: Callable[[int, str], None] | None = None
        self._retry_at = float("-inf")

    def delete_run(self, org_id: int, run_id: str) -> bool:
        """The run's metadata out (its points queued); False when there is no such run."""
        with self.stores.unit():
            series = self.stores.deletions.delete_run(org_id, run_id)
            if series:
                self.stores.points.forget(series)
        if series is None:
            return False
        self.pending = True
        if self.on_deleted is not None:
            self.on_deleted(org_id, run_id)
        return True

    def purge(self) -> bool:
        """One bounded unit of removing deleted runs' points; True while more remains (a
        storage failure is logged and tried again a second later)."""
        if time.monotonic() < self._retry_at:
            return True
        try:
            series = self.stores.deletions.purges(PURGE_SERIES)
            if not series:
                self.pending = False
                return False
            with self.stores.unit():
                if not self.stores.points.purge(series, PURGE_ROWS):
                    self.stores.deletions.purged(series)
        except Exception:
            log.exception("removing deleted runs' points")
            self._retry_at = time.monotonic() + RETRY_SECONDS
        return True

    def seconds_to_check(self) -> float:
        """How long until retention is next looked at."""
        return max(0.0, self._next_check - time.monotonic())

    def expire(self) -> None:
        """At most every ``check_seconds``: delete the runs past their retention."""
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + self.check_seconds
        expired: list[tuple[int, str]] = []
        try:
            expired = self.stores.deletions.expired(
                time.time(), self.retention_days, EXPIRED_PER_CHECK
            )
            for org_id, run_id in expired:
                self.delete_run(org_id, run_id)
                log.info("deleted run %s of org %s: past its retention", run_id, org_id)
        except Exception:  # housekeeping: said, retried at the next check
            log.exception("deleting runs past their retention")
        if len(expired) == EXPIRED_PER_CHECK:
            self._next_check = now  # more are due: look again when next idle
