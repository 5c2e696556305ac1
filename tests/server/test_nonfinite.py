"""NaN and +-inf are data (docs/reference.md, "The Distributed summary"): logged without an
exception in every upload mode, sent as the body's ``nonfinite`` marks, stored per (key,
step, rank), counted as metric points, and kept out of every reducer, score and heatmap
cell."""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

import instantml as im
from instantml.server.process import ServerProcess
from tests.helpers import admin_client, rank_body, stored_keys, stored_rank_points, stored_scalars
from tests.spool.conftest import sync
from tests.summary.test_reference import summary

NAN, INF = math.nan, math.inf


def _log_diverging_job(run: im.Run) -> None:
    """4 ranks, 6 steps; rank 2 goes NaN at step 3 and inf at step 4, -inf at 5 for 'x'."""
    for step in range(6):
        for rank in range(4):
            loss: Any = float(rank + step)
            if rank == 2 and step >= 3:
                loss = {3: NAN, 4: INF, 5: -INF}[step]
            run.log_rank_metrics(
                {"loss": loss, "grad": np.array(1.5)},  # a 0-dim array counts as its number
                step=step,
                rank=rank,
                world_size=4,
            )
    run.log({"eval/loss": NAN, "eval/acc": np.float32(0.5)}, step=5)


@pytest.mark.parametrize("mode", ["sync", "async", "spool"])
def test_every_mode_logs_nonfinite_values_as_marks(
    mode: str, start_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = start_server()
    run_id = f"nf-{mode}-{uuid.uuid4().hex[:6]}"
    spool = tmp_path / "spool"
    run = im.init(
        project="nf",
        run_id=run_id,
        upload_mode=mode,
        spool_dir=str(spool),
        base_url=server.url,
        api_key=server.admin_key,
    )
    _log_diverging_job(run)  # not one exception in the training loop
    assert run.finish(timeout=30) is True
    if mode == "spool":
        out = sync(spool, server.url, server.admin_key)
        assert out.returncode == 0 and "0 refused" in out.stdout, out.stdout + out.stderr
    with admin_client(server) as api:
        points = stored_rank_points(api, run_id, "loss")
        assert len(points) == 24
        marks = {(p[0], p[1]): p[2] for p in points if isinstance(p[2], str)}
        assert marks == {(3, 2): "nan", (4, 2): "inf", (5, 2): "-inf"}
        assert len(stored_rank_points(api, run_id, "grad")) == 24
        scalar = stored_scalars(api, run_id, "eval/loss")
        assert scalar["points"] == [] and scalar["nonfinite"] == [[5, "nan"]]
        assert stored_scalars(api, run_id, "eval/acc")["points"] == [[5, 0.5]]
        got = summary(api, run_id, key="loss")
    assert got["first_nonfinite"] == {"step": 3, "rank": 2, "value": "nan"}
    assert [s["nonfinite"] for s in got["steps"]] == [0, 0, 0, 1, 1, 1]
    assert [s["count"] for s in got["steps"]] == [4, 4, 4, 3, 3, 3]
    # Rank 2 reported every step (a NaN is a report), so coverage is full and nobody missing.
    assert got["coverage"] == {"full_steps": 6, "partial_steps": 0, "missing": [], "lagging": []}
    step3 = got["steps"][3]
    assert step3["mean"] == pytest.approx((3 + 4 + 6) / 3)  # ranks 0, 1, 3 only
    rank2 = next(r for r in got["ranks"] if r["rank"] == 2)
    assert (rank2["steps_reported"], rank2["nonfinite_steps"], rank2["last_step"]) == (3, 3, 5)
    row = got["heatmap"]["ranks"].index(2)
    assert got["heatmap"]["values"][row][3:] == [None, None, None]
    assert got["heatmap"]["nonfinite"] == [[row, 3], [row, 4], [row, 5]]
    assert all(o["rank"] != 2 or o["step"] < 3 for o in got["outliers"])
    assert "NaN" not in json.dumps(got)


def test_marks_count_as_metric_points_and_replay_alike(
    start_server: Callable[..., ServerProcess],
) -> None:
    server = start_server()
    with admin_client(server) as api:
        assert api.post("/runs", json={"project": "p", "id": "marks"}).status_code == 201
        body = rank_body(metrics={"a": 1.0}, nonfinite={"b": "nan", "c": "-inf"})
        first = api.post("/runs/marks/rank-metrics", json=body, headers={"Idempotency-Key": "k1"})
        assert first.status_code == 200 and first.json() == {"accepted": 3}
        # The same event through the batch route (the fast decoder must not drop the marks).
        events = [
            {
                "event_id": "k1",
                "request": {"method": "POST", "path": "/runs/marks/rank-metrics", "body": body},
            },
            {
                "event_id": "k2",
                "request": {
                    "method": "POST",
                    "path": "/runs/marks/rank-metrics",
                    "body": rank_body(step=2, metrics={"a": 2.0}, nonfinite={"b": "inf"}),
                },
            },
            {
                "event_id": "k3",
                "request": {
                    "method": "POST",
                    "path": "/runs/marks/rank-metrics",
                    "body": {k: v for k, v in rank_body(step=3).items() if k != "metrics"}
                    | {"nonfinite": {"a": "nan"}},
                },
            },
        ]
        results = api.post("/api/ingest", json={"events": events}).json()["results"]
        assert [(r["status"], r.get("replayed", False)) for r in results] == [
            (200, True),
            (200, False),
            (200, False),
        ]
        assert [r["body"] for r in results] == [{"accepted": 3}, {"accepted": 2}, {"accepted": 1}]
        assert api.get("/api/usage").json()["used"] == 6
        assert stored_rank_points(api, "marks", "b") == [
            [1, 0, "nan", 1.0, 0, 8],
            [2, 0, "inf", 1.0, 0, 8],
        ]
        assert stored_rank_points(api, "marks", "a")[-1][:3] == [3, 0, "nan"]


def test_a_mark_replaces_a_value_and_a_value_a_mark(api: httpx.Client, run_id: str) -> None:
    path = f"/runs/{run_id}/rank-metrics"
    for step in range(3):
        for rank in range(2):
            assert (
                api.post(path, json=rank_body(step=step, rank=rank, world_size=2)).status_code
                == 200
            )
    before = summary(api, run_id)
    assert before["first_nonfinite"] is None and before["outliers_total"] == 0
    nan_body = {k: v for k, v in rank_body(step=1, rank=1, world_size=2).items() if k != "metrics"}
    assert api.post(path, json={**nan_body, "nonfinite": {"train/loss": "nan"}}).status_code == 200
    got = summary(api, run_id)
    assert got["first_nonfinite"] == {"step": 1, "rank": 1, "value": "nan"}
    assert (got["steps"][1]["count"], got["steps"][1]["nonfinite"]) == (1, 1)
    assert api.post(path, json=rank_body(step=1, rank=1, world_size=2)).status_code == 200
    again = summary(api, run_id)
    assert again["first_nonfinite"] is None and again["steps"][1]["count"] == 2


NONFINITE_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("bad mark", rank_body(nonfinite={"x": "NaN"}), "nonfinite"),
    ("number mark", rank_body(nonfinite={"x": 1.0}), "nonfinite"),
    ("marks a list", rank_body(nonfinite=["nan"]), "nonfinite"),
    ("empty marks", rank_body(nonfinite={}), "nonfinite"),
    ("key in both", rank_body(nonfinite={"train/loss": "nan"}), "nonfinite"),
    ("empty key", rank_body(nonfinite={"": "nan"}), "nonfinite"),
]


@pytest.mark.parametrize(
    ("case", "body", "field"), NONFINITE_CASES, ids=[c[0] for c in NONFINITE_CASES]
)
def test_bad_marks_are_refused_naming_the_field(
    api: httpx.Client, run_id: str, case: str, body: dict[str, Any], field: str
) -> None:
    response = api.post(f"/runs/{run_id}/rank-metrics", json=body)
    assert response.status_code == 422 and field in response.json()["error"], response.text
    event = {
        "event_id": f"bad-{case}",
        "request": {"method": "POST", "path": f"/runs/{run_id}/rank-metrics", "body": body},
    }
    (result,) = api.post("/api/ingest", json={"events": [event]}).json()["results"]
    assert result["status"] == 422 and field in result["body"]["error"], result
    assert stored_keys(api, run_id) == []


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_json_nan_tokens_stay_refused_with_400(api: httpx.Client, run_id: str, token: str) -> None:
    raw = f'{{"metrics": {{"train/loss": {token}}}, "step": 1, "rank": 0, "world_size": 2}}'
    for path in (f"/runs/{run_id}/rank-metrics", f"/runs/{run_id}/metrics"):
        response = api.post(path, content=raw, headers={"Content-Type": "application/json"})
        assert response.status_code == 400, response.text
        assert "metrics['train/loss']" in response.json()["error"]
        assert "nonfinite" in response.json()["error"]
    path = f"/runs/{run_id}/rank-metrics"
    good = json.dumps(
        {
            "event_id": f"{run_id}-ok",
            "request": {"method": "POST", "path": path, "body": rank_body(world_size=2)},
        }
    )
    bad = (
        f'{{"event_id": "{run_id}-bad", "request": {{"method": "POST", "path": "{path}",'
        f' "body": {raw}}}}}'
    )
    response = api.post(
        "/api/ingest",
        content=f'{{"events": [{bad}, {good}]}}',
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 200, response.text  # one bad event does not sink the batch
    first, second = response.json()["results"]
    assert first["status"] == 400 and "metrics['train/loss']" in first["body"]["error"]
    assert second["status"] == 200
    assert [k["key"] for k in stored_keys(api, run_id)] == ["train/loss"]
    assert len(stored_rank_points(api, run_id, "train/loss")) == 1


def test_sdk_refuses_what_is_not_a_number(tmp_path: Path) -> None:
    run = im.init(project="p", upload_mode="spool", spool_dir=str(tmp_path))
    with pytest.raises(TypeError, match="metrics"):
        run.log_rank_metrics({"a": np.array([1.0, 2.0])}, step=0, rank=0, world_size=1)
    with pytest.raises(TypeError, match="metrics"):
        run.log_rank_metrics({"a": np.array(True)}, step=0, rank=0, world_size=1)
    with pytest.raises(ValueError, match="at least one"):
        run.log_rank_metrics({}, step=0, rank=0, world_size=1)
    run.log_rank_metrics(
        {"a": np.array(2)}, step=np.array(3), rank=0, world_size=1, weight=np.array(2.0)
    )
    run.finish()


def test_a_large_batch_with_marks_is_stored_whole(api: httpx.Client, run_id: str) -> None:
    # A batch of many points, some of them marks (a diverging shard), and steps whose every
    # rank sent a mark: stored as one batch, the marks kept as marks.
    events = []
    for step in range(4):
        for rank in range(64):
            body = rank_body(metrics={"loss": float(rank)}, step=step, rank=rank, world_size=64)
            if rank == 7 or step == 3:
                body = {**body, "metrics": {}, "nonfinite": {"loss": "nan"}}
            events.append(
                {
                    "event_id": uuid.uuid4().hex,
                    "request": {"method": "POST", "path": f"/runs/{run_id}/rank-metrics",
                                "body": body},
                }
            )  # fmt: skip
    answer = api.post("/api/ingest", json={"events": events})
    assert answer.status_code == 200, answer.text
    assert {r["status"] for r in answer.json()["results"]} == {200}
    points = stored_rank_points(api, run_id, "loss")
    assert len(points) == 256
    assert sum(1 for p in points if isinstance(p[2], str) or p[2] != p[2]) >= 4 * 1 + 63
    got = summary(api, run_id, key="loss")
    assert got["first_nonfinite"] == {"step": 0, "rank": 7, "value": "nan"}
    assert [s["nonfinite"] for s in got["steps"]] == [1, 1, 1, 64]
    assert [s["count"] for s in got["steps"]] == [63, 63, 63, 0]
