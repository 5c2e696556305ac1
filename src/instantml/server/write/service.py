"""The write service: applies a group of writes in one unit of work (``group.py`` decides
each), and runs the writer's background work: checkpoints, summary aggregates,
compaction asked for by a read, and the pruning of expired Idempotency-Keys."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from ...storage.protocols import Stores
from ...storage.records import StorageError
from . import answers
from .answers import Answer
from .commands import Envelope
from .group import Group
from .guardrail import UsagePolicy

log = logging.getLogger(__name__)

# Idempotency-Keys are remembered at least 7 days (the contract); a day's margin on top.
IDEMPOTENCY_RETENTION = 8 * 86400.0
_PRUNE_EVERY = 3600.0
MAINTAIN_BACKOFF = 1.0  # seconds between tries of the aggregates' refresh while storage fails


class WriteService:
    def __init__(self, stores: Stores, policy: UsagePolicy | None = None) -> None:
        self.stores = stores
        self.policy = policy or UsagePolicy()
        self._last_prune = float("-inf")
        self._maintain_after = float("-inf")
        # Told, after each committed unit, the (org, run id) of the runs it wrote rank
        # points to, and of those given a non-finite value (the run-health monitor).
        self.on_points: Callable[[set[tuple[int, str]], set[tuple[int, str]]], None] | None = None

    def apply(self, envelopes: list[Envelope]) -> list[Answer]:
        """Apply in order in one unit of work; one answer per envelope (a RankEvents
        envelope's answer holds one per event in ``each``). A group that fails in storage
        is applied write by write, so the others still land; one that fails alone
        answers 503."""
        try:
            with self.stores.unit():
                group = Group(self.stores, self.policy, envelopes)
                result = group.apply()
        except Exception:
            if len(envelopes) == 1:
                raise
            return [self._apply_alone(envelope) for envelope in envelopes]
        if group.touched and self.on_points is not None:
            self.on_points(group.touched, group.points.nonfinite)
        self._prune()
        return result

    def _apply_alone(self, envelope: Envelope) -> Answer:
        try:
            return self.apply([envelope])[0]
        except Exception as exc:  # a storage failure, not bad input: the client may retry
            log.exception("storage error applying %s", type(envelope.write).__name__)
            return answers.storage_failed(exc)

    def maintain(self) -> bool:
        """One bounded unit of background work (a checkpoint of the embedded engine when
        its log is due one, else summary aggregates); True if more remains. A failure is
        logged, never raised: the writer thread must go on."""
        if time.monotonic() < self._maintain_after:
            return False
        try:
            if self.stores.checkpoint_due():
                self.stores.checkpoint()
                return True
            with self.stores.unit():
                return self.stores.points.maintain()
        except StorageError as exc:  # an engine away for now: said in one line, retried later
            log.warning("background work (again in %g s): %s", MAINTAIN_BACKOFF, exc)
            self._maintain_after = time.monotonic() + MAINTAIN_BACKOFF
            return False
        except Exception:
            log.exception("background work (a checkpoint or summary aggregates)")
            return False

    def compact(self, series_ids: Iterable[int]) -> None:
        """Bring these series' summary aggregates up to date with every committed point,
        in one unit of their own (compaction: no write, no ledger, no usage). A failure is
        logged, never raised: the reads that asked for it answer from what is there."""
        try:
            with self.stores.unit():
                for sid in sorted(set(series_ids)):
                    self.stores.points.refresh(sid)
        except Exception:
            log.exception("compacting series %s", sorted(set(series_ids)))

    def backlog(self) -> int:
        return self.stores.points.backlog() + int(self.stores.checkpoint_due())

    def _prune(self) -> None:
        """At most hourly, forget Idempotency-Keys older than the retention."""
        now = self.policy.clock()
        if now - self._last_prune >= _PRUNE_EVERY:
            self._last_prune = now
            try:
                self.stores.ledger.prune(now - IDEMPOTENCY_RETENTION)
            except Exception:  # housekeeping after a committed write: never fails it
                log.exception("pruning expired Idempotency-Keys")
