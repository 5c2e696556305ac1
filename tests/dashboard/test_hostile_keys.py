"""10,000 distinct metric keys in one run, and keys at the 512-byte limit in unusual
Unicode: the API lists and summarises them exactly, the dashboard stays usable and shows
them as text."""

from __future__ import annotations

import time
import uuid
from typing import Any
from urllib.parse import quote

import httpx

from instantml.server.process import ServerProcess
from tests.dashboard.conftest import shot

WEIRD = [
    "ζ" * 256,  # 512 bytes of a two-byte letter
    "👩‍👩‍👧‍👦" * 20 + "x" * 12,  # ZWJ emoji sequences, 512 bytes
    "\u202eright-to-left override\u202c/loss",
    "zero\u200bwidth\u200djoiners\ufeff",
    "e\u0301\u0302\u0303 combining marks",
    "<img src=x onerror=window.__xss=3>",
    "tab\tand newline\nin a key",
]


def _event(run_id: str, event_id: str, metrics: dict[str, float], step: int, rank: int) -> Any:
    return {
        "event_id": event_id,
        "request": {
            "method": "POST",
            "path": f"/runs/{run_id}/rank-metrics",
            "body": {"metrics": metrics, "step": step, "rank": rank, "world_size": 2},
        },
    }


def test_ten_thousand_keys_and_unusual_names(
    page: Any, server: ServerProcess, api: httpx.Client
) -> None:
    run_id = f"keys-{uuid.uuid4().hex[:8]}"
    api.post("/runs", json={"project": "hostile", "id": run_id}).raise_for_status()
    keys = [f"layer{i // 100:03d}/param{i % 100:02d}" for i in range(10_000)]
    events = [
        _event(run_id, f"{run_id}-{i}-{rank}", {k: float(rank) for k in keys[i * 100 : (i + 1) * 100]}, i, rank)
        for i in range(100)
        for rank in range(2)
    ]  # fmt: skip
    events += [
        _event(run_id, f"{run_id}-w{j}-{rank}", {k: 1.0 + rank}, 200 + j, rank)
        for j, k in enumerate(WEIRD)
        for rank in range(2)
    ]
    results = api.post("/api/ingest", json={"events": events}).json()["results"]
    assert {r["status"] for r in results} == {200}
    too_long = api.post(f"/runs/{run_id}/rank-metrics",
                        json={"metrics": {"ζ" * 256 + "x": 1.0}, "step": 1, "rank": 0, "world_size": 2})  # fmt: skip
    assert too_long.status_code == 422 and "metrics" in too_long.json()["error"]

    listed = [k["key"] for k in api.get(f"/api/runs/{run_id}/keys").json()["keys"]]
    assert len(listed) == 10_000 + len(WEIRD) and set(WEIRD) <= set(listed)
    for key in WEIRD:
        summary = api.get(f"/api/runs/{run_id}/distributed", params={"key": key}).json()
        assert summary["key"] == key and summary["steps"][0]["mean"] == 1.5

    # The dashboard, on one of the weird keys: usable, and every name shown as text.
    started = time.monotonic()
    page.goto(
        f"{server.url}/?token={server.admin_key}#/runs/{run_id}/distributed?key={quote(WEIRD[5])}"
    )
    page.wait_for_selector("main[data-ready=distributed]", timeout=60_000)
    loaded = time.monotonic() - started
    shot(page, "ten-thousand-keys")
    options = page.eval_on_selector_all("select option", "els => els.map(e => e.value)")
    assert set(WEIRD) <= set(options) and len(options) >= 10_000
    assert page.evaluate("window.__xss") is None
    assert WEIRD[5] in page.inner_text("main")
    assert page.errors == []
    print(f"dashboard ready in {loaded:.1f} s with {len(options)} keys")
