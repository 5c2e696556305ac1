"""The run-health detectors (DESIGN.md, "Run health"), as pure functions over the recent
points of a run: what is wrong now, as findings. Opening an alert for a new finding and
resolving one whose finding is gone is the monitor's (``monitor.py``).

Each finding is identified by (kind, rank, key): an alert for it opens once and is never
repeated while open. ``rank_missing`` has no key (its identity uses ``""``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..summary.step_stats import step_stats
from ..summary.stragglers import scores
from .thresholds import Thresholds

KINDS = ("rank_missing", "straggler", "outlier_burst", "non_finite")
CRITICAL = frozenset({"rank_missing", "non_finite"})  # the others make a run "warning"


@dataclass(frozen=True, slots=True)
class KeyWindow:
    """One rank key's points over the run's recent steps (one per (step, rank))."""

    key: str
    step: np.ndarray
    rank: np.ndarray
    value: np.ndarray
    weight: np.ndarray
    world_size: np.ndarray
    ts: np.ndarray


@dataclass(frozen=True, slots=True)
class Finding:
    kind: str
    rank: int
    key: str | None
    since_step: int
    since_time: float
    message: str

    @property
    def ident(self) -> tuple[str, int, str]:
        return (self.kind, self.rank, self.key or "")


def status(kinds: Sequence[str]) -> str:
    """A run's health from the kinds of its open alerts."""
    if any(kind in CRITICAL for kind in kinds):
        return "critical"
    return "warning" if kinds else "ok"


def rank_missing(
    windows: Sequence[KeyWindow], th: Thresholds, now: float, known_last: Mapping[int, int]
) -> list[Finding]:
    """Ranks below the world size of the latest step absent from ``missing_steps``
    consecutive steps that other ranks reported, or silent ``silent_seconds`` while others
    log. ``since_step`` is the first step after the rank's last report at which any rank
    reported; ``known_last``: ranks' last steps seen before this window (for a rank absent
    from all of it)."""
    windows = [w for w in windows if len(w.step)]
    if not windows:
        return []
    steps = np.concatenate([w.step for w in windows])
    ranks = np.concatenate([w.rank for w in windows]).astype(np.int64)
    stamps = np.concatenate([w.ts for w in windows])
    sizes = np.concatenate([w.world_size for w in windows])
    latest = steps.max()
    world = int(sizes[steps == latest].max())
    reported, first = np.unique(steps, return_index=True)  # each step's first point

    def first_seen(step: int) -> float:
        at = int(np.searchsorted(reported, step))
        return float(stamps[first[at]]) if at < len(reported) and reported[at] == step else now

    inside = ranks < world
    last = np.full(world, -1, dtype=np.int64)
    np.maximum.at(last, ranks[inside], steps[inside])
    last_ts = np.full(world, -np.inf)
    np.maximum.at(last_ts, ranks[inside], stamps[inside])
    # The latest report of the other ranks: the top one's, or the runner-up's for the top.
    top = int(np.argmax(last_ts))
    runner_up = np.delete(last_ts, top).max() if world > 1 else -np.inf
    found = []
    for rank in range(world):
        seen: int | None = int(last[rank]) if last[rank] >= 0 else known_last.get(rank)
        after = reported if seen is None else reported[reported > seen]
        if len(after) >= th.missing_steps:
            since = int(after[0]) if seen is None or seen >= reported[0] - 1 else seen + 1
            where = "never reported" if seen is None else f"last reported step {seen}"
            message = (
                f"rank {rank} is missing: {where}; {len(after)} steps reported by other ranks"
                f" since (from step {since})"
            )
            found.append(Finding("rank_missing", rank, None, since, first_seen(since), message))
            continue
        others = runner_up if rank == top else last_ts[top]
        silent = now - last_ts[rank]
        if last[rank] >= 0 and silent >= th.silent_seconds and now - others < th.silent_seconds:
            since = int(after[0]) if len(after) else int(last[rank]) + 1
            message = f"rank {rank} is missing: silent for {silent:.0f} s while other ranks log"
            found.append(Finding("rank_missing", rank, None, since, float(last_ts[rank]), message))
    return found


def last_steps(windows: Sequence[KeyWindow]) -> dict[int, int]:
    """Each rank's last step in the windows: one numpy pass (a look reads ~100,000
    points; a Python loop over them held the GIL a quarter of the look)."""
    windows = [w for w in windows if len(w.step)]
    if not windows:
        return {}
    ranks = np.concatenate([w.rank for w in windows]).astype(np.int64)
    steps = np.concatenate([w.step for w in windows]).astype(np.int64)
    last = np.full(int(ranks.max()) + 1, -1, dtype=np.int64)
    np.maximum.at(last, ranks, steps)
    seen = np.flatnonzero(last >= 0)
    return dict(zip(seen.tolist(), last[seen].tolist(), strict=True))


def _recent(window: KeyWindow, steps: int) -> np.ndarray:
    """The points of the window's last ``steps`` distinct steps (a boolean mask)."""
    distinct = np.unique(window.step)
    return np.asarray(window.step >= distinct[-steps:][0])


def outlier_bursts(window: KeyWindow, th: Thresholds) -> list[Finding]:
    """Ranks with |robust_z| >= ``burst_z`` in at least ``burst_steps`` of the key's last
    ``burst_window`` steps."""
    if not len(window.step):
        return []
    sel = _recent(window, th.burst_window)
    step, rank = window.step[sel], window.rank[sel]
    _, _, _, robust = step_stats(
        step, window.value[sel], window.weight[sel], window.world_size[sel]
    )
    hit = np.abs(np.nan_to_num(robust, nan=0.0)) >= th.burst_z
    found = []
    for r in np.unique(rank[hit]).tolist():
        mine = hit & (rank == r)
        count = int(np.unique(step[mine]).size)
        if count >= th.burst_steps:
            since = int(step[mine].min())
            message = (
                f"rank {r}: {window.key} is an outlier (|robust z| >= {th.burst_z:g}) in"
                f" {count} of the last {th.burst_window} steps"
            )
            first = window.ts[sel][mine & (step == since)]
            found.append(Finding("outlier_burst", r, window.key, since, float(first[0]), message))
    return found


def non_finite(window: KeyWindow, th: Thresholds) -> list[Finding]:
    """Ranks with a NaN or +-inf value of the key among its last ``burst_window`` steps;
    ``since_step``: the first of them."""
    if not len(window.step):
        return []
    sel = _recent(window, th.burst_window) & ~np.isfinite(window.value)
    found = []
    for r in np.unique(window.rank[sel]).tolist():
        mine = sel & (window.rank == r)
        since = int(window.step[mine].min())
        value = float(window.value[mine & (window.step == since)][0])
        message = f"rank {r}: {window.key} is {value} at step {since}"
        stamp = float(window.ts[mine & (window.step == since)][0])
        found.append(Finding("non_finite", r, window.key, since, stamp, message))
    return found


def stragglers(
    key: str,
    span: tuple[int, int] | None,
    medians: dict[int, tuple[float, int]],
    th: Thresholds,
    now: float,
) -> list[Finding]:
    """Ranks whose straggler score on a timing key, over the window ``span`` of steps,
    is below ``straggler_score``."""
    if span is None or len(medians) < 2:
        return []
    scored = scores(medians, th.straggler_score)
    found = []
    for row in scored["ranks"]:
        if row["straggler"]:
            message = (
                f"rank {row['rank']} is a straggler on {key}: median {row['median']:.3g} ms"
                f" against the fastest rank's {scored['reference']:.3g} ms (score"
                f" {row['score']:.2f} over steps {span[0]}-{span[1]})"
            )
            found.append(Finding("straggler", int(row["rank"]), key, span[1], now, message))
    return found
