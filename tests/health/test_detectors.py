"""The detectors' definitions (DESIGN.md, "Run health"), on hand-made windows, and the
thresholds' checks."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from instantml.health import detectors
from instantml.health.detectors import KeyWindow
from instantml.health.thresholds import Thresholds, from_env

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


def test_a_rank_is_missing_after_k_steps_others_reported() -> None:
    stops = grid(range(52), skip=lambda s, r: r == 3 and s >= 50)  # steps 50, 51 without it
    assert detectors.rank_missing([window("loss", stops)], TH, 2000.0, {}) == []
    stops = grid(range(53), skip=lambda s, r: r == 3 and s >= 50)  # 50, 51, 52: three
    (found,) = detectors.rank_missing([window("loss", stops)], TH, 2000.0, {})
    assert (found.kind, found.rank, found.key, found.since_step) == ("rank_missing", 3, None, 50)
    assert found.since_time == 1050.0  # when step 50 was first reported
    # K is a threshold: 5 steps
    th = TH.merged({"missing_steps": 5}, "health")
    assert detectors.rank_missing([window("loss", stops)], th, 2000.0, {}) == []


def test_missing_counts_steps_others_reported_not_step_numbers() -> None:
    # Steps every 10: rank 1 stops after 100; 110, 120, 130 reported by others.
    points = [(s, r, 1.0) for s in range(0, 140, 10) for r in range(4) if r != 1 or s <= 100]
    (found,) = detectors.rank_missing([window("loss", points, world=4)], TH, 2000.0, {})
    assert (found.rank, found.since_step) == (1, 110)


def test_a_rank_absent_from_the_window_uses_its_last_known_step() -> None:
    points = grid(range(100, 110), world=4, skip=lambda s, r: r == 2)
    (found,) = detectors.rank_missing([window("loss", points, world=4)], TH, 2000.0, {2: 80})
    assert (found.rank, found.since_step) == (2, 81)
    (never,) = detectors.rank_missing([window("loss", points, world=4)], TH, 2000.0, {})
    assert (never.rank, never.since_step) == (2, 100)
    assert "never reported" in never.message


def test_ranks_above_the_latest_world_size_are_not_missing() -> None:
    # An elastic job that shrank from 8 to 4 ranks at step 10.
    points = grid(range(10)) + grid(range(10, 20), world=4)
    w = window("loss", points)
    sizes = np.where(w.step >= 10, 4, 8)
    w = KeyWindow(w.key, w.step, w.rank, w.value, w.weight, sizes, w.ts)
    assert detectors.rank_missing([w], TH, 2000.0, {}) == []


def test_a_silent_rank_is_missing_while_others_log() -> None:
    # Rank 2 reported step 5 at t=1000; the others reported step 5 at t=1100 and no later
    # step exists, so no step rule: the silence rule, with T = 60 s.
    points = [(5, r, 1.0) for r in range(4)]
    stamps = [1000.0 if r == 2 else 1100.0 for r in range(4)]
    w = window("loss", points, world=4, ts=stamps)
    (found,) = detectors.rank_missing([w], TH, 1110.0, {})
    assert (found.rank, found.since_step, found.since_time) == (2, 6, 1000.0)
    assert "silent" in found.message
    assert detectors.rank_missing([w], TH, 1050.0, {}) == []  # 50 s: not yet
    assert detectors.rank_missing([w], TH, 1200.0, {}) == []  # everyone silent: none missing


def test_missing_takes_every_key_of_the_run() -> None:
    # Rank 1 reports only "b" from step 10: not missing (it reports).
    a = window("a", grid(range(20), world=2, skip=lambda s, r: r == 1 and s >= 10), world=2)
    b = window("b", grid(range(20), world=2), world=2)
    assert detectors.rank_missing([a, b], TH, 2000.0, {}) == []


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


def test_non_finite_names_the_rank_and_first_step() -> None:
    points = [(s, r, float("nan") if (r, s) in {(4, 7), (4, 8)} else 1.0)
              for s in range(10) for r in range(8)]  # fmt: skip
    (found,) = detectors.non_finite(window("loss", points), TH)
    assert (found.kind, found.rank, found.key, found.since_step) == ("non_finite", 4, "loss", 7)
    assert "nan" in found.message
    assert detectors.non_finite(window("loss", grid(range(10))), TH) == []


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
