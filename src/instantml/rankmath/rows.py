"""The rows a Distributed summary is made of: what a point store reads for one key over a
step range, before the answer is assembled."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(slots=True)
class SummaryRows:
    """What a point store reads for one key's Distributed summary over a step range; the
    answer is assembled from these by :mod:`instantml.summary.assemble`.

    ``stats``: one row per step (columns ``step, n, expected, mean, weighted_mean, min,
    max, std, p05, p50, p95, nonfinite``); ``rollup``: per rank ``(rank, steps_reported,
    last_step, mean_delta, mean_abs_z, outlier_steps, local_rank, nonfinite_steps)``;
    ``outliers``: the strongest rows ``(step, rank, local_rank, value, mean, delta, z,
    robust_z)``; ``cells``: heatmap cells (columns ``rank, b, v, marks``);
    ``nonfinite_firsts``: per rank with a non-finite value in the range, its first such
    ``(step, value)``."""

    world_size: int
    stats: dict[str, np.ndarray]
    rollup: list[tuple[Any, ...]] = field(default_factory=list)
    outliers: list[tuple[Any, ...]] = field(default_factory=list)
    cells: dict[str, np.ndarray] = field(default_factory=dict)
    heat_size: int = 1
    nonfinite_firsts: dict[int, tuple[int, float]] = field(default_factory=dict)

    @property
    def first_nonfinite(self) -> tuple[int, int, float] | None:
        """``(step, rank, value)``: the earliest step with a non-finite value, its lowest
        rank; None when there is none."""
        if not self.nonfinite_firsts:
            return None
        step, rank = min((s, r) for r, (s, _) in self.nonfinite_firsts.items())
        return step, rank, self.nonfinite_firsts[rank][1]
