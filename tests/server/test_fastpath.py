"""The write routes' fast path (``server/fastpath.py``) answers exactly as the FastAPI
routes it stands in front of: the same requests sent to an app with it and to one
without it get the same status, body and headers, and what it does not take (another
method, a trailing slash, an extra segment) goes on to FastAPI.

In-process (two apps side by side through Starlette's test client, each with its own
stores): the comparison needs the app without the fast path, which no server runs. Every
HTTP suite runs through the fast path on a real server."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from instantml.server.app import create_app
from instantml.server.bootstrap import bootstrap
from instantml.server.write.committer import GroupCommitter
from instantml.settings import ServerSettings
from instantml.storage import open_stores
from tests.helpers import rank_body

HEADERS = ("content-type", "www-authenticate", "idempotent-replayed", "x-instantml-ratelimit-scope",
           "retry-after", "location", "allow")  # fmt: skip


@contextmanager
def _client(data: Path, fast: bool, rate: float, raising: bool = True) -> Iterator[TestClient]:
    data.mkdir(parents=True)
    settings = ServerSettings(
        data_dir=data, write_credentials=False, decode_processes=0, max_body_bytes=4096,
        rate_limit=rate,
    )  # fmt: skip
    stores = open_stores(settings.metadata_url, settings.points_url)
    try:
        key = bootstrap(settings, stores.tenancy)
        app = create_app(settings, stores)
        if not fast:
            app.fast_path = None
        with TestClient(
            app, base_url="http://127.0.0.1", follow_redirects=False,
            raise_server_exceptions=raising,
        ) as client:  # fmt: skip
            client.headers["Authorization"] = f"Bearer {key}"
            yield client
    finally:
        stores.close()


@pytest.fixture
def pair(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[TestClient, TestClient]]:
    rate = getattr(request, "param", 0.0)  # requests a second per key; 0: no limit
    with (
        _client(tmp_path / "fast", True, rate) as fast,
        _client(tmp_path / "slow", False, rate) as slow,
    ):
        yield fast, slow


def _timeless(value: Any) -> Any:
    """An answer without its clock readings (the two apps write at different moments)."""
    if isinstance(value, dict):
        return {k: _timeless(v) for k, v in value.items() if not k.endswith("_at")}
    if isinstance(value, str):  # a 429's wait
        return re.sub(r"retry after [0-9.]+ s", "retry after ... s", value)
    return [_timeless(v) for v in value] if isinstance(value, list) else value


def _same(fast: TestClient, slow: TestClient, method: str, path: str, **kw: Any) -> int:
    # Each app has its own admin key; the requests are otherwise the same.
    answers = []
    for client in (fast, slow):
        response = client.request(method, path, **kw)
        body = _timeless(response.json()) if response.content else None
        answers.append((response.status_code, body, {h: response.headers.get(h) for h in HEADERS}))
    assert answers[0] == answers[1], (method, path, answers)
    return int(answers[0][0])


def test_the_fast_path_answers_as_the_routes(pair: tuple[TestClient, TestClient]) -> None:
    fast, slow = pair
    for client in (fast, slow):
        assert client.post("/runs", json={"project": "p", "id": "r1"}).status_code == 201
    key = {"Idempotency-Key": "k-1"}
    rank = "/runs/r1/rank-metrics"
    cases: list[tuple[str, str, dict[str, Any]]] = [
        ("POST", "/runs", {"json": {"project": "p", "id": "r1"}}),
        ("POST", "/runs", {"json": {"project": "p", "id": "r2"}}),
        ("POST", "/runs", {"json": {"project": "p", "id": "bad id!"}}),
        ("POST", rank, {"json": rank_body()}),
        ("POST", rank, {"json": rank_body(step=2), "headers": key}),
        ("POST", rank, {"json": rank_body(step=2), "headers": key}),  # replayed
        ("POST", rank, {"json": rank_body(step=3), "headers": key}),  # same key, other body
        ("POST", rank, {"json": rank_body(rank=99)}),
        ("POST", rank, {"json": rank_body(metrics={"a\x00": 1.0})}),
        ("POST", rank, {"content": b"{not json"}),
        ("POST", rank, {"content": b"[1, 2]"}),
        ("POST", rank, {"content": b'{"step": NaN}'}),
        ("POST", rank, {"content": b"x" * 5000}),  # over the body limit
        ("POST", "/runs/nope/rank-metrics", {"json": rank_body()}),
        ("POST", "/runs/r1/metrics", {"json": {"metrics": {"a": 1.0}, "step": 1.5}}),
        ("PATCH", "/runs/r1", {"json": {"status": "finished"}}),
        ("POST", "/api/runs/r1/attributes", {"json": {"attributes": []}}),
        ("POST", "/api/runs/r1/logs",
         {"json": {"stream": "stdout", "lines": [{"line_number": 0, "message": "hi"}]}}),
        # Not taken by the fast path: FastAPI answers both.
        ("GET", rank, {}),
        ("POST", rank + "/", {"json": rank_body()}),
        ("POST", rank + "/extra", {"json": rank_body()}),
        ("POST", "/runs//rank-metrics", {"json": rank_body()}),
        ("POST", "/runs/a%2Fb/rank-metrics", {"json": rank_body()}),
    ]  # fmt: skip
    statuses = [_same(fast, slow, method, path, **kw) for method, path, kw in cases]
    assert {200, 201, 307, 400, 404, 405, 413, 422}.issubset(set(statuses)), statuses


@pytest.mark.parametrize("pair", [5.0], indirect=True)
def test_authorization_and_rate_limit_as_the_routes(
    pair: tuple[TestClient, TestClient],
) -> None:
    fast, slow = pair
    for client in (fast, slow):
        client.post("/runs", json={"project": "p", "id": "r1"})
    path = "/runs/r1/rank-metrics"
    for headers in ({"Authorization": ""}, {"Authorization": "Bearer iml_nope_nope"},
                    {"Authorization": "Basic abc"}):  # fmt: skip
        assert _same(fast, slow, "POST", path, json=rank_body(), headers=headers) == 401
    # A read-only key: 403 naming the scope.
    for client in (fast, slow):
        key = client.post("/api/keys", json={"name": "ro", "scopes": ["read"]}).json()["key"]
        client.headers["X-Read-Key"] = key
    answers = [
        client.post(path, json=rank_body(), headers={"Authorization": f"Bearer {client.headers['X-Read-Key']}"})
        for client in (fast, slow)
    ]  # fmt: skip
    assert [a.status_code for a in answers] == [403, 403]
    assert answers[0].json() == answers[1].json()
    # Past the per-key rate (5 a second, bursts of 10): the same 429 "second" from both.
    refusals = []
    for client in (fast, slow):
        for step in range(40):
            response = client.post(path, json=rank_body(step=step))
            if response.status_code == 429:
                break
        assert response.status_code == 429, response.text
        assert response.headers["retry-after"].isdigit()
        headers = {h: response.headers.get(h) for h in HEADERS if h != "retry-after"}
        refusals.append((_timeless(response.json()), headers))
    assert refusals[0] == refusals[1]


def test_an_unexpected_failure_is_answered_as_by_the_routes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug in the write path (here: the writer's hand-off raising) is a 500 naming the
    exception's type from both, which the server's log gets the traceback of."""
    with (
        _client(tmp_path / "fast", True, 0.0, raising=False) as fast,
        _client(tmp_path / "slow", False, 0.0, raising=False) as slow,
    ):
        for client in (fast, slow):
            assert client.post("/runs", json={"project": "p", "id": "r1"}).status_code == 201

        async def broken(*_: Any) -> None:
            raise RuntimeError("a bug")

        monkeypatch.setattr(GroupCommitter, "submit", broken)
        assert _same(fast, slow, "POST", "/runs/r1/rank-metrics", json=rank_body()) == 500
        caplog.clear()
        answer = fast.post("/runs/r1/rank-metrics", json=rank_body())
        assert answer.json() == {"error": "internal error (RuntimeError)"}
        (logged,) = [r for r in caplog.records if r.exc_info is not None]
        assert "POST /runs/r1/rank-metrics" in logged.getMessage()
        assert logged.exc_info is not None and str(logged.exc_info[1]) == "a bug"
