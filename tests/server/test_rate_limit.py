"""Short-term rate limits per API key: 429 with scope ``second`` and ``Retry-After`` for the
key over its rate, while another key is served; the SDK's sync mode waits and retries."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import httpx
import pytest

from instantml.server.errors import ApiError
from instantml.server.process import ServerProcess
from instantml.server.ratelimit import RateLimiter


def test_a_bucket_per_key_refills_at_its_rate() -> None:
    now = [0.0]
    limiter = RateLimiter(2.0, clock=lambda: now[0])  # bursts of 4
    for _ in range(4):
        limiter.take("a")
    with pytest.raises(ApiError) as refused:
        limiter.take("a")
    assert refused.value.status == 429
    assert refused.value.headers == {"X-InstantML-RateLimit-Scope": "second", "Retry-After": "1"}
    limiter.take("b")  # another key has its own bucket
    now[0] = 0.5  # one token back
    limiter.take("a")
    with pytest.raises(ApiError):
        limiter.take("a")
    RateLimiter(0).take("a")  # 0: no limit


def test_a_runaway_key_is_limited_and_others_are_not(
    start_server: Callable[..., ServerProcess],
) -> None:
    server = start_server(env={"INSTANTML_RATE_LIMIT": "5"})
    admin = {"Authorization": f"Bearer {server.admin_key}"}
    with httpx.Client(base_url=server.url, timeout=30) as http:
        other = http.post("/api/keys", json={"scopes": ["ingest", "read"]}, headers=admin)
        calm = {"Authorization": f"Bearer {other.json()['key']}"}
        answers = [http.get("/api/runs", headers=admin) for _ in range(30)]
        limited = [a for a in answers if a.status_code == 429]
        assert limited, "30 requests at once with a limit of 5/s (bursts of 10)"
        assert all(a.status_code in (200, 429) for a in answers)
        assert limited[0].headers["x-instantml-ratelimit-scope"] == "second"
        assert int(limited[0].headers["retry-after"]) >= 1
        assert "rate limit" in limited[0].json()["error"]
        assert http.get("/api/runs", headers=calm).status_code == 200  # not starved

    # The SDK in sync mode: a 429 "second" is retried after Retry-After, nothing is lost.
    import instantml as im

    run = im.init(project="rl", run_id=f"rl-{uuid.uuid4().hex[:8]}", upload_mode="sync",
                  api_key=server.admin_key, base_url=server.url)  # fmt: skip
    for step in range(25):
        run.log_rank_metrics({"loss": 1.0}, step=step, rank=0, world_size=1)
    run.finish()
    with httpx.Client(base_url=server.url, headers=admin, timeout=30) as http:
        for _ in range(100):  # the key is over its rate again: wait for a token
            points = http.get(f"/api/runs/{run.run_id}/rank-points", params={"metric": "loss"})
            if points.status_code == 200:
                break
            time.sleep(0.25)
        assert len(points.json()["points"]) == 25
