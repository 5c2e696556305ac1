"""The SDK and the uploader take an httpx transport: here one that loses answers. Each
request reaches the real server and is applied, then every other answer is dropped on its
way back, so the client must retry what the server already did; the Idempotency-Key
contract makes that count once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx

import instantml as im
from instantml.server.process import ServerProcess
from instantml.spool.uploader import Uploader
from tests.helpers import admin_client, stored_rank_points


class LosesAnswers(httpx.BaseTransport):
    """Forwards every request to the network; drops the answer of every other one."""

    def __init__(self) -> None:
        self._real = httpx.HTTPTransport()
        self.sent = 0
        self.lost = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self._real.handle_request(request)
        response.read()
        self.sent += 1
        if self.sent % 2 == 1:
            self.lost += 1
            raise httpx.ReadError("connection reset after the server answered", request=request)
        return response

    def close(self) -> None:
        self._real.close()


def _usage(server: ServerProcess) -> int:
    with admin_client(server) as api:
        return int(api.get("/api/usage").json()["used"])


def test_async_mode_through_lost_answers_counts_once(
    start_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = start_server()
    lossy = LosesAnswers()
    run = im.init(project="faults", base_url=server.url, api_key=server.admin_key, transport=lossy)
    for step in range(50):
        run.log_rank_metrics({"a": float(step), "b": 1.0}, step=step, rank=0, world_size=1)
    assert run.finish(timeout=60) is True and run.dropped_events == 0
    assert lossy.lost >= 2  # the creation's answer, at least one batch's
    with admin_client(server) as api:
        assert len(stored_rank_points(api, run.run_id, "a")) == 50
        assert api.get(f"/runs/{run.run_id}").json()["run"]["status"] == "finished"
    assert _usage(server) == 100  # each point charged once


def test_the_uploader_through_lost_answers_counts_once(
    start_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = start_server()
    spool = tmp_path / "spool"
    run = im.init(project="faults", run_id="lossy", upload_mode="spool", spool_dir=str(spool))
    for step in range(300):
        run.log_rank_metrics({"a": float(step)}, step=step, rank=step % 4, world_size=4)
    run.finish()
    lossy = LosesAnswers()
    with Uploader(spool, server.url, server.admin_key, batch_events=40, transport=lossy) as up:
        stats = up.run()
    assert lossy.lost >= 3
    assert stats.delivered + stats.replayed >= 302 and stats.replayed > 0
    with admin_client(server) as api:
        assert len(stored_rank_points(api, "lossy", "a")) == 300
    assert _usage(server) == 300
