"""The stores, by concern: what each keeps, and nothing about HTTP or the product's rules.

The write service (``server/write/group.py``) holds the rules: it reads and writes through
these, inside one unit of work (``Stores.unit``): a transaction on the embedded store, the
metadata database's transaction on a scale-out one (where points are written
idempotently, so a unit that fails after them is safe to retry).

Methods marked *in a unit* must be called inside ``with stores.unit():``; reads may be
called from any thread at any time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .records import (
    AlertRecord,
    ApiKeyRecord,
    Delivery,
    Keys,
    RankActivity,
    RunRecord,
    RunRef,
    RunSpec,
    ScalarPoint,
    Slot,
    StoredAnswer,
    WebhookRecord,
)

if TYPE_CHECKING:
    from ..rankmath.params import SummaryParams
    from ..rankmath.rows import SummaryRows
    from .export import ExportTables
    from .querier import Reading


class Tenancy(Protocol):
    """Orgs, API keys (stored as hashes) and each org's monthly-limit override."""

    def ensure_org(self, name: str) -> tuple[int, bool]:
        """The org's id, and whether it was created now."""
        ...

    def org_id(self, name: str) -> int | None: ...

    def org_name(self, org_id: int) -> str | None: ...

    def add_api_key(
        self, org_id: int, key_id: str, key_hash: str, scopes: frozenset[str]
    ) -> None: ...

    def add_first_api_key(
        self, org_id: int, key_id: str, key_hash: str, scopes: frozenset[str]
    ) -> bool:
        """Add the key only if the store has no key at all: when several server processes
        start on an empty store, exactly one wins (True)."""
        ...

    def find_api_key(self, key_id: str) -> ApiKeyRecord | None:
        """The key with this id, revoked or not (``revoked`` says); None if there is none."""
        ...

    def count_api_keys(self) -> int: ...

    def list_api_keys(self, org_id: int | None) -> list[dict[str, Any]]: ...

    def revoke_api_key(self, key_id: str, org_id: int | None) -> bool:
        """Revoke a live key (of ``org_id``, unless None); False when there is none."""
        ...

    def monthly_limit(self, org_id: int) -> int | None:
        """The org's own limit; None: the server's default applies."""
        ...

    def set_monthly_limit(self, org_id: int, limit: int | None) -> None: ...


class Runs(Protocol):
    """Runs, their series (run, kind, key) and what the run pages show of them."""

    def get_run(self, org_id: int, run_id: str) -> RunRecord | None: ...

    def list_runs(self, org_id: int, project: str | None, limit: int) -> list[RunRecord]: ...

    def series(self, org_id: int, run_id: str) -> list[tuple[int, int, str]] | None:
        """``(series_id, kind, key)`` of every series of the run; None if no such run."""
        ...

    def series_id(self, org_id: int, run_id: str, kind: int, key: str) -> int | None: ...

    def resolve(self, org_id: int, run_ids: Iterable[str]) -> dict[str, RunRef | None]:
        """*In a unit*: the runs these ids name (None: unknown), runs created earlier in
        the unit included."""
        ...

    def create(self, spec: RunSpec) -> tuple[RunRecord, bool]:
        """*In a unit*: create the run, or attach to it when its id exists in the same
        project: ``(record, created)``. Raises RunConflict for another project."""
        ...

    def set_status(self, run: RunRef, status: str) -> RunRecord:
        """*In a unit*."""
        ...

    def add_attributes(self, run: RunRef, attributes: list[dict[str, Any]], ts: float) -> None:
        """*In a unit*: free-form attributes (config, tags, notes, console lines)."""
        ...

    def attributes_of(
        self, org_id: int, run_id: str, kinds: Sequence[str], prefix: str
    ) -> list[tuple[str, str, int | None, Any]]:
        """The run's attributes of these types under a path prefix, in the order written:
        ``(type, path, step, value)``."""
        ...

    def series_ids(self, run: RunRef, kind: int, keys: Sequence[str]) -> list[int]:
        """*In a unit*: the series of these keys, created as needed."""
        ...

    def extend(self, extents: Mapping[int, tuple[int, int]]) -> None:
        """*In a unit*: raise runs' (world size, last step) to at least these, by run seq."""
        ...

    def count_points(self, points: Mapping[int, int]) -> None:
        """*In a unit*: add to runs' (by seq) count of metric points charged to them."""
        ...

    def saw_ranks(
        self,
        ranks: Mapping[int, Iterable[int]],
        at: float,
        nodes: Mapping[int, Mapping[int, str]] | None = None,
    ) -> None:
        """*In a unit*: these ranks (by run seq) sent rank points at ``at``."""
        ...

    def finish_rank(self, run: RunRef, rank: int, at: float) -> None:
        """*In a unit*: the rank finished the run at ``at``."""
        ...

    def rank_activity(self, org_id: int, run_id: str) -> dict[int, RankActivity]:
        """What each rank of the run sent, by rank (ranks that sent nothing absent)."""
        ...


class Deletions(Protocol):
    """Deleting runs (their metadata at once, their points queued for ``PointStore.purge``)
    and projects' retention (``deletion_sql.py``)."""

    def delete_run(self, org_id: int, run_id: str) -> list[int] | None:
        """*In a unit*: the run's metadata gone, its series ids (returned) queued for
        purging; None when there is no such run."""
        ...

    def purges(self, limit: int) -> list[int]:
        """Series whose points are still to be removed, oldest deletion first."""
        ...

    def purged(self, series_ids: Sequence[int]) -> None:
        """*In a unit*: these series' points are gone."""
        ...

    def set_retention(self, org_id: int, project: str, days: int | None) -> None:
        """*In a unit*: the project's runs deleted ``days`` after their last write (None:
        kept for ever)."""
        ...

    def retention(self, org_id: int, project: str) -> tuple[bool, int | None]:
        """(whether the project has its own setting, its days)."""
        ...

    def expired(self, now: float, default_days: float | None, limit: int) -> list[tuple[int, str]]:
        """Runs past their retention, least recently written first."""
        ...


class Ledger(Protocol):
    """What every server process must agree on about writes: Idempotency-Key claims and
    answers, and the metric points each org used per month."""

    # Whether claims are rows in a database that every server process shares: each claim
    # and release is then a round trip, which the server makes off its event loop.
    shared_claims: bool

    def claim(self, slots: set[Slot], owner: int) -> set[Slot]:
        """Claim keys whose first request is being applied now, for ``owner`` (one request's
        token); returns those already claimed (their repeats are refused as in flight),
        claiming the rest."""
        ...

    def release(self, owner: int) -> None:
        """Free every key claimed for ``owner`` (none lapsed and claimed since by another)."""
        ...

    def lookup(self, keys: Keys) -> dict[Slot, StoredAnswer]:
        """Stored answers of the keys that have one."""
        ...

    def record(
        self,
        keys: Keys,
        fingerprint: np.ndarray,
        status: np.ndarray,
        body: Sequence[str],
        created_at: float,
    ) -> None:
        """*In a unit*: keep these answers (columns), stamped ``created_at`` (pruning)."""
        ...

    def used(self, org_id: int, month: str) -> int:
        """Metric points charged to the org in the month (``YYYY-MM``), this unit's
        charges included."""
        ...

    def charge(self, org_id: int, month: str, points: int, limit: int | None) -> bool:
        """*In a unit*: charge ``points`` unless that would take the month past ``limit``
        (None: no limit); False (nothing charged) when it would. Concurrent charges never
        overshoot."""
        ...

    def prune(self, before: float) -> None:
        """Forget answers (and ordered-upload marks) recorded before this time."""
        ...

    def mark_batch(self, org_id: int, session: str, seq: int, clean: bool) -> None:
        """Batch ``seq`` of an ordered upload (``/api/ingest`` with ``Instantml-Upload``)
        has completed; ``clean``: every event of it got a final answer. The first mark of a
        batch stands. Not in a unit: the mark is seen at once by every process."""
        ...

    def batch_marks(self, org_id: int, session: str, seqs: Sequence[int]) -> dict[int, bool]:
        """The marks of these batches of the session that have one: ``seq -> clean``."""
        ...


class PointStore(Protocol):
    """Metric points and their per-step aggregates; summary reads."""

    def write_rank(self, series_id: int, columns: dict[str, np.ndarray]) -> None:
        """*In a unit*: rank points of one series (``records.RANK_COLUMNS``). A point is
        (series, step, rank): writing it again replaces it, the highest ``seq`` winning."""
        ...

    def write_scalars(self, points: list[ScalarPoint]) -> None:
        """*In a unit*: scalar points; (series, step) again replaces."""
        ...

    def counts(self, series_ids: Sequence[int]) -> dict[int, tuple[int, int | float | None]]:
        """``series_id -> (points, last step)``."""
        ...

    def needs_refresh(self, series_id: int) -> bool:
        """Whether a summary should have the writer bring the series' aggregates up to
        date first: they are behind its points in a way the read does not make up for
        itself (a store may read a few stale blocks' points instead)."""
        ...

    def refresh(self, series_id: int) -> None:
        """*In a unit*: bring the series' aggregates up to date."""
        ...

    def maintain(self) -> bool:
        """*In a unit*: one bounded unit of background work; True if more remains."""
        ...

    def backlog(self) -> int:
        """How much background work waits (steps whose aggregates are behind)."""
        ...

    def forget(self, series_ids: Sequence[int]) -> None:
        """*In a unit*: these series are deleted; no background work for them any more."""
        ...

    def purge(self, series_ids: Sequence[int], budget: int) -> bool:
        """*In a unit*: remove up to about ``budget`` rows of these series (points,
        aggregates, blocks); True while rows remain."""
        ...

    def summary_reading(self, series_id: int, params: SummaryParams) -> Reading:
        """The read of the rows a Distributed summary of the series is assembled from: a
        generator (``storage.querier``) that yields before each of its larger reads, for
        its driver to let other work go first, and returns the rows."""
        ...

    def summary_rows(self, series_id: int, params: SummaryParams) -> SummaryRows:
        """The same rows, read straight through."""
        ...

    def window_medians(
        self, series_id: int, window: int, step_max: int | None = None
    ) -> tuple[tuple[int, int] | None, dict[int, tuple[float, int]]]:
        """Over the series' last ``window`` steps (up to ``step_max``): their (first, last)
        step (None when the series has none), and per rank the median of its finite values
        and how many steps it reported."""
        ...

    def window_points(self, series_id: int, steps: int) -> dict[str, np.ndarray]:
        """The series' points over its last ``steps`` steps: columns ``step``, ``rank``,
        ``value``, ``weight``, ``world_size``, ``ts`` (one row per (step, rank))."""
        ...

    def next_step(self, series_id: int, after: int | None) -> int | None:
        """The series' first step after ``after`` at which any rank reported (its first
        step when None); None when there is none."""
        ...

    def last_steps_of(
        self, series_id: int, ranks: list[int], before: int | None = None
    ) -> dict[int, int]:
        """Each of these ranks' last step in the series, before ``before`` when given
        (ranks with none absent)."""
        ...

    def first_nonfinite(
        self, series_id: int, lo: int = 0, hi: int = 2**63 - 1
    ) -> dict[int, tuple[int, float]]:
        """Per rank with a non-finite value in the series (in steps ``lo``-``hi``): its
        first such step and value."""
        ...


class HealthStore(Protocol):
    """Run-health alerts, webhooks and the webhook outbox (``health_sql.py``): written in
    transactions of their own, never in a write's unit."""

    def alerts(self, org_id: int, run_id: str, open_only: bool = False) -> list[AlertRecord]:
        """The run's alerts, oldest first."""
        ...

    def open_kinds(self, org_id: int, run_ids: Sequence[str]) -> dict[str, list[str]]:
        """Per run, the kinds of its open alerts."""
        ...

    def change(
        self,
        opened: Sequence[AlertRecord],
        resolved: Sequence[str],
        resolved_at: float,
        body: Callable[[AlertRecord], dict[str, Any]],
        moved: Sequence[AlertRecord] = (),
    ) -> list[AlertRecord]:
        """Open alerts (each unless one of its identity is open; returns those opened),
        resolve others (by id), and queue the opened ones' webhook deliveries: one
        transaction."""
        ...

    def add_webhook(self, hook: WebhookRecord) -> None: ...

    def webhooks(self, org_id: int) -> list[WebhookRecord]: ...

    def delete_webhook(self, org_id: int, webhook_id: str) -> bool: ...

    def due(self, now: float, limit: int, lease: float) -> list[Delivery]:
        """Deliveries due now, claimed for ``lease`` seconds."""
        ...

    def delivered(self, delivery_id: str, at: float) -> None: ...

    def failed(self, delivery: Delivery, at: float, error: str) -> None:
        """A failed attempt: retried later with backoff, or given up."""
        ...


@dataclass(frozen=True)
class Stores:
    """The four stores a server works with, and one unit of work across them.
    ``checkpoint_due`` / ``checkpoint``: an embedded engine's write-ahead log has grown
    enough to move into its file / do so (the writer's idle work; never due for the
    server-backed stores)."""

    tenancy: Tenancy
    runs: Runs
    deletions: Deletions
    ledger: Ledger
    points: PointStore
    export: ExportTables  # a series' points out as Arrow tables (``export.py``)
    unit: Callable[[], AbstractContextManager[None]]
    close: Callable[[], None]
    health: HealthStore
    checkpoint_due: Callable[[], bool] = lambda: False
    checkpoint: Callable[[], None] = lambda: None
