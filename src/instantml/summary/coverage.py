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


def seen_before(
    missing: list[dict[str, Any]], first_step: int, last_before: dict[int, int]
) -> list[dict[str, Any]]:
    """In a zoomed range, a missing rank that never reported in it but did before it is
    "last seen at step X" (``last_before``: ranks' last steps before the range's first)."""
    out = []
    for m in missing:
        if m["last_seen_step"] is None and m["rank"] in last_before:
            m = {**m, "last_seen_step": last_before[m["rank"]], "first_missing_step": first_step}
        out.append(m)
    return out


def split_lagging(
    missing: list[dict[str, Any]],
    last_seen: dict[int, float],
    now: float,
    lag_seconds: float,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(missing, lagging)``: while the run got points in the last ``lag_seconds``, a rank
    absent from the last step that sent something in that time is behind (its uploads
    lag, or it is slower), not missing. ``last_seen``: when the server last heard from each
    rank."""
    if not last_seen or now - max(last_seen.values()) >= lag_seconds:
        return missing, []  # not live: what is absent now is missing
    gone, behind = [], []
    for m in missing:
        heard = last_seen.get(m["rank"])
        if heard is not None and now - heard < lag_seconds:
            behind.append({"rank": m["rank"], "last_step": m["last_seen_step"]})
        else:
            gone.append(m)
    return gone, behind
