"""``GET /api/runs/{id}/stragglers``: per-rank scores of a timing key over its last window
of steps (the fastest rank's median over each rank's; below 0.75 a straggler), held to
numpy medians; and the terminal and browser views of them."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import numpy as np
import pytest

from instantml.server.process import ServerProcess
from tests.summary.reference import Point
from tests.summary.test_reference import ingest

KEY = "perf/forward_ms"


def _job(api: httpx.Client) -> tuple[str, list[Point]]:
    """8 ranks, 300 steps; rank 5 twice as slow from step 150 on (it heated up), rank 3
    never reports after step 100, rank 1 has a NaN now and then."""
    rng = np.random.default_rng(11)
    writes = []
    for s in range(300):
        for r in range(8):
            if r == 3 and s > 100:
                continue
            value = 10.0 + rng.normal(0, 0.3) + (10.0 if (r == 5 and s >= 150) else 0.0)
            if r == 1 and s % 37 == 0:
                value = float("nan")
            writes.append(Point(s, r, value, 1.0, r, 8))
    return ingest(api, writes, key=KEY), writes


def test_scores_equal_numpy_medians_over_the_window(api: httpx.Client) -> None:
    run_id, writes = _job(api)
    for window in (200, 100, 1000):
        got = api.get(
            f"/api/runs/{run_id}/stragglers", params={"key": KEY, "window": window}
        ).json()
        first = max(0, 300 - window)
        assert got["step_range"] == [first, 299] and got["threshold"] == 0.75
        medians = {
            r: float(np.median([p.value for p in writes
                                if p.rank == r and p.step >= first and np.isfinite(p.value)]))
            for r in {p.rank for p in writes if p.step >= first}
        }  # fmt: skip
        samples = {r: sum(1 for p in writes if p.rank == r and p.step >= first
                          and np.isfinite(p.value)) for r in medians}  # fmt: skip
        reference = min(m for r, m in medians.items() if samples[r] >= 20)  # judged ranks'
        want = {r: min(1.0, reference / m) for r, m in medians.items()}
        assert {row["rank"]: row["score"] for row in got["ranks"]} == pytest.approx(want, rel=1e-12)
        assert got["reference"] == pytest.approx(reference)
        assert got["ranks"][0]["rank"] == 5  # the worst first
        assert got["stragglers"] == sorted(r for r, score in want.items() if score < 0.75)
        assert got["stragglers"] == [5]
    # Rank 5 is twice as slow in the last 100 steps: score ~0.5.
    last = api.get(f"/api/runs/{run_id}/stragglers", params={"key": KEY, "window": 100}).json()
    assert last["ranks"][0]["score"] == pytest.approx(0.5, abs=0.02)
    # Zoomed to steps ..149, before rank 5 heated up: the window ends there, no straggler.
    zoom = api.get(
        f"/api/runs/{run_id}/stragglers", params={"key": KEY, "window": 100, "step_max": 149}
    ).json()
    assert zoom["step_range"] == [50, 149] and zoom["stragglers"] == []
    # Rank 3's one sample in the 200-step window is scored, but never judged.
    wide = api.get(f"/api/runs/{run_id}/stragglers", params={"key": KEY, "window": 200}).json()
    (three,) = [row for row in wide["ranks"] if row["rank"] == 3]
    assert three["steps"] == 1 and not three["judged"] and not three["straggler"]


def test_errors_name_what_exists(api: httpx.Client, run_id: str) -> None:
    assert api.get(f"/api/runs/{run_id}/stragglers").status_code == 404  # no rank metrics yet
    rid, _ = _job(api)
    missing = api.get(f"/api/runs/{rid}/stragglers", params={"key": "perf/step_time_ms"})
    assert missing.status_code == 404 and KEY in missing.json()["error"]
    bad = api.get(f"/api/runs/{rid}/stragglers", params={"window": 0})
    assert bad.status_code == 422 and "window" in bad.json()["error"]
    assert api.get("/api/runs/nope/stragglers").status_code == 404


def test_ranks_stragglers_in_the_terminal(server: ServerProcess, api: httpx.Client) -> None:
    run_id, _ = _job(api)
    env = {**os.environ, "INSTANTML_API_BASE_URL": server.url,
           "INSTANTML_API_KEY": server.admin_key, "COLUMNS": "120", "NO_COLOR": "1"}  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", "instantml", "ranks", run_id, "--stragglers", "--window", "100"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "perf/forward_ms: last 100 steps (200-299): stragglers rank 5 (2.0" in out.stdout
