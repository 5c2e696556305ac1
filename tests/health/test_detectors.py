"""The detectors' definitions (docs/reference.md, "Run health"), on hand-made windows, and the
thresholds' checks."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from instantml.health import detectors
from instantml.health.detectors import KeyWindow
from instantml.storage.records import RankActivity
from instantml.thresholds import Thresholds, from_env

TH = Thresholds()


def window(
    key: str, points: list[tuple[int, int, float]], world: int = 8, ts: Any = None
) -> KeyWindow:
    """(step, rank, value) points; ts defaults to 1000 + step."""
    step = np.array([p[0] for p in points], dtype=np.int64)
    stamps = np.array(ts if ts is not None else [1000.0 + p[0] for p in points])
    return KeyWindow(
        key, step, np.array([p[1] for p in points], dtype=np.int64),
        np.array([p[2] for p in points]), np.ones(len(points)), np.full(len(points), world), stamps,
    )  # fmt: skip


def grid(
    steps: range, world: int = 8, skip: Any = lambda step, rank: False
) -> list[tuple[int, int, float]]:
    return [(s, r, 1.0 + 0.01 * r) for s in steps for r in range(world) if not skip(s, r)]


def seen(
    at: dict[int, float], first: float = 900.0, finished: dict[int, float] | None = None
) -> dict[int, RankActivity]:
    """Ranks' activity: the server last heard from rank r at ``at[r]``."""
    done = finished or {}
    return {r: RankActivity(first, t, done.get(r)) for r, t in at.items()}


def missing(
    windows: list[KeyWindow],
    th: Thresholds = TH,
    now: float = 2000.0,
    activity: dict[int, RankActivity] | None = None,
    known: dict[int, int] | None = None,
    first_after: Any = None,
    waiting: set[int] | None = None,
    held: frozenset[int] = frozenset(),
) -> list[detectors.Finding]:
    """rank_missing, with every rank heard from long ago unless ``activity`` says."""
    if activity is None:
        ranks = {int(r) for w in windows for r in w.rank}
        activity = seen(dict.fromkeys(ranks, 100.0), first=50.0)
    return detectors.rank_missing(
        windows, th, now, activity, known or {}, first_after or (lambda s: None), waiting, held
    )


def test_a_rank_is_missing_after_k_steps_others_reported() -> None:
    stops = grid(range(52), skip=lambda s, r: r == 3 and s >= 50)  # steps 50, 51 without it
    assert missing([window("loss", stops)]) == []
    stops = grid(range(53), skip=lambda s, r: r == 3 and s >= 50)  # 50, 51, 52: three
    (found,) = missing([window("loss", stops)])
    assert (found.kind, found.rank, found.key, found.since_step) == ("rank_missing", 3, None, 50)
    assert found.since_time == 1050.0  # when step 50 was first reported
    # K is a threshold: 5 steps
    th = TH.merged({"missing_steps": 5}, "health")
    assert missing([window("loss", stops)], th) == []


def test_a_rank_that_is_behind_but_sending_is_not_missing() -> None:
    """Upload lag (async batches, a spool uploader's round-robin) or a slow rank: 10 steps
    behind, heard from within lag_seconds, is not missing; quiet for lag_seconds, it is."""
    behind = grid(range(60), world=4, skip=lambda s, r: r == 1 and s >= 50)
    w = window("loss", behind, world=4)
    heard = {0: 1990.0, 1: 1986.0, 2: 1999.0, 3: 1999.0}  # rank 1: 14 s ago
    waiting: set[int] = set()
    assert missing([w], now=2000.0, activity=seen(heard), waiting=waiting) == []
    assert waiting == {1}  # looked at again once lag_seconds have passed
    (found,) = missing([w], now=2002.0, activity=seen(heard))  # past 15 s + the resolution
    assert (found.rank, found.since_step) == (1, 50)
    never = grid(range(10), world=4, skip=lambda s, r: r == 2)  # rank 2 never reported...
    w = window("loss", never, world=4)
    started = seen({0: 1999.0, 1: 1999.0, 3: 1999.0}, first=1990.0)  # ...10 s into the run
    assert missing([w], now=2000.0, activity=started) == []
    (late,) = missing([w], now=2006.0, activity=started)
    assert (late.rank, late.since_step) == (2, 0) and "never reported" in late.message


def test_an_open_alert_holds_while_the_rank_is_behind() -> None:
    """A late upload that leaves the rank behind (it sent something: not quiet) keeps its
    open alert, at the new first missed step; caught up, it is gone."""
    behind = grid(range(60), world=4, skip=lambda s, r: r == 1 and s >= 55)
    w = window("loss", behind, world=4)
    just_sent = seen({0: 1999.0, 1: 1999.0, 2: 1999.0, 3: 1999.0})
    assert missing([w], now=2000.0, activity=just_sent) == []
    (held,) = missing([w], now=2000.0, activity=just_sent, held=frozenset({1}))
    assert (held.rank, held.since_step) == (1, 55)
    caught_up = window("loss", grid(range(60), world=4), world=4)
    assert missing([caught_up], now=2000.0, activity=just_sent, held=frozenset({1})) == []


def test_a_rank_that_never_finished_when_the_others_did() -> None:
    """Killed after its last step (so never outpaced): missing once the others finished
    and it was quiet lag_seconds."""
    w = window("loss", grid(range(20), world=4), world=4)
    done = {0: 1990.0, 1: 1990.0, 3: 1991.0}
    activity = seen({0: 1990.0, 1: 1990.0, 2: 1989.0, 3: 1991.0}, finished=done)
    waiting: set[int] = set()
    assert missing([w], now=1995.0, activity=activity, waiting=waiting) == [] and waiting == {2}
    (found,) = missing([w], now=2010.0, activity=activity, first_after=lambda s: None)
    assert (found.rank, found.since_step) == (2, 20) and "did not finish" in found.message
    everyone = seen(dict.fromkeys(range(4), 1990.0), finished=dict.fromkeys(range(4), 1990.0))
    assert missing([w], now=2010.0, activity=everyone) == []


def test_missing_counts_steps_others_reported_not_step_numbers() -> None:
    # Steps every 10: rank 1 stops after 100; 110, 120, 130 reported by others.
    points = [(s, r, 1.0) for s in range(0, 140, 10) for r in range(4) if r != 1 or s <= 100]
    (found,) = missing([window("loss", points, world=4)])
    assert (found.rank, found.since_step) == (1, 110)


def test_a_rank_absent_from_the_window_uses_its_last_known_step() -> None:
    points = grid(range(100, 110), world=4, skip=lambda s, r: r == 2)
    stored = {80: 85, None: 0}  # the steps stored after 80 (logged every 5) and the first
    (found,) = missing([window("loss", points, world=4)], known={2: 80}, first_after=stored.get)
    assert (found.rank, found.since_step) == (2, 85)
    activity = seen({0: 100.0, 1: 100.0, 3: 100.0}, first=50.0)
    (never,) = missing([window("loss", points, world=4)], activity=activity, first_after=stored.get)
    assert (never.rank, never.since_step) == (2, 0)
    assert "never reported" in never.message


def test_ranks_above_the_latest_world_size_are_not_missing() -> None:
    # An elastic job that shrank from 8 to 4 ranks at step 10.
    points = grid(range(10)) + grid(range(10, 20), world=4)
    w = window("loss", points)
    sizes = np.where(w.step >= 10, 4, 8)
    w = KeyWindow(w.key, w.step, w.rank, w.value, w.weight, sizes, w.ts)
    assert missing([w]) == []


def test_a_silent_rank_is_missing_while_others_send() -> None:
    # Rank 2 was last heard from at t=1000, the others at t=1100, and no later step
    # exists, so no step rule: the silence rule, with T = 60 s.
    w = window("loss", [(5, r, 1.0) for r in range(4)], world=4)
    heard = seen({r: 1000.0 if r == 2 else 1100.0 for r in range(4)})
    (found,) = missing([w], now=1110.0, activity=heard)
    assert (found.rank, found.since_step) == (2, 6)
    assert "silent" in found.message
    assert missing([w], now=1050.0, activity=heard) == []  # 50 s: not yet
    assert missing([w], now=1200.0, activity=heard) == []  # everyone silent: none missing


def test_missing_takes_every_key_of_the_run() -> None:
    # Rank 1 reports only "b" from step 10: not missing (it reports).
    a = window("a", grid(range(20), world=2, skip=lambda s, r: r == 1 and s >= 10), world=2)
    b = window("b", grid(range(20), world=2), world=2)
    assert missing([a, b]) == []


@given(
    st.lists(
        st.lists(st.tuples(st.integers(0, 10**12), st.integers(0, 511)), max_size=40), max_size=4
    )
)
def test_last_steps_is_each_ranks_largest_step(keys: list[list[tuple[int, int]]]) -> None:
    """What the monitor remembers of a look (a rank's last step, for a rank absent from the
    next window): each rank's largest step over every key's window, in any order."""
    windows = [window(f"k{i}", [(s, r, 1.0) for s, r in points]) for i, points in enumerate(keys)]
    expected: dict[int, int] = {}
    for points in keys:
        for step, rank in points:
            expected[rank] = max(expected.get(rank, -1), step)
    assert detectors.last_steps(windows) == expected


def test_an_outlier_burst_needs_5_of_the_last_10_steps() -> None:
    def run(bad_steps: set[int]) -> list[detectors.Finding]:
        points = [(s, r, 50.0 if r == 2 and s in bad_steps else 1.0 + 0.01 * r)
                  for s in range(20) for r in range(8)]  # fmt: skip
        return detectors.outlier_bursts(window("loss", points), TH)

    assert run({12, 14, 16, 18}) == []  # 4 of the last 10
    (found,) = run({11, 14, 16, 17, 19})
    assert (found.kind, found.rank, found.key, found.since_step) == ("outlier_burst", 2, "loss", 11)
    assert run({1, 2, 3, 4, 5, 6}) == []  # outside the last 10 steps


def test_a_burst_on_a_timing_key_must_clear_the_straggler_floor() -> None:
    """A loop's data wait is microseconds: a scheduler's hiccup of a fraction of a
    millisecond scores a huge robust z, and is not a burst; a rank whose waits grow by
    milliseconds is, and so is the same hiccup on a key that is not a timing."""
    bad = {11, 13, 15, 17, 19}

    def run(key: str, extra: float) -> list[detectors.Finding]:
        points = [(s, r, 0.02 + 0.001 * r + (extra if r == 5 and s in bad else 0.0))
                  for s in range(20) for r in range(8)]  # fmt: skip
        return detectors.outlier_bursts(window(key, points), TH)

    assert TH.straggler_min_ms == 1.0
    assert run("perf/data_wait_ms", 0.4) == []
    (found,) = run("perf/data_wait_ms", 3.0)
    assert (found.rank, found.since_step) == (5, 11)
    (found,) = run("optimizer/grad_norm", 0.4)
    assert (found.rank, found.since_step) == (5, 11)


def test_non_finite_names_the_rank_and_its_first_step() -> None:
    points = [(s, r, float("nan") if (r, s) in {(4, 7), (4, 8)} else 1.0)
              for s in range(5, 10) for r in range(8)]  # fmt: skip
    w = window("loss", points)
    assert detectors.nonfinite_ranks(w) == {4}
    # The first step comes from the stored points (a late upload may be before the window).
    (found,) = detectors.non_finite(w, {4: (2, float("nan"))}, 5000.0)
    assert (found.kind, found.rank, found.key, found.since_step) == ("non_finite", 4, "loss", 2)
    assert "nan" in found.message and found.since_time == 5000.0
    (here,) = detectors.non_finite(w, {4: (7, float("nan"))}, 5000.0)
    assert here.since_time == 1007.0
    assert detectors.nonfinite_ranks(window("loss", grid(range(10)))) == set()


def test_stragglers_score_below_the_threshold() -> None:
    # Scores: the fastest median over each rank's: 1.0, 0.95, 0.71, 0.5.
    medians = {0: (10.0, 30), 1: (10.5, 30), 2: (14.0, 30), 3: (20.0, 30)}
    found = detectors.stragglers("perf/forward_ms", (0, 29), medians, TH, 5.0)
    assert [(f.kind, f.rank, f.key, f.since_step) for f in found] == [
        ("straggler", 3, "perf/forward_ms", 29),
        ("straggler", 2, "perf/forward_ms", 29),
    ]
    lower = TH.merged({"straggler_score": 0.6}, "health")
    assert [f.rank for f in detectors.stragglers("k", (0, 29), medians, lower, 5.0)] == [3]
    assert detectors.stragglers("k", None, {}, TH, 5.0) == []


def test_stragglers_need_samples_and_a_real_gap() -> None:
    """Two samples, or medians a fraction of a millisecond apart, say nothing."""
    few = {0: (10.0, 2), 1: (20.0, 2)}
    assert detectors.stragglers("perf/forward_ms", (0, 1), few, TH, 5.0) == []
    one_short = {0: (10.0, 30), 1: (20.0, 19)}  # rank 1 has 19 of 20 samples
    assert detectors.stragglers("perf/forward_ms", (0, 29), one_short, TH, 5.0) == []
    tiny = {0: (0.043, 30), 1: (0.074, 30)}  # score 0.58, but 0.031 ms apart
    assert detectors.stragglers("perf/forward_ms", (0, 29), tiny, TH, 5.0) == []
    fine = TH.merged({"straggler_min_ms": 0.01}, "health")
    assert [f.rank for f in detectors.stragglers("k", (0, 29), tiny, fine, 5.0)] == [1]


def test_status_from_open_kinds() -> None:
    assert detectors.status([]) == "ok"
    assert detectors.status(["straggler", "outlier_burst"]) == "warning"
    assert detectors.status(["straggler", "rank_missing"]) == "critical"
    assert detectors.status(["non_finite"]) == "critical"


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"missing_steps": 0}, "health.missing_steps"),
        ({"missing_steps": 2.5}, "health.missing_steps"),
        ({"straggler_score": 1.5}, "health.straggler_score"),
        ({"silent_seconds": -1}, "health.silent_seconds"),
        ({"burst_z": "3"}, "health.burst_z"),
        ({"enabled": 1}, "health.enabled"),
        ({"lag_seconds": 0}, "health.lag_seconds"),
        ({"straggler_min_steps": 0}, "health.straggler_min_steps"),
        ({"straggler_min_steps": 1.5}, "health.straggler_min_steps"),
        ({"straggler_min_ms": -1}, "health.straggler_min_ms"),
        ({"nope": 1}, "health.nope"),
    ],
)
def test_bad_thresholds_name_the_field(values: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        Thresholds().merged(values, "health")


def test_server_thresholds_from_env() -> None:
    assert from_env(None) == Thresholds()
    assert from_env('{"missing_steps": 7}').missing_steps == 7
    with pytest.raises(ValueError, match="INSTANTML_HEALTH"):
        from_env("[1]")
    with pytest.raises(ValueError, match=r"INSTANTML_HEALTH\.burst_steps"):
        from_env('{"burst_steps": 0}')
