"""Async mode never blocks or raises into the training loop, whatever the server does."""

from __future__ import annotations

import statistics
import time
import uuid
import warnings

import httpx
import pytest

import instantml as im
from instantml.sdk.async_sender import AsyncSender
from instantml.sdk.transport import Transport
from instantml.server.process import ServerProcess, free_port
from tests.helpers import hung_peer, stored_keys, stored_rank_points


def _time_loop(run: im.Run, steps: int = 2000) -> list[float]:
    costs = []
    for step in range(steps):
        start = time.perf_counter()
        run.log_rank_metrics({"loss": 1.0, "grad": 2.0, "t": 3.0}, step=step, rank=1, world_size=8)
        costs.append(time.perf_counter() - start)
    return costs


@pytest.mark.parametrize("where", ["down", "hung"])
def test_loop_stays_in_microseconds_and_finish_keeps_its_timeout(where: str) -> None:
    with hung_peer() as hung:
        _loop_then_finish(f"http://127.0.0.1:{free_port()}" if where == "down" else hung)


def _loop_then_finish(url: str) -> None:
    run = im.init(project="p", base_url=url, api_key="iml_x_y", timeout=5.0)
    costs = _time_loop(run)
    # A call that touched the network would cost milliseconds (down) or the 5 s timeout
    # (hung). The bounds leave room for a shared machine's pauses, not for a network call.
    assert statistics.median(costs) < 200e-6, statistics.median(costs)
    assert max(costs) < 1.0, max(costs)
    start = time.monotonic()
    with pytest.warns(RuntimeWarning, match=f"2002 of 2002 events were not delivered to {url}"):
        delivered = run.finish(timeout=1.0)
    assert delivered is False
    assert time.monotonic() - start < 1.0 + 2.0  # finish's timeout, not the transport's 5 s
    # Every event not delivered is counted: the creation, 2,000 points and the status.
    assert run.dropped_events == 2002


def test_full_queue_drops_counts_and_warns_once() -> None:
    sender = AsyncSender(Transport(f"http://127.0.0.1:{free_port()}", None), max_queue=10)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(500):
            sender.submit("POST", "/runs/x/metrics", {"metrics": {"a": 1.0}, "step": 0})
    drops = [w for w in caught if "dropping" in str(w.message)]
    assert len(drops) == 1
    assert sender.dropped >= 480  # the thread may have taken a batch off the queue meanwhile
    with pytest.warns(RuntimeWarning):
        sender.close(0.2)


def test_async_delivers_everything(server: ServerProcess, api: httpx.Client) -> None:
    run = im.init(project="tests", base_url=server.url, api_key=server.admin_key)
    for step in range(300):
        for rank in range(4):
            run.log_rank_metrics(
                {"loss": step + rank / 10},
                step=step,
                rank=rank,
                world_size=4,
                local_rank=rank,
                weight=rank + 1,
            )
    run.log({"acc": 0.5})
    assert run.finish(timeout=30) is True
    points = stored_rank_points(api, run.run_id, "loss")
    assert len(points) == 1200
    assert points[5] == [1, 1, 1.1, 2.0, 1, 4]
    status = api.get(f"/runs/{run.run_id}").json()["run"]["status"]
    assert status == "finished"


def test_validation_raises_at_the_call_before_queueing(server: ServerProcess) -> None:
    run = im.init(project="tests", base_url=server.url, api_key=server.admin_key)
    with pytest.raises(ValueError, match="weight"):
        run.log_rank_metrics({"a": 1.0}, step=0, rank=0, world_size=2, weight=0)
    with pytest.raises(TypeError, match="metrics"):
        run.log_rank_metrics({"a": "x"}, step=0, rank=0, world_size=2)  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="rank"):
        run.log_rank_metrics({"a": 1.0}, step=0, rank=2, world_size=2)
    with pytest.raises(ValueError, match="rank is required"):
        run.log_rank_metrics({"a": 1.0}, step=0)
    assert run._sink._submitted == 1  # type: ignore[attr-defined]  # only the run creation
    run.finish()


def test_a_refused_key_is_counted_and_finish_says_so(server: ServerProcess) -> None:
    run = im.init(project="p", base_url=server.url, api_key="iml_000000000000_wrong")
    for step in range(12):
        run.log_rank_metrics({"a": 1.0}, step=step, rank=0, world_size=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        delivered = run.finish(timeout=10)
    assert delivered is False
    assert run.dropped_events == 14  # the creation, 12 points, the status
    text = " ".join(str(w.message) for w in caught)
    assert f"14 of 14 events were not delivered to {server.url}" in text
    assert "401" in text and "invalid API key" in text


def test_a_run_id_taken_in_another_project_sends_nothing(
    server: ServerProcess, api: httpx.Client
) -> None:
    taken = f"taken-{uuid.uuid4().hex[:8]}"
    assert api.post("/runs", json={"project": "newcomer", "id": taken}).status_code == 201
    started = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = im.init(project="other", run_id=taken, base_url=server.url, api_key=server.admin_key)
        for step in range(100):
            run.log_rank_metrics({"a": 1.0}, step=step, rank=0, world_size=1)
            if caught:  # the refusal is warned at the next call after it came back
                break
            time.sleep(0.02)
        before_finish = [str(w.message) for w in caught]
        delivered = run.finish(timeout=30)
    # Warned at once (during the loop, not at finish), and final: no 30 s of retries.
    assert any("already exists in another project ('newcomer')" in m for m in before_finish)
    assert any("nothing of this run is sent" in m for m in before_finish)
    assert time.monotonic() - started < 10
    assert delivered is False and run.dropped_events == step + 3  # creation, points, status
    assert stored_keys(api, taken) == []  # not one point in newcomer's run
    # Sync mode raises at init, at once (the 409 is final, not retried).
    started = time.monotonic()
    with pytest.raises(im.InstantMLError, match=f"409 id: run '{taken}' already exists"):
        im.init(
            project="other",
            run_id=taken,
            upload_mode="sync",
            base_url=server.url,
            api_key=server.admin_key,
        )
    assert time.monotonic() - started < 1.0


def test_only_the_run_conflict_409_is_final() -> None:
    # The other 409 (an Idempotency-Key still being applied) stays transient: retried.
    from instantml.protocol import is_final

    assert not is_final(409, {"error": "...", "code": "in_flight"})
    assert not is_final(409, None)
    assert is_final(409, {"error": "...", "code": "run_conflict"})
