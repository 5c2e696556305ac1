"""Runs side by side: ``GET /api/compare`` and ``instantml ranks A --compare B``."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from instantml.server.process import ServerProcess
from tests.helpers import instantml, rank_body


def _job(api: httpx.Client, slow_rank: int | None, loss: float, steps: int = 30) -> str:
    run_id = f"cmp-{uuid.uuid4().hex[:8]}"
    api.post("/runs", json={"project": "compare", "id": run_id}).raise_for_status()
    events = []
    for step in range(steps):
        for rank in range(4):
            metrics = {"train/loss": loss + 0.01 * rank,
                       "perf/forward_ms": 40.0 if rank == slow_rank else 10.0}  # fmt: skip
            body = rank_body(step=step, rank=rank, world_size=4, metrics=metrics,
                             node="n0" if rank < 2 else "n1")  # fmt: skip
            events.append({"event_id": f"{run_id}-{step}-{rank}", "request": {
                "method": "POST", "path": f"/runs/{run_id}/rank-metrics", "body": body}})  # fmt: skip
    api.post("/api/ingest", json={"events": events}).raise_for_status()
    return run_id


@pytest.fixture
def before_after(api: httpx.Client) -> tuple[str, str]:
    """A run with a straggler (rank 3) and the run after the fix."""
    return _job(api, 3, 2.0), _job(api, None, 1.5)


def test_two_runs_side_by_side(api: httpx.Client, before_after: tuple[str, str]) -> None:
    before, after = before_after
    got = api.get("/api/compare", params={"runs": f"{before},{after}"}).json()
    assert got["key"] == "train/loss"  # a loss both have, as the summary defaults
    (a, b) = got["runs"]
    assert (a["run"]["id"], b["run"]["id"]) == (before, after)
    assert a["world_size"] == b["world_size"] == 4 and len(a["steps"]) == 30
    assert a["last"]["mean"] == pytest.approx(2.015) and b["last"]["mean"] == pytest.approx(1.515)
    assert {r["rank"] for r in a["ranks"]} == {0, 1, 2, 3} and a["coverage"]["missing"] == []
    assert [n["node"] for n in a["nodes"]] == ["n0", "n1"]
    # Straggler scores of both: the fix is visible.
    assert a["stragglers"]["key"] == "perf/forward_ms" and a["stragglers"]["stragglers"] == [3]
    assert b["stragglers"]["stragglers"] == []
    assert {n["node"]: n["straggler"] for n in a["stragglers"]["nodes"]} == {
        "n0": False,
        "n1": True,
    }
    timing = api.get("/api/compare", params={"runs": f"{before},{after}", "key": "perf/forward_ms"})
    assert timing.json()["runs"][0]["stragglers"]["key"] == "perf/forward_ms"


@pytest.mark.parametrize(
    ("runs", "status", "field"),
    [("one", 422, "runs"), ("a,a", 422, "runs"), (",".join("abcdefghi"), 422, "runs")],
)
def test_bad_compare_requests(api: httpx.Client, runs: str, status: int, field: str) -> None:
    response = api.get("/api/compare", params={"runs": runs})
    assert response.status_code == status and response.json()["error"].startswith(f"{field}:")


def test_an_unknown_run_or_key_is_404(api: httpx.Client, before_after: tuple[str, str]) -> None:
    before, _ = before_after
    missing = api.get("/api/compare", params={"runs": f"{before},nope"})
    assert missing.status_code == 404 and "nope" in missing.json()["error"]
    no_key = api.get("/api/compare", params={"runs": ",".join(before_after), "key": "x"})
    assert no_key.status_code == 404 and "'x'" in no_key.json()["error"]


def test_ranks_compare_in_the_terminal(
    server: ServerProcess, before_after: tuple[str, str]
) -> None:
    before, after = before_after
    env: dict[str, Any] = {"INSTANTML_API_BASE_URL": server.url,
                           "INSTANTML_API_KEY": server.admin_key, "COLUMNS": "200"}  # fmt: skip
    out = instantml("ranks", before, "--compare", after, env=env)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert before in text and after in text and "train/loss: 2 runs" in text
    rows = [" ".join(line.replace("\u2502", " ").split()) for line in text.splitlines()]
    (slow,) = [row for row in rows if row.startswith("slow nodes")]
    assert slow.split()[2:] == ["n1", "-"], slow  # the run after the fix: none
