"""What the stores take and give back: plain records and numpy columns, no HTTP."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

RANK, SCALAR = 1, 0  # series kinds


class StorageError(Exception):
    """A store could not do what was asked (an engine failure, not bad input): retryable."""


class RunConflict(Exception):
    """A run id that exists in another project of the org."""

    def __init__(self, run_id: str, project: str) -> None:
        super().__init__(f"run {run_id!r} exists in project {project!r}")
        self.run_id = run_id
        self.project = project


@dataclass(slots=True)
class RunSpec:
    """A run to create (or attach to, when its id exists in the same project)."""

    org_id: int
    run_id: str
    project: str
    name: str | None
    config: dict[str, Any]
    tags: list[str]
    metadata: dict[str, Any]


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
    points: int = 0  # metric points charged to it (rewrites count, replays do not)

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
            "points": self.points,
        }


@dataclass(slots=True, frozen=True)
class RunRef:
    """A run as the write path knows it: its store-wide number and its project."""

    seq: int
    project: str


@dataclass(slots=True)
class ApiKeyRecord:
    key_id: str
    org_id: int
    scopes: frozenset[str]
    key_hash: str
    revoked: bool = False


@dataclass(slots=True)
class SeriesKey:
    key: str
    kind: str  # "rank" or "scalar"
    points: int = 0
    last_step: int | None = None


@dataclass(slots=True, frozen=True)
class StoredAnswer:
    """The first answer to an Idempotency-Key, kept to answer its replays alike."""

    fingerprint: int
    status: int
    body: str  # JSON text


Slot = tuple[int, int, int]  # (org, key_hi, key_lo): an Idempotency-Key, reduced
SEQUENCE_LIMIT = 1 << 40  # n of a key ``<prefix>-<n>`` (Keys.n) is below it


@dataclass(slots=True, frozen=True)
class Keys:
    """Idempotency-Keys in columns (org, key_hi, key_lo: int64 arrays of one length): a
    batch's keys stay arrays from the route to the ledger, never a tuple per event."""

    org: np.ndarray
    hi: np.ndarray
    lo: np.ndarray
    # A key of the form ``<prefix>-<n>`` (``idempotency.key_sequence``: what the SDK and the
    # spool make, n counting up per writer): its prefix's hash and n; 0 and -1 for any
    # other key. The embedded ledger keeps such keys as ranges of n rather than one by one.
    seq: np.ndarray
    n: np.ndarray

    @classmethod
    def of(cls, slots: Sequence[Slot], forms: Sequence[tuple[int, int]] | None = None) -> Keys:
        """Keys from slots, with their forms ((seq, n) each), or as keys of no form. A key
        that has a form is looked up with it: the embedded ledger finds a key stored with
        its form only by it."""
        if not slots:
            empty = np.zeros(0, dtype=np.int64)
            return cls(empty, empty, empty, empty, empty)
        org, hi, lo = (np.fromiter(c, dtype=np.int64, count=len(slots)) for c in zip(*slots))
        if forms is None:
            seq, n = np.zeros(len(slots), np.int64), np.full(len(slots), -1, np.int64)
        else:
            seq, n = (np.fromiter(c, dtype=np.int64, count=len(forms)) for c in zip(*forms))
        return cls(org, hi, lo, seq, n)

    @classmethod
    def concat(cls, parts: Sequence[Keys]) -> Keys:
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return cls.of([])
        return cls(
            *(
                np.concatenate([getattr(k, c) for k in parts])
                for c in ("org", "hi", "lo", "seq", "n")
            )
        )

    def __len__(self) -> int:
        return len(self.hi)

    def slots(self) -> list[Slot]:
        return list(zip(self.org.tolist(), self.hi.tolist(), self.lo.tolist(), strict=True))


# Rank points in columns, one series at a time. ``seq`` orders writes of one unit of work:
# of two writes of the same (step, rank), the one with the higher seq wins.
RANK_COLUMNS: dict[str, Any] = {
    "step": np.int64,
    "rank": np.int16,
    "world_size": np.int16,
    "local_rank": np.int16,  # -1: none given
    "value": np.float64,  # NaN or +-inf: a non-finite mark
    "weight": np.float64,
    "ts": np.float64,
    "seq": np.int64,
}


def latest_points(chunks: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Staged points as one frame, keeping only the latest write (highest ``seq``) of each
    (step, rank): one INSERT may not carry a point twice."""
    frame = chunks[0] if len(chunks) == 1 else {
        name: np.concatenate([c[name] for c in chunks]) for name in chunks[0]
    }  # fmt: skip
    step, rank = frame["step"], frame["rank"]
    order = np.lexsort((frame["seq"], rank, step))
    s_step, s_rank = step[order], rank[order]
    last = np.ones(len(order), dtype=bool)
    last[:-1] = (s_step[1:] != s_step[:-1]) | (s_rank[1:] != s_rank[:-1])
    if last.all():
        return frame
    keep = np.sort(order[last])
    return {name: column[keep] for name, column in frame.items()}


def step_number(step: float) -> int | float:
    """A stored scalar step (a float64) as the client sent it: an int when integral."""
    return int(step) if float(step).is_integer() else float(step)


@dataclass(slots=True)
class ScalarPoint:
    series_id: int
    step: int | float  # a float64 in the stores: exact (validation.scalar_step)
    value: float
    ts: float
    preview: bool


def run_record(row: Sequence[Any]) -> RunRecord:
    """A RunRecord from a row of the backends' runs query (JSON columns as text)."""
    return RunRecord(
        org_id=int(row[0]),
        run_id=row[1],
        project=row[2],
        name=row[3],
        status=row[4],
        config=orjson.loads(row[5]),
        tags=orjson.loads(row[6]),
        metadata=orjson.loads(row[7]),
        created_at=row[8],
        updated_at=row[9],
        world_size=row[10],
        last_step=row[11],
        points=int(row[12] or 0),
    )


def run_values(spec: RunSpec, now: float) -> list[Any]:
    """A new run's column values, in the backends' insert order: org, id, project, name,
    config, tags and metadata (JSON text), created and updated at."""
    return [
        spec.org_id,
        spec.run_id,
        spec.project,
        spec.name,
        orjson.dumps(spec.config).decode(),
        orjson.dumps(spec.tags).decode(),
        orjson.dumps(spec.metadata).decode(),
        now,
        now,
    ]


def key_listing(rows: Iterable[Sequence[Any]]) -> list[dict[str, Any]]:
    """Keys as listed (never their secrets), from rows of (key id, org name, scopes as
    comma-separated text, created at, revoked at)."""
    return [
        {
            "key_id": kid,
            "org": org,
            "scopes": sorted(scopes.split(",")),
            "created_at": created,
            "revoked_at": revoked,
        }
        for kid, org, scopes, created, revoked in rows
    ]


@dataclass(slots=True)
class AlertRecord:
    """A run-health alert (docs/reference.md, "Run health"): open until ``resolved_at``."""

    alert_id: str
    org_id: int
    run_id: str
    kind: str
    rank: int
    key: str | None
    since_step: int
    since_time: float
    message: str
    opened_at: float
    resolved_at: float | None = None

    @property
    def ident(self) -> tuple[str, int, str]:
        return (self.kind, self.rank, self.key or "")

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.alert_id,
            "kind": self.kind,
            "rank": self.rank,
            "key": self.key,
            "since_step": self.since_step,
            "since_time": self.since_time,
            "message": self.message,
            "resolved": self.resolved_at is not None,
            "opened_at": self.opened_at,
            "resolved_at": self.resolved_at,
        }


@dataclass(frozen=True, slots=True)
class RankActivity:
    """What the server received from one rank of a run, by its own clock (not the points'
    timestamps, which say when a value was logged): when it first and last sent rank
    points (``last_seen`` kept to within ``SEEN_RESOLUTION``), and when it finished the run
    (None until then; only our SDK says which rank finishes)."""

    first_seen: float
    last_seen: float
    finished_at: float | None
    node: str | None = None  # the host it said it runs on, the latest


# A rank's ``last_seen`` is rewritten at most this often: a unit a second per rank at most.
SEEN_RESOLUTION = 0.5


@dataclass(slots=True)
class WebhookRecord:
    webhook_id: str
    org_id: int
    url: str
    kinds: list[str]
    secret: str
    created_at: float

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.webhook_id,
            "url": self.url,
            "kinds": self.kinds,
            "secret": self.secret,
            "created_at": self.created_at,
        }


@dataclass(slots=True)
class Delivery:
    """One alert's post to one webhook, from the outbox."""

    delivery_id: str
    url: str
    secret: str
    body: str
    attempts: int
