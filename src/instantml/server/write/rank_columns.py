"""Rank points in columns, on their way to a point store: events grouped by (run, metric
names) into a matrix of values, one column set per series. Both a batch's events (as
``RankEvents`` columns) and single requests (as rows) end here, so a point store has one
write path."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from itertools import chain
from typing import Any

import numpy as np

from ...storage.records import RANK, RANK_COLUMNS, RunRef
from .commands import MetricMatrix, RankEvents, WriteRankPoints

SeriesIds = Callable[[RunRef, int, Sequence[str]], list[int]]


class RankColumns:
    """The rank points a unit of work writes, by series; ``seq`` numbers them in the order
    they were written, so that the later write of a point wins."""

    def __init__(self) -> None:
        self.chunks: dict[int, list[dict[str, np.ndarray]]] = {}
        self.rows: dict[int, list[tuple[Any, ...]]] = {}
        self.extents: dict[int, tuple[int, int]] = {}  # run seq -> (world size, last step)
        self.points: dict[int, int] = {}  # run seq -> metric points charged to it
        self.ranks: dict[int, set[int]] = {}  # run seq -> the ranks that sent points
        self.nodes: dict[int, dict[int, str]] = {}  # run seq -> rank -> its latest node
        # Runs given a non-finite value (the health monitor looks for its first step).
        self.nonfinite: set[tuple[int, str]] = set()
        self.seq = 0

    def count(self, run: RunRef, points: int) -> None:
        """Note ``points`` more metric points of ``run`` (its cost, shown in runs lists)."""
        self.points[run.seq] = self.points.get(run.seq, 0) + points

    def extend(self, run: RunRef, world_size: int, last_step: int) -> None:
        """Note that ``run`` reached this world size and step (scalars: world size 0)."""
        size, last = self.extents.get(run.seq, (0, -1))
        self.extents[run.seq] = (max(size, world_size), max(last, last_step))

    def add_events(
        self,
        write: RankEvents,
        runs: dict[str, RunRef | None],
        names: set[tuple[str, ...]],
        series_ids: SeriesIds,
    ) -> None:
        """Every event of ``write`` (every run known): grouped by (run, metric names)."""
        n = len(write)
        groups: dict[tuple[str, tuple[str, ...]], list[int]] = {}
        matrix = write.metrics if isinstance(write.metrics, MetricMatrix) else None
        if len(runs) == 1 and len(names) == 1:
            groups[(write.run_ids[0], next(iter(names)))] = list(range(n))
        elif matrix is not None:
            for i, run_id in enumerate(write.run_ids):
                groups.setdefault((run_id, matrix.names), []).append(i)
        else:
            for i, (run_id, metrics) in enumerate(zip(write.run_ids, write.metrics)):
                groups.setdefault((run_id, tuple(metrics)), []).append(i)
        columns: dict[str, np.ndarray] = {
            "step": np.array(write.steps, dtype=np.int64),
            "rank": np.array(write.ranks, dtype=np.int16),
            "world_size": np.array(write.world_sizes, dtype=np.int16),
            "local_rank": np.array(write.local_ranks, dtype=np.int16),
            "weight": np.array(write.weights, dtype=np.float64),
            "ts": np.array(write.timestamps, dtype=np.float64),
            "seq": self.seq + np.arange(n, dtype=np.int64),
        }
        self.seq += n
        for (run_id, keys), members in groups.items():
            run = runs[run_id]
            assert run is not None
            rows: Any = np.array(members, dtype=np.int64) if len(groups) > 1 else slice(None)
            if matrix is not None:
                values = matrix.values[rows]
            else:
                group_metrics = (
                    write.metrics if len(groups) == 1 else [write.metrics[i] for i in members]
                )
                values = np.fromiter(
                    chain.from_iterable(map(dict.values, group_metrics)),
                    dtype=np.float64,
                    count=len(members) * len(keys),
                ).reshape(len(members), len(keys))
            picked = {name: column[rows] for name, column in columns.items()}
            for j, sid in enumerate(series_ids(run, RANK, keys)):
                self.chunks.setdefault(sid, []).append(dict(picked, value=values[:, j]))
            self.extend(run, int(picked["world_size"].max()), int(picked["step"].max()))
            self.count(run, values.size)
            self.ranks.setdefault(run.seq, set()).update(np.unique(picked["rank"]).tolist())
            nodes = write.nodes if len(groups) == 1 else [write.nodes[i] for i in members]
            if any(nodes):  # a rank's last node said wins; an event without one says nothing
                self.nodes.setdefault(run.seq, {}).update(
                    (rank, node)
                    for rank, node in zip(picked["rank"].tolist(), nodes, strict=True)
                    if node is not None
                )
            if not np.isfinite(values).all():
                self.nonfinite.add((write.org_id, run_id))

    def add(self, write: WriteRankPoints, run: RunRef, series_ids: SeriesIds) -> None:
        """One request's points, as rows (turned into columns by :meth:`take`)."""
        local = -1 if write.local_rank is None else write.local_rank
        seq = self.seq
        self.seq += 1
        keys = list(write.metrics)
        for sid, value in zip(series_ids(run, RANK, keys), write.metrics.values(), strict=True):
            self.rows.setdefault(sid, []).append(
                (write.step, write.rank, write.world_size, local, value, write.weight,
                 write.timestamp, seq)
            )  # fmt: skip
        self.extend(run, write.world_size, write.step)
        self.count(run, len(keys))
        self.ranks.setdefault(run.seq, set()).add(write.rank)
        if write.node is not None:
            self.nodes.setdefault(run.seq, {})[write.rank] = write.node
        if not all(map(math.isfinite, write.metrics.values())):
            self.nonfinite.add((write.org_id, write.run_id))

    def take(self) -> dict[int, list[dict[str, np.ndarray]]]:
        """Everything added, as column sets by series."""
        chunks = self.chunks
        for sid, rows in self.rows.items():
            transposed = zip(*rows, strict=True)
            chunks.setdefault(sid, []).append(
                {
                    name: np.array(column, dtype=dtype)
                    for (name, dtype), column in zip(RANK_COLUMNS.items(), transposed, strict=True)
                }
            )
        self.chunks, self.rows = {}, {}
        return chunks
