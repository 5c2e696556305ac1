"""The four questions the Distributed tab answers, each built and checked end to end."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from tests.summary.reference import Point
from tests.summary.test_reference import ingest, summary


def test_a_rank_that_stops_is_named_with_the_step_it_vanished(api: httpx.Client) -> None:
    writes = [
        Point(s, r, 1.0 + r, 1.0, r, 8)
        for s in range(100)
        for r in range(8)
        if not (r == 5 and s > 60)
    ]
    got = summary(api, ingest(api, writes))
    assert got["coverage"]["missing"] == [
        {"rank": 5, "last_seen_step": 60, "first_missing_step": 61}
    ]
    assert (got["coverage"]["full_steps"], got["coverage"]["partial_steps"]) == (61, 39)
    assert got["steps"][61]["count"] == 7 and got["steps"][61]["expected"] == 8


def test_one_stray_call_with_a_larger_world_size_lists_no_phantom_ranks(
    api: httpx.Client,
) -> None:
    # A 4-rank job; one call at step 3 said world_size=512 (a bug in a launcher script).
    writes = [
        Point(s, r, 1.0 + r, 1.0, r, 512 if (s, r) == (3, 1) else 4)
        for s in range(10)
        for r in range(4)
        if not (r == 2 and s > 6)
    ]
    got = summary(api, ingest(api, writes))
    assert got["world_size"] == 512  # the key's largest, as docs/reference.md defines it
    assert got["coverage"]["missing"] == [{"rank": 2, "last_seen_step": 6, "first_missing_step": 7}]
    # An elastic job that shrank from 8 to 4 ranks at step 5: the last step's world size.
    shrunk = [
        Point(s, r, 1.0, 1.0, None, 8 if s < 5 else 4)
        for s in range(10)
        for r in range(8 if s < 5 else 4)
    ]
    assert summary(api, ingest(api, shrunk))["coverage"]["missing"] == []


def test_a_rank_that_never_reported_is_missing_from_the_first_step(api: httpx.Client) -> None:
    writes = [Point(s, r, 1.0, 1.0, None, 4) for s in range(10, 20) for r in (0, 1, 3)]
    got = summary(api, ingest(api, writes))
    assert got["coverage"]["missing"] == [
        {"rank": 2, "last_seen_step": None, "first_missing_step": 10}
    ]


def test_a_slower_noisier_rank_heads_the_rollup(api: httpx.Client) -> None:
    rng = np.random.default_rng(3)
    writes = [
        Point(s, r, float(rng.normal(130, 25) if r == 2 else rng.normal(100, 2)), 1.0, r, 8)
        for s in range(200)
        for r in range(8)
    ]
    got = summary(api, ingest(api, writes, key="perf/step_time_ms"))
    head = got["ranks"][0]
    assert head["rank"] == 2
    assert head["mean_delta"] > 20  # consistently slower ...
    assert head["mean_abs_z"] > 2 * max(
        r["mean_abs_z"] for r in got["ranks"][1:]
    )  # ... and noisier


def test_outlier_losses_at_world_size_8_are_caught_by_robust_z(api: httpx.Client) -> None:
    rng = np.random.default_rng(5)
    spikes = {17, 42, 43, 88}
    writes = [
        Point(
            s, r, float(8.0 if (r == 6 and s in spikes) else rng.normal(2.0, 0.05)), 1.0, r % 4, 8
        )
        for s in range(100)
        for r in range(8)
    ]
    got = summary(api, ingest(api, writes))
    flagged = {(o["step"], o["rank"]) for o in got["outliers"] if abs(o["robust_z"]) >= 3.5}
    assert {(s, 6) for s in spikes} <= flagged
    # With 8 ranks |z| cannot exceed sqrt(7) = 2.65 (Samuelson), so z alone would miss them.
    assert all(abs(o["z"]) <= np.sqrt(7) + 1e-9 for o in got["outliers"])
    assert not any(abs(o["z"]) >= 3 for o in got["outliers"])
    top = got["outliers"][:4]
    assert {(o["step"], o["rank"]) for o in top} == {(s, 6) for s in spikes}
    assert top[0]["local_rank"] == 2 and top[0]["value"] == 8.0
    assert next(r for r in got["ranks"] if r["rank"] == 6)["outlier_steps"] >= 4


def test_skewed_weights_part_the_means_by_a_known_amount(api: httpx.Client) -> None:
    writes = [
        Point(s, r, float(r), 1000.0 if r == 7 else 1.0, r, 8) for s in range(5) for r in range(8)
    ]
    got = summary(api, ingest(api, writes))
    for row in got["steps"]:
        assert row["mean"] == pytest.approx(3.5, rel=1e-12)
        assert row["weighted_mean"] == pytest.approx((21 + 7 * 1000) / 1007, rel=1e-12)


def test_a_spike_and_a_coverage_dip_survive_bucketing(api: httpx.Client) -> None:
    writes = [
        Point(s, r, 100.0 if (s == 7_777 and r == 1) else 1.0, 1.0, None, 8)
        for s in range(10_000)
        for r in range(8)
        if not (s == 4_242 and r == 3)
    ]
    run_id = ingest(api, writes)
    got = summary(api, run_id, max_points=10, heatmap_steps=10)
    # Buckets of the smallest block size of at least 1,000 steps, from step 0: 1,024.
    assert got["bucket_size"] == 1024 and len(got["steps"]) == 10
    spike = got["steps"][7]
    assert (spike["step"], spike["step_end"], spike["max"]) == (7168, 8191, 100.0)
    assert max(row["max"] for i, row in enumerate(got["steps"]) if i != 7) == 1.0
    dip = got["steps"][4]
    assert (dip["count"], dip["expected"]) == (7, 8)
    assert all(row["count"] == 8 for i, row in enumerate(got["steps"]) if i != 4)
    assert got["heatmap"]["buckets"][7] == [7168, 8191] and len(got["heatmap"]["values"][0]) == 10
    assert got["heatmap"]["buckets"][-1] == [9216, 9999]  # the last bucket is partial
    # Zooming gives full resolution again.
    zoom = summary(api, run_id, step_min=7_770, step_max=7_780)
    assert zoom["bucket_size"] == 1 and len(zoom["steps"]) == 11
    assert zoom["steps"][7]["max"] == 100.0


def test_errors(api: httpx.Client, run_id: str) -> None:
    assert api.get(f"/api/runs/{run_id}/distributed").status_code == 404  # no rank metrics yet
    assert api.get("/api/runs/nope/distributed").status_code == 404
    writes = [Point(0, 0, 1.0, 1.0, None, 1)]
    rid = ingest(api, writes)
    assert api.get(f"/api/runs/{rid}/distributed", params={"key": "other"}).status_code == 404
    for bad in (
        {"max_points": 0},
        {"z": -1},
        {"step_min": 5, "step_max": 2},
        {"heatmap_steps": "x"},
    ):
        response = api.get(f"/api/runs/{rid}/distributed", params=bad)
        assert response.status_code == 422, bad
        assert next(iter(bad)) in response.json()["error"]
    empty = summary(api, rid, step_min=10)
    assert empty["steps"] == [] and empty["world_size"] == 1 and empty["step_range"] is None
