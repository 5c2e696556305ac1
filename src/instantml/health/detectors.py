"""The run-health detectors (docs/reference.md, "Run health"), as pure functions over the recent
points of a run: what is wrong now, as findings. Opening an alert for a new finding and
resolving one whose finding is gone is the monitor's (``monitor.py``).

Each finding is identified by (kind, rank, key): an alert for it opens once and is never
repeated while open. ``rank_missing`` has no key (its identity uses ``""``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..rankmath.step_stats import step_stats
from ..rankmath.stragglers import is_timing_key, scores
from ..storage.records import SEEN_RESOLUTION, RankActivity
from ..thresholds import Thresholds

KINDS = ("rank_missing", "node_missing", "straggler", "outlier_burst", "non_finite")
# The others make a run "warning".
CRITICAL = frozenset({"rank_missing", "node_missing", "non_finite"})


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
    windows: Sequence[KeyWindow],
    th: Thresholds,
    now: float,
    activity: Mapping[int, RankActivity],
    known_last: Mapping[int, int],
    first_after: Callable[[int | None], int | None],
    waiting: set[int] | None = None,
    held: frozenset[int] = frozenset(),
) -> list[Finding]:
    """Ranks below the world size of the latest step that are missing: outpaced by
    ``missing_steps`` steps that other ranks reported AND quiet (nothing received from
    them, by ``activity``, for ``lag_seconds``; a rank that never reported counts from the
    run's first point); or silent ``silent_seconds`` while others send; or unfinished, and
    quiet, when every other rank finished. A rank that is behind but sending (upload lag, a
    slow rank) is never missing. ``since_step``: the first step after the rank's last report
    at which any rank reported (``first_after``, from the stored points, for a rank whose
    last report is before the windows); ``known_last``: ranks' last steps seen before."""
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
    inside = ranks < world
    last = np.full(world, -1, dtype=np.int64)
    np.maximum.at(last, ranks[inside], steps[inside])
    started = min((a.first_seen for a in activity.values()), default=now)
    heard = {r: a.last_seen for r, a in activity.items()}
    # A rank's last_seen is kept to SEEN_RESOLUTION: quiet only past that much more.
    quiet_after = th.lag_seconds + SEEN_RESOLUTION
    found = []
    for rank in range(world):
        seen: int | None = int(last[rank]) if last[rank] >= 0 else known_last.get(rank)
        after = reported if seen is None else reported[reported > seen]
        quiet = now - heard.get(rank, started)
        others = [at for r, at in heard.items() if r != rank and r < world]
        lately = max(others, default=-np.inf)
        mine = activity.get(rank)
        unfinished = (
            mine is not None
            and mine.finished_at is None
            and bool(others)
            and all(activity[r].finished_at is not None for r in activity if r != rank)
        )
        behind = len(after) >= th.missing_steps or unfinished
        if waiting is not None and behind and quiet < quiet_after:
            waiting.add(rank)
        if len(after) >= th.missing_steps and (quiet >= quiet_after or rank in held):
            where = "never reported" if seen is None else f"last reported step {seen}"
            reason = f"{where}; {len(after)} steps reported by other ranks since"
        elif mine is not None and quiet >= th.silent_seconds and now - lately < th.silent_seconds:
            reason = f"silent for {quiet:.0f} s while other ranks send"
        elif unfinished and quiet >= quiet_after:
            reason = "it did not finish; every other rank did"
        else:
            continue
        if seen is not None and len(after) and seen >= reported[0]:
            since: int | None = int(after[0])
        else:
            since = first_after(seen)
        if since is None:
            since = 0 if seen is None else seen + 1
        at = int(np.searchsorted(reported, since))
        stamp = float(stamps[first[at]]) if at < len(reported) and reported[at] == since else now
        message = f"rank {rank} is missing from step {since}: {reason}"
        found.append(Finding("rank_missing", rank, None, since, stamp, message))
    return found


def node_of(activity: Mapping[int, RankActivity]) -> dict[str, list[int]]:
    """Each node's ranks (ranks that said no node are in none)."""
    nodes: dict[str, list[int]] = {}
    for rank in sorted(activity):
        node = activity[rank].node
        if node is not None:
            nodes.setdefault(node, []).append(rank)
    return nodes


def node_missing(
    found: list[Finding], waiting: set[int], activity: Mapping[int, RankActivity], world: int
) -> list[Finding]:
    """``found`` with the ``rank_missing`` findings of a node whose every rank is missing
    replaced by one ``node_missing`` finding naming the node and its ranks (``rank``: its
    first rank; ``since_step``: the earliest of theirs). A node of two ranks or more whose
    missing ranks' node-mates are all behind and about to be missing (``waiting``) has its
    ranks' findings held back for now, so that a dead node opens one alert, not one per
    rank as each crosses the lag."""
    missing = {f.rank: f for f in found if f.kind == "rank_missing"}
    if not missing:
        return found
    dropped: set[int] = set()
    grouped: list[Finding] = []
    for node, members in node_of(activity).items():
        ranks = [r for r in members if r < world]
        gone = [r for r in ranks if r in missing]
        if len(ranks) < 2 or not gone:
            continue
        if len(gone) < len(ranks):
            if all(r in missing or r in waiting for r in ranks):
                dropped.update(gone)  # the rest are behind: wait for them
            continue
        dropped.update(gone)
        first = min((missing[r] for r in gone), key=lambda f: (f.since_step, f.rank))
        message = (
            f"node {node} is missing from step {first.since_step}: all its ranks"
            f" ({rank_ranges(ranks)}) stopped reporting"
        )
        grouped.append(
            Finding("node_missing", ranks[0], None, first.since_step, first.since_time, message)
        )
    return [f for f in found if not (f.kind == "rank_missing" and f.rank in dropped)] + grouped


def rank_ranges(ranks: list[int]) -> str:
    """``[8, 9, 10, 12]`` as ``"8-10, 12"``."""
    if not ranks:
        return ""
    parts: list[str] = []
    start = prev = ranks[0]
    for rank in [*ranks[1:], None]:
        if rank is not None and rank == prev + 1:
            prev = rank
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if rank is not None:
            start = prev = rank
    return ", ".join(parts)


def ranks_lost(activity: Mapping[int, RankActivity], th: Thresholds, now: float) -> list[int]:
    """Ranks that sent points and never finished the run while others did (and have been
    quiet for ``lag_seconds``, so a finish still on its way does not count)."""
    if not any(a.finished_at is not None for a in activity.values()):
        return []
    quiet = th.lag_seconds + SEEN_RESOLUTION
    return sorted(
        r for r, a in activity.items() if a.finished_at is None and now - a.last_seen >= quiet
    )


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
    ``burst_window`` steps; robust_z as the summary scores it, its reference spread from
    the window's steps (``REFERENCE_STEPS`` of them before the burst window when read).

    On a timing key (``perf/*_ms``) a step counts only where the value is also at least
    ``straggler_min_ms`` from the step's median, the floor stragglers are judged by: a
    loop's data wait of a few microseconds scores a huge robust z for a scheduler's
    hiccup of a fraction of a millisecond, which is noise, not a rank going wrong."""
    if not len(window.step):
        return []
    rows, _, _, robust = step_stats(window.step, window.value, window.weight, window.world_size)
    sel = _recent(window, th.burst_window)
    step, rank = window.step[sel], window.rank[sel]
    hit = np.abs(np.nan_to_num(robust[sel], nan=0.0)) >= th.burst_z
    if is_timing_key(window.key):
        median = rows["p50"][np.searchsorted(rows["step"], step)]
        with np.errstate(invalid="ignore"):
            hit &= np.abs(window.value[sel] - median) >= th.straggler_min_ms
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


def non_finite(
    window: KeyWindow, firsts: Mapping[int, tuple[int, float]], stamp: float
) -> list[Finding]:
    """Ranks with a NaN or +-inf value of the key: ``firsts``, each rank's first such step
    and value (from the stored points, however far behind the window it was uploaded)."""
    found = []
    for r, (since, value) in sorted(firsts.items()):
        at = (window.rank == r) & (window.step == since)
        when = float(window.ts[at][0]) if at.any() else stamp
        message = f"rank {r}: {window.key} is {value} at step {since} (its first non-finite value)"
        found.append(Finding("non_finite", r, window.key, since, when, message))
    return found


def nonfinite_ranks(window: KeyWindow) -> set[int]:
    """The ranks with a non-finite value of the key in the window."""
    return set(np.unique(window.rank[~np.isfinite(window.value)]).tolist())


def stragglers(
    key: str,
    span: tuple[int, int] | None,
    medians: dict[int, tuple[float, int]],
    th: Thresholds,
    now: float,
) -> list[Finding]:
    """Ranks whose straggler score on a timing key, over the window ``span`` of steps, is
    below ``straggler_score``: judged only among ranks with ``straggler_min_steps``
    samples in the window, and only when a rank's median is ``straggler_min_ms`` above
    the fastest's (a few samples, or sub-millisecond gaps, say nothing)."""
    if span is None:
        return []
    scored = scores(medians, th.straggler_score, th.straggler_min_steps, th.straggler_min_ms)
    found = []
    for row in scored["ranks"]:
        if row["straggler"]:
            message = (
                f"rank {row['rank']} is a straggler on {key}: median {row['median']:.3g} ms"
                f" against the fastest rank's {scored['reference']:.3g} ms (score"
                f" {row['score']:.2f} over steps {span[0]}-{span[1]}, {row['steps']} samples)"
            )
            found.append(Finding("straggler", int(row["rank"]), key, span[1], now, message))
    return found
