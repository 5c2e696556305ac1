"""Ordered pipelining on ``/api/ingest`` (server/write/upload_order.py): batches of one upload
session are applied in the order they were sent, whatever order they arrive in, and none
after a batch that did not complete cleanly."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from instantml.protocol import UPLOAD_ORDER_HEADER
from instantml.server.errors import ApiError
from instantml.server.write import upload_order
from instantml.storage import open_stores


def _events(run_id: str, steps: range, prefix: str) -> list[dict[str, Any]]:
    return [
        {
            "event_id": f"{prefix}-{step}",
            "request": {
                "method": "POST",
                "path": f"/runs/{run_id}/rank-metrics",
                "body": {
                    "metrics": {"loss": float(step)},
                    "step": step,
                    "rank": 0,
                    "world_size": 1,
                },
            },
        }
        for step in steps
    ]


def test_a_batch_that_arrives_first_waits_for_the_one_sent_before_it(api: httpx.Client) -> None:
    run_id, session = f"order-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    create = {
        "event_id": f"{run_id}-create",
        "request": {"method": "POST", "path": "/runs", "body": {"id": run_id, "project": "t"}},
    }
    done: dict[int, tuple[float, httpx.Response]] = {}

    def send(seq: int, events: list[dict[str, Any]]) -> None:
        response = api.post(
            "/api/ingest",
            json={"events": events},
            headers={UPLOAD_ORDER_HEADER: f"{session}/{seq}"},
        )
        done[seq] = (time.monotonic(), response)

    # Batch 1 holds points of a run that batch 0 creates; it is sent first.
    second = threading.Thread(target=send, args=(1, _events(run_id, range(5), run_id)))
    second.start()
    time.sleep(0.5)
    assert 1 not in done  # waiting for batch 0
    send(0, [create])
    second.join()
    assert done[0][0] <= done[1][0]
    assert [r["status"] for r in done[0][1].json()["results"]] == [201]
    assert [r["status"] for r in done[1][1].json()["results"]] == [200] * 5


def test_nothing_after_a_batch_that_failed_is_applied(api: httpx.Client, run_id: str) -> None:
    session = uuid.uuid4().hex
    headers = {UPLOAD_ORDER_HEADER: f"{session}/0"}
    bad = api.post("/api/ingest", content=b'{"events": [', headers=headers)
    assert bad.status_code == 400
    later = api.post(
        "/api/ingest",
        json={"events": _events(run_id, range(3), run_id)},
        headers={UPLOAD_ORDER_HEADER: f"{session}/1"},
    )
    assert later.status_code == 409
    assert "earlier batch" in later.json()["error"]
    assert api.get(f"/api/runs/{run_id}/keys").json()["keys"] == []  # nothing applied


@pytest.mark.parametrize("value", ["", "abc", "a/b", "/1", "a/-1", "a b/1", "x" * 65 + "/1"])
def test_a_bad_header_is_refused_naming_it(api: httpx.Client, run_id: str, value: str) -> None:
    response = api.post(
        "/api/ingest",
        json={"events": _events(run_id, range(1), run_id)},
        headers={UPLOAD_ORDER_HEADER: value},
    )
    assert response.status_code == 400
    assert UPLOAD_ORDER_HEADER in response.json()["error"]


def test_a_predecessor_that_never_comes_times_out(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(upload_order, "WAIT_SECONDS", 0.2)
    url = f"duckdb://{tmp_path / 'stores.duckdb'}"
    stores = open_stores(url, url)

    async def scenario() -> None:
        order = upload_order.UploadOrder(stores.ledger)
        await order.turn(1, "s", 0)
        await order.done(1, "s", 0, True)
        await order.turn(1, "s", 1)  # 0 completed cleanly: no wait
        with pytest.raises(ApiError) as refused:
            await order.turn(1, "s", 3)  # 2 was never sent (or was lost on the way)
        assert refused.value.status == 409
        with pytest.raises(ApiError):
            await order.turn(1, "s", 0)  # already sent
        waiting = asyncio.create_task(order.turn(1, "s", 2))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # 1 has not completed
        await order.done(1, "s", 1, False)
        with pytest.raises(ApiError, match="did not complete"):
            await waiting  # woken by 1's completion, which was not clean

    try:
        asyncio.run(scenario())
    finally:
        stores.close()
