"""Straggler scores (docs/reference.md, "Run health"), as NVIDIA's resiliency extension scores
them: for a timing key, each rank's median over the last ``window`` steps; the reference
is the smallest median across ranks; a rank's score is ``reference / its median`` (1.0 for
the fastest, 0.5 for a rank twice as slow), and a score below 0.75 is a straggler.

Under synchronous data parallelism every rank's whole-step time is the same (the gradient
all-reduce waits for the slowest), so only rank-local sections (``perf/forward_ms``,
``perf/data_wait_ms``) can say which rank is slow."""

from __future__ import annotations

from typing import Any

THRESHOLD = 0.75
MIN_STEPS = 20  # samples a rank needs in the window to be judged
MIN_MS = 1.0  # how far above the fastest median a straggler's must be
DEFAULT_KEY = "perf/forward_ms"
DEFAULT_WINDOW = 200


def is_timing_key(key: str) -> bool:
    return key.startswith("perf/") and key.endswith("_ms")


def scores(
    medians: dict[int, tuple[float, int]],
    threshold: float = THRESHOLD,
    min_steps: int = MIN_STEPS,
    min_ms: float = MIN_MS,
) -> dict[str, Any]:
    """``medians``: rank -> (median, steps it reported in the window). Ranks with fewer
    than ``min_steps`` samples get a score but are never judged (``judged`` false), nor
    the reference; a rank is a straggler when its score is below ``threshold`` and its
    median at least ``min_ms`` above the reference."""
    judged = {r: m for r, (m, n) in medians.items() if n >= min_steps}
    pool = judged or {r: m for r, (m, _) in medians.items()}
    if not pool:
        return {"reference": None, "ranks": [], "stragglers": []}
    reference = min(pool.values())
    rows = []
    for rank, (median, steps) in medians.items():
        score = 1.0 if median <= 0 or median <= reference else reference / median
        fair = rank in judged and len(judged) >= 2
        rows.append(
            {
                "rank": rank,
                "median": median,
                "score": score,
                "steps": steps,
                "judged": fair,
                "straggler": fair and score < threshold and median - reference >= min_ms,
            }
        )
    rows.sort(key=lambda r: (r["score"], r["rank"]))
    return {
        "reference": reference,
        "ranks": rows,
        "stragglers": [r["rank"] for r in rows if r["straggler"]],
    }
