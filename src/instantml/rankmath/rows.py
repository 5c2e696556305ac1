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

    ``span``: the range's first and last present steps (None: no step in it); ``band``:
    the band chart's entries, one per bucket of ``band_size`` steps
    (``step_blocks.entries``); ``heat_keys`` and ``heat_spans``: the heatmap's buckets of
    ``heat_size`` steps that hold a step, and each one's first and last present step;
    ``full_steps``/``partial_steps``: the steps whose every expected rank reported, and
    the others; ``last_expected``: ``expected`` at the last step; ``next_step``: for the
    last steps of the ranks absent from the last step, the first present step after it;
    ``rollup``: per rank ``(rank, steps_reported, last_step, mean_delta, mean_abs_z,
    outlier_steps, local_rank, nonfinite_steps)``; ``outliers``: the strongest rows
    ``(step, rank, local_rank, value, mean, delta, z, robust_z)``; ``cells``: heatmap
    cells (columns ``rank, b, v, marks``); ``nonfinite_firsts``: per rank with a
    non-finite value in the range, its first such ``(step, value)``."""

    world_size: int
    span: tuple[int, int] | None = None
    band: dict[str, np.ndarray] = field(default_factory=dict)
    band_size: int = 1
    heat_keys: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    heat_spans: np.ndarray = field(default_factory=lambda: np.empty((0, 2), dtype=np.int64))
    heat_size: int = 1
    full_steps: int = 0
    partial_steps: int = 0
    last_expected: int = 0
    next_step: dict[int, int] = field(default_factory=dict)
    rollup: list[tuple[Any, ...]] = field(default_factory=list)
    outliers: list[tuple[Any, ...]] = field(default_factory=list)
    cells: dict[str, np.ndarray] = field(default_factory=dict)
    nonfinite_firsts: dict[int, tuple[int, float]] = field(default_factory=dict)

    @property
    def first_nonfinite(self) -> tuple[int, int, float] | None:
        """``(step, rank, value)``: the earliest step with a non-finite value, its lowest
        rank; None when there is none."""
        if not self.nonfinite_firsts:
            return None
        step, rank = min((s, r) for r, (s, _) in self.nonfinite_firsts.items())
        return step, rank, self.nonfinite_firsts[rank][1]
