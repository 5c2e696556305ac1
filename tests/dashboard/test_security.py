"""The security review's checks: API keys kept hashed, the dashboard under a
Content-Security-Policy with no inline script, the sign-in token gone from the address bar
and the history, and no CORS."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import duckdb
import httpx

from instantml.server.process import ServerProcess


def test_keys_are_stored_hashed(start_server: Callable[..., ServerProcess], tmp_path: Any) -> None:
    data = tmp_path / "data"
    server = start_server(data)
    admin = {"Authorization": f"Bearer {server.admin_key}"}
    minted = httpx.post(f"{server.url}/api/keys", json={}, headers=admin).json()["key"]
    server.stop()
    secrets = [k.split("_", 2)[2] for k in (server.admin_key, minted)]
    con = duckdb.connect(str(data / "instantml.duckdb"), read_only=True)
    rows = con.execute("SELECT * FROM api_keys").fetchall()
    stored = repr(rows)
    for secret in secrets:
        assert secret not in stored
        assert hashlib.sha256(secret.encode()).hexdigest() in stored


def test_the_dashboard_runs_under_a_strict_csp(page: Any, server: ServerProcess) -> None:
    index = httpx.get(f"{server.url}/")
    csp = index.headers["content-security-policy"]
    assert (
        "script-src 'self';" in csp
        and "unsafe-inline" not in csp.split("script-src")[1].split(";")[0]
    )
    assert "<script>" not in index.text  # scripts only from files
    assert index.headers["referrer-policy"] == "no-referrer"
    page.goto(f"{server.url}/?token={server.admin_key}#/runs")
    page.wait_for_selector("main[data-ready=runs]")
    assert "token" not in page.url and server.admin_key not in page.url
    # The entry with the token was replaced: back is the blank page the tab opened on.
    assert page.evaluate("history.length") == 2
    page.go_back()
    assert page.url == "about:blank"
    page.go_forward()
    page.wait_for_selector("main[data-ready=runs]")
    assert "token" not in page.url
    # An inline script a key name might smuggle in would be refused by the policy.
    page.evaluate(
        "() => { const s = document.createElement('script');"
        " s.textContent = 'window.__inline = 1'; document.body.append(s); }"
    )
    assert page.evaluate("window.__inline") is None
    page.errors.clear()  # the refusal is reported as a console error: expected here


def test_no_cors(server: ServerProcess) -> None:
    origin = {"Origin": "http://evil.example"}
    answer = httpx.get(
        f"{server.url}/api/runs",
        headers={**origin, "Authorization": f"Bearer {server.admin_key}"},
    )
    assert answer.status_code == 200 and "access-control-allow-origin" not in answer.headers
    preflight = httpx.options(
        f"{server.url}/api/runs", headers={**origin, "Access-Control-Request-Method": "GET"}
    )
    assert "access-control-allow-origin" not in preflight.headers
