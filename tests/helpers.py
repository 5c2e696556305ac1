"""Small helpers shared by tests."""

from __future__ import annotations

import httpx


def rank_body(**overrides: object) -> dict[str, object]:
    body: dict[str, object] = {
        "metrics": {"train/loss": 0.5},
        "step": 1,
        "rank": 0,
        "world_size": 8,
        "local_rank": 0,
        "weight": 1.0,
    }
    body.update(overrides)
    return body


def stored_rank_points(api: httpx.Client, run_id: str, key: str) -> list[list[object]]:
    """Every stored rank point of a key ([] when the key has none)."""
    response = api.get(f"/api/runs/{run_id}/rank-points", params={"metric": key})
    if response.status_code == 404:
        return []
    assert response.status_code == 200, response.text
    return response.json()["points"]  # type: ignore[no-any-return]


def stored_keys(api: httpx.Client, run_id: str) -> list[dict[str, object]]:
    response = api.get(f"/api/runs/{run_id}/keys")
    assert response.status_code == 200, response.text
    return response.json()["keys"]  # type: ignore[no-any-return]


def admin_client(server: object) -> httpx.Client:
    """A client with the server's admin key; use it in a ``with`` block."""
    return httpx.Client(
        base_url=server.url,  # type: ignore[attr-defined]
        headers={"Authorization": f"Bearer {server.admin_key}"},  # type: ignore[attr-defined]
        timeout=60,
    )
