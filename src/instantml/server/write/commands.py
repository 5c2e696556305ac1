"""The commands the write service applies: requests already validated (``validate.py``),
each in an envelope with its Idempotency-Key (if any)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any, overload

import numpy as np

from ...storage.records import Keys, RunSpec


@dataclass(slots=True)
class PatchRun:
    org_id: int
    run_id: str
    status: str
    rank: int | None = None  # our SDK says which rank finishes; the public SDK does not


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
    node: str | None = None


class MetricMatrix(Sequence[dict[str, float]]):
    """The metrics of events that all name the same keys in the same order (nearly every
    batch): the names once, the values as an (events x keys) float64 matrix. Read as a
    sequence it gives each event's dict, as a list of them would."""

    __slots__ = ("names", "values")

    def __init__(self, names: tuple[str, ...], values: np.ndarray) -> None:
        self.names = names
        self.values = values

    @classmethod
    def of(cls, metrics: list[dict[str, float]]) -> MetricMatrix | None:
        """The matrix of these dicts, or None when they do not all share their keys' order."""
        if not metrics:
            return None
        names = tuple(metrics[0])
        if any(len(m) != len(names) for m in metrics) or len(set(map(tuple, metrics))) != 1:
            return None
        values = np.fromiter(
            chain.from_iterable(map(dict.values, metrics)),
            dtype=np.float64,
            count=len(metrics) * len(names),
        )
        return cls(names, values.reshape(len(metrics), len(names)))

    def __len__(self) -> int:
        return len(self.values)

    @overload
    def __getitem__(self, index: int) -> dict[str, float]: ...

    @overload
    def __getitem__(self, index: slice) -> list[dict[str, float]]: ...

    def __getitem__(self, index: int | slice) -> dict[str, float] | list[dict[str, float]]:
        if isinstance(index, slice):
            return [dict(zip(self.names, row)) for row in self.values[index].tolist()]
        return dict(zip(self.names, self.values[index].tolist()))


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
    nodes: list[str | None]
    metrics: Sequence[dict[str, float]]  # a MetricMatrix when every event has the same keys
    key_hi: np.ndarray  # int64, as the three columns below: the ledger takes them as they are
    key_lo: np.ndarray
    fingerprints: np.ndarray
    key_seq: np.ndarray  # int64, each key's form (``idempotency.key_sequences``)
    key_n: np.ndarray

    def __len__(self) -> int:
        return len(self.steps)

    def names(self) -> set[tuple[str, ...]]:
        """Each event's metric names, in order, as a set."""
        if isinstance(self.metrics, MetricMatrix):
            return {self.metrics.names}
        return set(map(tuple, self.metrics))

    def keys(self) -> Keys:
        org = np.full(len(self), self.org_id, dtype=np.int64)
        return Keys(org, self.key_hi, self.key_lo, self.key_seq, self.key_n)

    def take(self, rows: list[int]) -> RankEvents:
        """These events (indexes, ascending) as a write of their own, still in columns."""
        index = np.array(rows, dtype=np.int64)
        metrics = self.metrics
        picked: Sequence[dict[str, float]] = (
            MetricMatrix(metrics.names, metrics.values[index])
            if isinstance(metrics, MetricMatrix)
            else [metrics[i] for i in rows]
        )
        return RankEvents(
            self.org_id,
            [self.run_ids[i] for i in rows],
            [self.steps[i] for i in rows],
            [self.ranks[i] for i in rows],
            [self.world_sizes[i] for i in rows],
            [self.local_ranks[i] for i in rows],
            [self.weights[i] for i in rows],
            [self.timestamps[i] for i in rows],
            [self.nodes[i] for i in rows],
            picked,
            self.key_hi[index],
            self.key_lo[index],
            self.fingerprints[index],
            self.key_seq[index],
            self.key_n[index],
        )

    def envelopes(self) -> list[Envelope]:
        key_hi, key_lo, prints, seq, n = (
            c.tolist()
            for c in (self.key_hi, self.key_lo, self.fingerprints, self.key_seq, self.key_n)
        )
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
                    node=self.nodes[i],
                ),
                Idempotency(key_hi[i], key_lo[i], prints[i], seq[i], n[i]),
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


CreateRun = RunSpec
Write = RunSpec | PatchRun | WriteScalars | WriteRankPoints | RankEvents | WriteAttributes


@dataclass(slots=True)
class Idempotency:
    """An Idempotency-Key reduced to 128 bits, and a fingerprint of the request it came with."""

    key_hi: int
    key_lo: int
    fingerprint: int
    seq: int = 0  # the key's form (idempotency.key_sequence): (0, -1) for none
    n: int = -1


@dataclass(slots=True)
class Envelope:
    write: Write
    idempotency: Idempotency | None = None
