"""The writes the write service applies: requests already validated (``writes.py``), each in
an envelope with its Idempotency-Key (if any)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..storage.records import Keys, RunSpec


@dataclass(slots=True)
class PatchRun:
    org_id: int
    run_id: str
    status: str


@dataclass(slots=True)
class WriteScalars:
    org_id: int
    run_id: str
    step: int | float  # any finite number >= 0 (validation.scalar_step)
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
    common case. Each is answered exactly as the ``WriteRankPoints`` of :meth:`envelopes`
    would be, in order, each with its own Idempotency-Key."""

    org_id: int
    run_ids: list[str]
    steps: list[int]
    ranks: list[int]
    world_sizes: list[int]
    local_ranks: list[int]  # -1: not given
    weights: list[float]
    timestamps: list[float]
    metrics: list[dict[str, float]]
    key_hi: np.ndarray  # int64, as the three columns below: the ledger takes them as they are
    key_lo: np.ndarray
    fingerprints: np.ndarray

    def __len__(self) -> int:
        return len(self.steps)

    def keys(self) -> Keys:
        return Keys(np.full(len(self), self.org_id, dtype=np.int64), self.key_hi, self.key_lo)

    def envelopes(self) -> list[Envelope]:
        key_hi, key_lo, prints = (c.tolist() for c in (self.key_hi, self.key_lo, self.fingerprints))
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
                Idempotency(key_hi[i], key_lo[i], prints[i]),
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


CreateRun = RunSpec
Write = RunSpec | PatchRun | WriteScalars | WriteRankPoints | RankEvents | WriteAttributes | Refresh


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
