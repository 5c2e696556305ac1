"""Ranks missing from a key's last step, and when they vanished."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def missing_ranks(
    world_size: int,
    first: int,
    last: int,
    last_step_of_rank: dict[int, int],
    next_step: dict[int, int],
) -> list[dict[str, Any]]:
    """Every rank below ``world_size`` absent from ``last``, the range's last present step:
    its last report in the range (None if it never reported) and the first step after
    that at which any rank reported (``next_step`` of it; ``first``, the range's first
    present step, if never)."""
    missing = []
    for rank in range(world_size):
        seen = last_step_of_rank.get(rank)
        if seen == last:
            continue
        first_missing = first if seen is None else next_step[seen]
        missing.append({"rank": rank, "last_seen_step": seen, "first_missing_step": first_missing})
    return missing


def seen_before(
    answer: dict[str, Any],
    step_min: int | None,
    last_steps_of: Callable[[list[int], int], dict[int, int]],
) -> list[dict[str, Any]]:
    """The answer's missing ranks, where in a zoomed range (``step_min`` given) a rank that
    never reported in it but did before it is "last seen at step X", and missing from the
    range's first step. ``last_steps_of(ranks, before)``: those ranks' last steps before
    ``before``, as the point store answers."""
    missing: list[dict[str, Any]] = answer["coverage"]["missing"]
    absent = [m["rank"] for m in missing if m["last_seen_step"] is None]
    if step_min is None or answer["step_range"] is None or not absent:
        return missing
    first_step = answer["step_range"][0]
    last_before = last_steps_of(absent, step_min)
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
