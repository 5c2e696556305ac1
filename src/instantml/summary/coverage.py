"""Ranks missing from a key's last step, and when they vanished."""

from __future__ import annotations

from bisect import bisect_right
from typing import Any


def missing_ranks(
    world_size: int, steps: list[int], last_step_of_rank: dict[int, int]
) -> list[dict[str, Any]]:
    """Every rank below ``world_size`` absent from the last of ``steps`` (ascending, the
    steps present in the range): its last report in the range (None if it never reported)
    and the first step after that at which any rank reported (the first step if never)."""
    if not steps:
        return []
    last = steps[-1]
    missing = []
    for rank in range(world_size):
        seen = last_step_of_rank.get(rank)
        if seen == last:
            continue
        first_missing = steps[0] if seen is None else steps[bisect_right(steps, seen)]
        missing.append({"rank": rank, "last_seen_step": seen, "first_missing_step": first_missing})
    return missing
