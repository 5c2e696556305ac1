"""The robust score (docs/reference.md, "The Distributed summary"): ``robust_z`` with the MAD's
small-sample factor and the key's typical spread as its floor, as the stores and the
detectors compute it (``step_stats``), held to the plain reading in ``reference.py``;
scored in pieces (a store scores new steps after the ones it holds) it is the same; and
what it is for: ordinary per-batch noise on 2-8 ranks is rarely an outlier, a real
excursion is."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from instantml.rankmath.step_stats import REFERENCE_STEPS, robust_spread, step_stats
from tests.summary.reference import Point, reference


def scores(steps: np.ndarray, values: np.ndarray, history: np.ndarray | None = None) -> np.ndarray:
    ones = np.ones(len(values))
    return step_stats(steps, values, ones, ones, history)[3]


@st.composite
def keys(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    """A key's points: 1-9 ranks over 1-150 steps, some absent, ties and marks among them."""
    world = draw(st.integers(1, 9))
    n_steps = draw(st.integers(1, 150))
    kind = draw(st.sampled_from(["normal", "ties", "coarse"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    steps, values = [], []
    for s in range(n_steps):
        for _ in range(world):
            if rng.random() < 0.15:
                continue
            if kind == "normal":
                value = float(rng.normal(3.0, 0.2))
            elif kind == "ties":
                value = float(rng.choice([1.0, 1.0, 1.0, 2.0]))
            else:
                value = float(np.round(rng.normal(3.0, 0.2), 1))
            if rng.random() < 0.03:
                value = math.nan
            steps.append(s)
            values.append(value)
    return np.array(steps, dtype=np.int64), np.array(values)


@settings(max_examples=150, deadline=None)
@given(keys())
def test_robust_z_equals_the_reference(key: tuple[np.ndarray, np.ndarray]) -> None:
    steps, values = key
    assume(len(steps) > 0)
    ranks = np.zeros(len(steps), dtype=np.int64)
    for s in np.unique(steps):  # one point per (step, rank)
        at = steps == s
        ranks[at] = np.arange(int(at.sum()))
    writes = [Point(int(s), int(r), float(v), 1.0, None, 16)
              for s, r, v in zip(steps, ranks, values, strict=True)]  # fmt: skip
    want = {(row["step"], row["rank"]): row["robust_z"] for row in reference(writes)["all_scores"]}
    got = scores(steps, values)
    for s, r, v, z in zip(steps.tolist(), ranks.tolist(), values, got, strict=True):
        if math.isfinite(v):
            assert math.isclose(z, want[(s, r)], rel_tol=1e-9, abs_tol=1e-9), (s, r, z)
        else:
            assert math.isnan(z)


@settings(max_examples=100, deadline=None)
@given(keys(), st.integers(0, 150))
def test_scored_in_pieces_it_is_the_same(key: tuple[np.ndarray, np.ndarray], cut: int) -> None:
    """The steps after ``cut``, scored with the spreads of the qualifying steps before it
    (the last 63, as a store keeps them), score as they do scored with the whole key."""
    steps, values = key
    before = steps < cut
    assume((~before).any())
    whole = scores(steps, values)
    if before.any():
        stats = step_stats(steps[before], values[before], np.ones(before.sum()),
                           np.ones(before.sum()))[0]  # fmt: skip
        qualifying = stats["n"] >= 2
        history = robust_spread(stats["n"][qualifying], stats["mad"][qualifying])
        history = history[-(REFERENCE_STEPS - 1) :]
    else:
        history = None
    after = scores(steps[~before], values[~before], history)
    np.testing.assert_allclose(after, whole[~before], rtol=1e-9, atol=1e-12)


def test_noise_is_rarely_an_outlier_and_an_excursion_is() -> None:
    """4 ranks x 400 steps of 5% Gaussian noise, 50 seeds: the per-step MAD alone (the
    old score) flags about 65 rows in each; this score a few. A 10-sigma excursion of one
    rank at one step is flagged at least 3 times in 4, whatever the step."""
    old_flagged, flagged = [], []
    for seed in range(50):
        rng = np.random.default_rng(seed)
        steps = np.repeat(np.arange(400), 4)
        values = 1.0 + 0.05 * rng.standard_normal(len(steps))
        flagged.append(int((np.abs(scores(steps, values)) >= 3.5).sum()))
        v = values.reshape(400, 4)
        med = np.median(v, axis=1, keepdims=True)
        mad = np.median(np.abs(v - med), axis=1, keepdims=True)
        old_flagged.append(int((np.abs(0.6745 * (v - med) / mad) >= 3.5).sum()))
    assert np.mean(old_flagged) > 40  # the score this replaced
    assert np.mean(flagged) <= 4 and max(flagged) <= 12, flagged
    rng = np.random.default_rng(7)
    steps = np.repeat(np.arange(400), 4)
    values = 1.0 + 0.05 * rng.standard_normal(len(steps))
    hits = 0
    for s in range(64, 400, 4):
        bumped = values.copy()
        bumped[4 * s + 2] += 0.5
        hits += bool(abs(scores(steps, bumped)[4 * s + 2]) >= 3.5)
    assert hits >= 0.75 * len(range(64, 400, 4)), hits
