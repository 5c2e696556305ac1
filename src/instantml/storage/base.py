"""The narrow interface every storage backend implements, and the writes it applies.

Writes are plain records, already validated by the server. A backend applies a list of
them in one transaction (a group commit) and answers each one on its own, so one write
that is refused (an unknown run, say) does not sink the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..summary import SummaryParams


@dataclass(slots=True)
class CreateRun:
    org_id: int
    run_id: str
    project: str
    name: str | None
    config: dict[str, Any]
    tags: list[str]
    metadata: dict[str, Any]


@dataclass(slots=True)
class PatchRun:
    org_id: int
    run_id: str
    status: str


@dataclass(slots=True)
class WriteScalars:
    org_id: int
    run_id: str
    step: int
    metrics: dict[str, float]
    timestamp: float
    preview: bool = False


@dataclass(slots=True)
class WriteRankPoints:
    org_id: int
    run_id: str
    step: int
    rank: int
    world_size: int
    local_rank: int | None
    weight: float
    metrics: dict[str, float]
    timestamp: float


@dataclass(slots=True)
class RankEvents:
    """Many rank-metrics events of one ``/api/ingest`` batch, in columns: the uploader's
    common case. Each is applied exactly as the ``WriteRankPoints`` of :meth:`envelopes`
    would be, in order, each with its own Idempotency-Key; a backend may take them as a
    whole when nothing needs deciding event by event (no replay, no unknown run, no limit
    in reach) and must otherwise fall back to those envelopes."""

    org_id: int
    run_ids: list[str]
    steps: list[int]
    ranks: list[int]
    world_sizes: list[int]
    local_ranks: list[int]  # -1: not given
    weights: list[float]
    timestamps: list[float]
    metrics: list[dict[str, float]]
    key_hi: list[int]
    key_lo: list[int]
    fingerprints: list[int]

    def __len__(self) -> int:
        return len(self.steps)

    def envelopes(self) -> list[Envelope]:
        return [
            Envelope(
                WriteRankPoints(
                    org_id=self.org_id,
                    run_id=self.run_ids[i],
                    step=self.steps[i],
                    rank=self.ranks[i],
                    world_size=self.world_sizes[i],
                    local_rank=None if self.local_ranks[i] < 0 else self.local_ranks[i],
                    weight=self.weights[i],
                    metrics=self.metrics[i],
                    timestamp=self.timestamps[i],
                ),
                Idempotency(self.key_hi[i], self.key_lo[i], self.fingerprints[i]),
            )
            for i in range(len(self.steps))
        ]


@dataclass(slots=True)
class WriteAttributes:
    """Free-form run attributes (config entries, tags, notes) the public SDK writes."""

    org_id: int
    run_id: str
    attributes: list[dict[str, Any]]
    timestamp: float


@dataclass(slots=True)
class Refresh:
    """Bring a key's summary aggregates up to date with every point committed before it."""

    org_id: int
    run_id: str
    key: str


Write = (
    CreateRun | PatchRun | WriteScalars | WriteRankPoints | RankEvents | WriteAttributes | Refresh
)


@dataclass(slots=True)
class Idempotency:
    """An Idempotency-Key reduced to 128 bits, and a fingerprint of the request it came with."""

    key_hi: int
    key_lo: int
    fingerprint: int


@dataclass(slots=True)
class Envelope:
    write: Write
    idempotency: Idempotency | None = None


@dataclass(slots=True)
class Outcome:
    status: int
    body: dict[str, Any]
    replayed: bool = False
    headers: dict[str, str] | None = None
    each: list[Outcome] | None = None  # a RankEvents write: one answer per event


@dataclass(slots=True)
class ApiKeyRecord:
    key_id: str
    org_id: int
    scopes: frozenset[str]
    key_hash: str
    revoked: bool = False


@dataclass(slots=True)
class RunRecord:
    org_id: int
    run_id: str
    project: str
    name: str | None
    status: str
    config: dict[str, Any]
    tags: list[str]
    metadata: dict[str, Any]
    created_at: float
    updated_at: float
    world_size: int | None = None
    last_step: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.run_id,
            "project": self.project,
            "name": self.name,
            "status": self.status,
            "config": self.config,
            "tags": self.tags,
            "metadata": self.metadata,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "world_size": self.world_size,
            "last_step": self.last_step,
        }


@dataclass(slots=True)
class SeriesKey:
    key: str
    kind: str  # "rank" or "scalar"
    points: int = 0
    last_step: int | None = None


class Store(Protocol):
    """Metadata and metric points. One instance per server process; thread-safe reads."""

    def apply(self, envelopes: list[Envelope]) -> list[Outcome]:
        """Apply writes in order in one transaction; answer each one."""
        ...

    def ensure_org(self, name: str) -> int: ...

    def add_api_key(
        self, org_id: int, key_id: str, key_hash: str, scopes: frozenset[str]
    ) -> None: ...

    def find_api_key(self, key_id: str) -> ApiKeyRecord | None:
        """The key with this id, revoked or not (``revoked`` says); None if there is none."""
        ...

    def count_api_keys(self) -> int: ...

    def get_run(self, org_id: int, run_id: str) -> RunRecord | None: ...

    def list_runs(self, org_id: int, project: str | None, limit: int) -> list[RunRecord]: ...

    def list_series(self, org_id: int, run_id: str) -> list[SeriesKey] | None: ...

    def scalar_points(
        self, org_id: int, run_id: str, key: str
    ) -> list[tuple[int, float]] | None: ...

    def rank_points(
        self, org_id: int, run_id: str, key: str
    ) -> list[tuple[int, int, float, float, int | None, int]] | None:
        """(step, rank, value, weight, local_rank, world_size) rows, ordered by step, rank."""
        ...

    def rank_keys(self, org_id: int, run_id: str) -> list[str] | None:
        """The run's rank-metric keys, sorted; None when the run is unknown."""
        ...

    def needs_refresh(self, org_id: int, run_id: str, key: str) -> bool: ...

    def distributed_summary(
        self, org_id: int, run_id: str, key: str, params: SummaryParams
    ) -> dict[str, Any]:
        """The Distributed summary of one key (DESIGN.md), as its JSON answer."""
        ...

    def maintain(self) -> bool:
        """Do one bounded unit of background work (writer thread); True if more remains."""
        ...

    def backlog(self) -> int:
        """How much background work is waiting (summary steps not yet up to date)."""
        ...

    # ---- tenancy (orgs, keys, the monthly guardrail) ----

    def org_id(self, name: str) -> int | None: ...

    def org_name(self, org_id: int) -> str | None: ...

    def list_api_keys(self, org_id: int | None) -> list[dict[str, Any]]: ...

    def revoke_api_key(self, key_id: str, org_id: int | None) -> bool:
        """Revoke a key (of ``org_id``, unless None); False when there is no such live key."""
        ...

    def usage(self, org_id: int) -> dict[str, Any]:
        """This month's metric points: ``{"month", "used", "limit", "reset_at"}``."""
        ...

    def set_monthly_limit(self, org_id: int, limit: int | None) -> None:
        """Override the org's monthly limit (None: back to the server default)."""
        ...

    def close(self) -> None: ...
