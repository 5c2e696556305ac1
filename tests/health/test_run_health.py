"""Run health against a real server and a real webhook receiver on loopback: 8 ranks, one
that stops, one twice as slow, one with a burst of outliers; each alert delivered once,
signed; resolved when the rank comes back; delivered after a SIGKILL and a restart; a
receiver that hangs does not hold up ingest."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from instantml.server.process import ServerProcess

SECRET = "test-secret"
WORLD = 8
# Ranks here stop at once, in one process that posts every rank's points: no upload lag to
# wait out, so a short lag keeps the tests quick (tests/health/test_real_jobs.py has the
# default's real timing).
QUICK = {"INSTANTML_HEALTH": '{"lag_seconds": 1}'}


class Receiver:
    """A webhook receiver: keeps each accepted post; ``mode`` "up" (200), "down" (503) or
    "hang" (answers only after ``hang`` seconds)."""

    def __init__(self) -> None:
        self.posts: list[tuple[dict[str, str], bytes]] = []
        self.times: list[float] = []  # when each post arrived
        self.mode = "up"
        self.hang = 30.0
        self.release = threading.Event()  # ends every hang (at close)
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if receiver.mode == "hang":
                    receiver.release.wait(receiver.hang)
                if receiver.mode != "up":
                    self.send_response(503)
                    self.end_headers()
                    return
                with receiver.lock:
                    receiver.posts.append((dict(self.headers.items()), body))
                    receiver.times.append(time.time())
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def alerts(self, run_id: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            bodies = [json.loads(body) for _, body in self.posts]
        return [b for b in bodies if run_id is None or b["run"]["id"] == run_id]

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()  # joins the handlers, closing their sockets


def _api(server: ServerProcess) -> httpx.Client:
    headers = {"Authorization": f"Bearer {server.admin_key}"}
    return httpx.Client(base_url=server.url, headers=headers, timeout=60)


def _run(api: httpx.Client, prefix: str) -> str:
    run_id = f"{prefix}-{uuid.uuid4().hex[:8]}"
    assert api.post("/runs", json={"project": "health", "id": run_id}).status_code == 201
    return run_id


def _step(api: httpx.Client, run_id: str, step: int, values: dict[int, dict[str, float]]) -> None:
    """One step: each rank's metrics, one batch."""
    _steps(api, run_id, {step: values})


def _steps(api: httpx.Client, run_id: str, steps: dict[int, dict[int, dict[str, float]]]) -> None:
    """Steps' ranks' metrics, one batch."""
    events = [
        {
            "event_id": f"{run_id}-{step}-{rank}",
            "request": {
                "method": "POST",
                "path": f"/runs/{run_id}/rank-metrics",
                "body": {"metrics": metrics, "step": step, "rank": rank, "world_size": WORLD},
            },
        }
        for step, values in steps.items()
        for rank, metrics in values.items()
    ]
    response = api.post("/api/ingest", json={"events": events})
    assert response.status_code == 200
    assert all(r["status"] == 200 for r in response.json()["results"]), response.text


def _wait(what: str, check: Callable[[], Any], seconds: float = 30.0) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _health(api: httpx.Client, run_id: str) -> dict[str, Any]:
    response = api.get(f"/api/runs/{run_id}/health")
    assert response.status_code == 200
    return dict(response.json())


def _open(api: httpx.Client, run_id: str, kind: str) -> list[dict[str, Any]]:
    return [a for a in _health(api, run_id)["alerts"] if a["kind"] == kind and not a["resolved"]]


def _hook(api: httpx.Client, url: str) -> dict[str, Any]:
    response = api.post("/api/webhooks", json={"url": url, "secret": SECRET})
    assert response.status_code == 201, response.text
    return dict(response.json())


def _signed(headers: dict[str, str], body: bytes) -> bool:
    expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(headers.get("X-InstantML-Signature", ""), expected)


def test_alerts_open_deliver_once_and_resolve(
    start_server: Callable[..., ServerProcess], receiver: Receiver
) -> None:
    server = start_server(env=QUICK)
    with _api(server) as api:
        hook = _hook(api, receiver.url)
        assert hook["secret"] == SECRET and set(hook["kinds"]) >= {"rank_missing", "straggler"}

        # Rank 3 stops after step 49: missing from step 50, once 3 steps are reported.
        missing = _run(api, "missing")
        for step in range(53):
            _step(api, missing, step, {r: {"loss": 1.0 + 0.01 * r} for r in range(WORLD)
                                       if r != 3 or step < 50})  # fmt: skip
        (alert,) = _wait("rank_missing", lambda: _open(api, missing, "rank_missing"))
        assert (alert["rank"], alert["since_step"], alert["key"]) == (3, 50, None)
        assert _health(api, missing)["status"] == "critical"

        # Rank 5's forward is twice the others': a straggler on perf/forward_ms.
        slow = _run(api, "slow")
        for step in range(30):
            _step(api, slow, step, {r: {"perf/forward_ms": (20.0 if r == 5 else 10.0) + 0.1 * (step % 3)}
                                    for r in range(WORLD)})  # fmt: skip
        (straggler,) = _wait("straggler", lambda: _open(api, slow, "straggler"))
        assert (straggler["rank"], straggler["key"]) == (5, "perf/forward_ms")

        # Rank 2's loss is far off at steps 4-9: an outlier burst (6 of the last 10 steps).
        noisy = _run(api, "noisy")
        for step in range(12):
            _step(api, noisy, step, {r: {"loss": 50.0 if r == 2 and 4 <= step <= 9 else 1.0 + 0.01 * r}
                                     for r in range(WORLD)})  # fmt: skip
        (burst,) = _wait("outlier_burst", lambda: _open(api, noisy, "outlier_burst"))
        assert (burst["rank"], burst["key"], burst["since_step"]) == (2, "loss", 4)
        assert _health(api, noisy)["status"] == "warning"

        # Each alert reaches the receiver once, signed, with its run and a Slack text.
        opened = {a["id"] for run in (missing, slow, noisy)
                  for a in _health(api, run)["alerts"]}  # fmt: skip
        _wait("deliveries", lambda: opened <= {a["alert"]["id"] for a in receiver.alerts()})
        time.sleep(1.5)  # a second delivery, if any, would have come by now
        posted = [a["alert"]["id"] for a in receiver.alerts()]
        assert sorted(posted) == sorted(set(posted))
        for headers, body in receiver.posts:
            assert _signed(headers, body)
        (delivered,) = receiver.alerts(missing)
        assert delivered["alert"]["kind"] == "rank_missing" and "rank 3" in delivered["text"]
        url = f"{server.url}/#/runs/{missing}/distributed?step_min=0&step_max=100"
        assert delivered["run"] == {"id": missing, "project": "health", "name": None, "url": url}

        # Rank 3 comes back: the alert resolves, and is not posted again.
        for step in range(53, 56):
            _step(api, missing, step, {r: {"loss": 1.0} for r in range(WORLD)})
        _wait("resolution", lambda: not _open(api, missing, "rank_missing"))
        (after,) = [a for a in _health(api, missing)["alerts"] if a["id"] == alert["id"]]
        assert after["resolved"] and _health(api, missing)["status"] == "ok"
        assert len(receiver.alerts(missing)) == 1


def test_an_alert_raised_before_a_sigkill_is_delivered_after_restart(
    start_server: Callable[..., ServerProcess], receiver: Receiver, tmp_path: Any
) -> None:
    data = tmp_path / "data"
    server = start_server(data, env=QUICK)
    receiver.mode = "down"  # the first attempts fail: the alert waits in the outbox
    with _api(server) as api:
        _hook(api, receiver.url)
        run = _run(api, "killed")
        for step in range(6):
            _step(api, run, step, {r: {"loss": 1.0} for r in range(WORLD) if r != 6 or step < 2})
        (alert,) = _wait("rank_missing", lambda: _open(api, run, "rank_missing"))
    assert server.proc is not None
    server.proc.kill()
    server.proc.wait()
    receiver.mode = "up"
    restarted = start_server(data, env=QUICK)
    with _api(restarted) as api:
        _wait("delivery after restart", lambda: receiver.alerts(run), seconds=60)
        time.sleep(3)  # retries that were due would have come by now
        assert [a["alert"]["id"] for a in receiver.alerts(run)] == [alert["id"]]
        assert _open(api, run, "rank_missing")[0]["id"] == alert["id"]  # not opened twice


def test_a_hanging_receiver_does_not_hold_up_ingest(
    start_server: Callable[..., ServerProcess], receiver: Receiver
) -> None:
    server = start_server(env=QUICK)
    receiver.mode, receiver.hang = "hang", 30.0
    with _api(server) as api:
        _hook(api, receiver.url)
        # Alerts on several runs keep the delivery threads hung on the receiver...
        runs = [_run(api, "hang") for _ in range(6)]
        for run in runs:
            for step in range(5):
                _step(
                    api, run, step, {r: {"loss": 1.0} for r in range(WORLD) if r != 1 or step < 1}
                )
        for run in runs:
            _wait("rank_missing", lambda run=run: _open(api, run, "rank_missing"))
        # ...while ingest goes on: 40 more steps answered well within one hang of the
        # receiver (bound, not a timing: a delivery in the write path would take 30 s each).
        started = time.monotonic()
        for step in range(5, 45):
            _step(api, runs[0], step, {r: {"loss": 1.0} for r in range(WORLD)})
        assert time.monotonic() - started < receiver.hang / 2
    receiver.mode = "up"


def test_webhook_urls_are_admin_only_and_http(
    start_server: Callable[..., ServerProcess], receiver: Receiver
) -> None:
    server = start_server(env=QUICK)
    with _api(server) as api:
        for url in ("file:///etc/passwd", "ftp://example.com/x", "gopher://h/", "not a url", 3):
            response = api.post("/api/webhooks", json={"url": url})
            assert response.status_code == 422 and "url" in response.json()["error"]
        bad_kind = api.post("/api/webhooks", json={"url": receiver.url, "kinds": ["nope"]})
        assert bad_kind.status_code == 422 and "kinds" in bad_kind.json()["error"]
        created = _hook(api, receiver.url)
        assert len(created["secret"]) > 0
        listed = api.get("/api/webhooks").json()["webhooks"]
        assert [h["id"] for h in listed] == [created["id"]] and "secret" not in listed[0]
        key = api.post("/api/keys", json={"scopes": ["ingest", "read"]}).json()["key"]
        other = {"Authorization": f"Bearer {key}"}
        assert (
            api.post("/api/webhooks", json={"url": receiver.url}, headers=other).status_code == 403
        )
        assert api.get("/api/webhooks", headers=other).status_code == 403
        assert api.delete(f"/api/webhooks/{created['id']}").status_code == 204
        assert api.delete(f"/api/webhooks/{created['id']}").status_code == 404
        assert api.get("/api/webhooks").json()["webhooks"] == []


def test_a_runs_own_thresholds(start_server: Callable[..., ServerProcess]) -> None:
    import instantml as im

    server = start_server(env=QUICK)
    run = im.init(
        project="health", run_id=f"own-{uuid.uuid4().hex[:8]}", upload_mode="sync",
        api_key=server.admin_key, base_url=server.url, health={"missing_steps": 8},
    )  # fmt: skip
    with _api(server) as api:
        for step in range(6):  # rank 1 missing from 5 steps: under this run's 8
            for rank in range(4):
                if rank != 1 or step == 0:
                    run.log_rank_metrics({"loss": 1.0}, step=step, rank=rank, world_size=4)
        time.sleep(1.5)  # evaluated by now (every 0.5 s)
        assert _health(api, run.run_id)["alerts"] == []
        for step in range(6, 9):  # 8 steps
            for rank in (0, 2, 3):
                run.log_rank_metrics({"loss": 1.0}, step=step, rank=rank, world_size=4)
        (alert,) = _wait("rank_missing", lambda: _open(api, run.run_id, "rank_missing"))
        assert (alert["rank"], alert["since_step"]) == (1, 1)
        run.finish()

        # Bad thresholds are refused, naming the field: by the SDK, and by the server.
        with pytest.raises(ValueError, match=r"health\.straggler_score"):
            im.init(project="health", health={"straggler_score": 2}, upload_mode="sync",
                    api_key=server.admin_key, base_url=server.url)  # fmt: skip
        response = api.post(
            f"/api/runs/{run.run_id}/attributes",
            json={"attributes": [{"path": "health/burst_steps", "type": "health", "value": 0}]},
        )
        assert response.status_code == 422
        assert "attributes[0].health.burst_steps" in response.json()["error"]


def test_a_run_with_many_keys_is_read_in_turn(start_server: Callable[..., ServerProcess]) -> None:
    """150 keys (more than one look reads): a burst on the last key is found though the
    points come in one batch and no more follow (the run is looked at until every key is
    read), and its alert is not resolved by the looks that read other keys."""
    server = start_server(env=QUICK)
    keys = [f"k{i:03d}" for i in range(150)]
    with _api(server) as api:
        run = _run(api, "many")
        _steps(api, run, {step: {r: {k: 50.0 if (k == "k149" and r == 2 and step >= 4) else 1.0 + 0.01 * r
                                     for k in keys} for r in range(WORLD)} for step in range(40)})  # fmt: skip
        (burst,) = _wait("outlier_burst", lambda: _open(api, run, "outlier_burst"))
        assert (burst["rank"], burst["key"]) == (2, "k149")
        for step in range(40, 46):  # more looks, at other keys: it stays open
            _step(api, run, step, {r: {k: 50.0 if (k == "k149" and r == 2) else 1.0 + 0.01 * r
                                       for k in keys} for r in range(WORLD)})  # fmt: skip
            time.sleep(0.6)
        assert [a["id"] for a in _open(api, run, "outlier_burst")] == [burst["id"]]


def test_a_late_upload_moves_an_open_alert(
    start_server: Callable[..., ServerProcess], receiver: Receiver
) -> None:
    """Rank 3's last steps arrive after its alert opened, and it is still behind: the
    alert moves to the new first missed step, is not resolved and reopened, and is posted
    once."""
    server = start_server(env=QUICK)
    with _api(server) as api:
        _hook(api, receiver.url)
        run = _run(api, "late")
        _steps(api, run, {s: {r: {"loss": 1.0} for r in range(WORLD) if r != 3 or s < 10}
                          for s in range(20)})  # fmt: skip
        (alert,) = _wait("rank_missing", lambda: _open(api, run, "rank_missing"))
        assert alert["since_step"] == 10
        _steps(api, run, {s: {3: {"loss": 1.0}} for s in range(10, 15)})  # late, still behind
        _wait("moved", lambda: [a["since_step"] for a in _open(api, run, "rank_missing")] == [15])
        time.sleep(2.5)  # past the lag again: no second alert
        assert [a["id"] for a in _health(api, run)["alerts"]] == [alert["id"]]
        _wait("one post", lambda: receiver.alerts(run))
        assert len(receiver.alerts(run)) == 1
