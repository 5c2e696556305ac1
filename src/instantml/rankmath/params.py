"""Query parameters of ``GET /api/runs/{id}/distributed`` and the bucketing rule."""

from __future__ import annotations

import math
from dataclasses import dataclass

ROBUST_Z_THRESHOLD = 3.5  # Iglewicz and Hoaglin's cut-off for the modified z-score
BLOCK_BASE = 4  # blocks of steps are 4, 16, 64, ... steps long (rankmath.covers)


@dataclass(frozen=True, slots=True)
class SummaryParams:
    key: str | None = None
    step_min: int | None = None
    step_max: int | None = None
    max_points: int = 500
    heatmap_steps: int = 200
    z: float = 3.0
    outlier_limit: int = 100

    def __post_init__(self) -> None:
        if (
            self.step_min is not None
            and self.step_max is not None
            and self.step_min > self.step_max
        ):
            raise ValueError("step_min must be <= step_max")
        if not (math.isfinite(self.z) and self.z > 0):
            raise ValueError("z must be a finite number > 0")


def default_key(keys: list[str]) -> str:
    """The rank key a summary shows when none is asked for: a loss (a key whose last part
    names one; ``train/loss`` first) when the run has one, else the first in sorted order.
    The API, the dashboard (through the API) and ``instantml ranks`` all open on it."""
    ordered = sorted(keys)
    losses = [k for k in ordered if "loss" in k.rsplit("/", 1)[-1].lower()]
    if "train/loss" in losses:
        return "train/loss"
    return (losses or ordered)[0]


def bucket_size(first: int, last: int, distinct_steps: int, cap: int) -> int:
    """1 when the range holds at most ``cap`` distinct steps, else the smallest block size
    (a power of ``BLOCK_BASE``) of at least ceil((last - first + 1) / cap). Buckets are
    aligned to multiples of it from step 0 (bucket k is ``[k * size, (k + 1) * size - 1]``,
    ``rankmath.covers.bucket_keys``), so a full bucket is exactly one block and only the range's two
    edge buckets may be partial; a range can touch one bucket more than ``cap``."""
    if distinct_steps <= cap:
        return 1
    need = -(-(last - first + 1) // cap)
    size = BLOCK_BASE
    while size < need:
        size *= BLOCK_BASE
    return size
