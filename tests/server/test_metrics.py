"""Scalar and rank metric writes, attributes, and the raw series routes."""

from __future__ import annotations

import httpx

from tests.helpers import rank_body, stored_keys, stored_rank_points, stored_scalars


def test_rank_metrics_happy_path(api: httpx.Client, run_id: str) -> None:
    body = rank_body(
        metrics={"train/loss": 0.25, "optimizer/grad_norm": 3.5},
        step=100,
        rank=3,
        world_size=8,
        local_rank=3,
        weight=1024,
    )
    response = api.post(f"/runs/{run_id}/rank-metrics", json=body)
    assert response.status_code == 200
    assert response.json() == {"accepted": 2}
    assert stored_rank_points(api, run_id, "train/loss") == [[100, 3, 0.25, 1024.0, 3, 8]]
    assert stored_rank_points(api, run_id, "optimizer/grad_norm") == [[100, 3, 3.5, 1024.0, 3, 8]]
    run = api.get(f"/runs/{run_id}").json()["run"]
    assert (run["world_size"], run["last_step"]) == (8, 100)


def test_optional_fields_default(api: httpx.Client, run_id: str) -> None:
    body = {"metrics": {"k": 1}, "step": 100.0, "rank": 1, "world_size": 2}  # 100.0 is step 100
    assert api.post(f"/runs/{run_id}/rank-metrics", json=body).json() == {"accepted": 1}
    assert stored_rank_points(api, run_id, "k") == [[100, 1, 1.0, 1.0, None, 2]]


def test_a_rank_point_is_replaced_never_added(api: httpx.Client, run_id: str) -> None:
    for value in (1.0, 2.0, 3.0):
        api.post(
            f"/runs/{run_id}/rank-metrics", json=rank_body(metrics={"k": value}, step=5, rank=2)
        )
    api.post(f"/runs/{run_id}/rank-metrics", json=rank_body(metrics={"k": 9.0}, step=5, rank=1))
    points = stored_rank_points(api, run_id, "k")
    assert [(p[0], p[1], p[2]) for p in points] == [(5, 1, 9.0), (5, 2, 3.0)]


def test_scalar_metrics_and_public_sdk_extras(api: httpx.Client, run_id: str) -> None:
    body = {
        "metrics": {"eval/accuracy": 0.91},
        "step": 100,
        "timestamp": "2026-11-29T10:00:00Z",
        "preview": False,
        "preview_completion": 0.0,
    }
    assert api.post(f"/runs/{run_id}/metrics", json=body).json() == {"accepted": 1}
    api.post(f"/runs/{run_id}/metrics", json={"metrics": {"eval/accuracy": 0.95}, "step": 100})
    assert stored_scalars(api, run_id, "eval/accuracy")["points"] == [[100, 0.95]]
    assert {k["key"]: k["kind"] for k in stored_keys(api, run_id)} == {"eval/accuracy": "scalar"}


def test_a_scalar_step_is_any_finite_number_kept_exactly(api: httpx.Client, run_id: str) -> None:
    # The public SDK's async uploader reports its health at step = unix time.
    health = "system/instantml/upload_lag_seconds"
    for step, value in ((1764547200.25, 0.5), (1764547205.125, 0.0), (2, 0.25)):
        response = api.post(
            f"/runs/{run_id}/metrics", json={"metrics": {health: value}, "step": step}
        )
        assert response.json() == {"accepted": 1}, response.text
    api.post(f"/runs/{run_id}/metrics", json={"metrics": {"eval/loss": 1.5}, "step": 0.5})
    api.post(f"/runs/{run_id}/metrics", json={"metrics": {"eval/loss": 1.0}, "step": 7})
    series = stored_scalars(api, run_id, health)
    assert series["points"] == [[2, 0.25], [1764547200.25, 0.5], [1764547205.125, 0.0]]
    assert stored_scalars(api, run_id, "eval/loss")["points"] == [[0.5, 1.5], [7, 1.0]]
    keys = {k["key"]: k["last_step"] for k in stored_keys(api, run_id)}
    assert keys == {health: 1764547205.125, "eval/loss": 7}
    # The run's last step follows its training steps, not the health series' unix times.
    assert api.get(f"/runs/{run_id}").json()["run"]["last_step"] == 7


def test_attributes_are_kept(api: httpx.Client, run_id: str) -> None:
    attrs = {
        "attributes": [
            {"path": "config/lr", "type": "config", "value": 0.1},
            {"path": "notes", "type": "string", "value": "hello"},
        ]
    }
    response = api.post(f"/api/runs/{run_id}/attributes", json=attrs)
    assert response.status_code == 200 and response.json() == {"accepted": 2}
    assert api.post(f"/api/runs/{run_id}/attributes", json={"attributes": []}).status_code == 422


def test_writes_to_an_unknown_run_are_404(api: httpx.Client) -> None:
    assert api.post("/runs/missing-run/rank-metrics", json=rank_body()).status_code == 404
    assert (
        api.post("/runs/missing-run/metrics", json={"metrics": {"a": 1}, "step": 0}).status_code
        == 404
    )
    assert api.get("/api/runs/missing-run/keys").status_code == 404


def test_a_key_is_asked_for_as_key_or_metric(api: httpx.Client, run_id: str) -> None:
    """``key=`` names the metric on every route that reads one; ``metric=`` is its alias."""
    api.post(f"/runs/{run_id}/metrics", json={"metrics": {"eval/acc": 0.5}, "step": 1})
    api.post(f"/runs/{run_id}/rank-metrics",
             json={"metrics": {"a/x": 1.0, "train/loss": 2.0}, "step": 1, "rank": 0,
                   "world_size": 1})  # fmt: skip
    for name in ("key", "metric"):
        scalar = api.get(f"/api/runs/{run_id}/metrics", params={name: "eval/acc"})
        assert scalar.status_code == 200 and scalar.json()["points"][0][:2] == [1, 0.5]
        points = api.get(f"/api/runs/{run_id}/rank-points", params={name: "a/x"})
        assert points.status_code == 200 and points.json()["key"] == "a/x"
        summary = api.get(f"/api/runs/{run_id}/distributed", params={name: "a/x"})
        assert summary.status_code == 200 and summary.json()["key"] == "a/x"
    for route in ("metrics", "rank-points"):
        missing = api.get(f"/api/runs/{run_id}/{route}")
        assert missing.status_code == 422 and missing.json()["error"].startswith("key:")
    # No key asked for: a loss-like key, not the first in sorted order.
    assert api.get(f"/api/runs/{run_id}/distributed").json()["key"] == "train/loss"
