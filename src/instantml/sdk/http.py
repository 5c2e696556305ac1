"""The client side's HTTP: one way to open a client to the server (its address, key,
timeouts and ``User-Agent: instantml/<version>``), and one way to read an answer's error,
for the SDK's sync and async modes, the spool uploader and the CLI."""

from __future__ import annotations

from typing import Any

import httpx

from .._version import __version__

USER_AGENT = f"instantml/{__version__}"


def open_client(
    base_url: str,
    api_key: str | None,
    timeout: float | httpx.Timeout = 10.0,
    transport: httpx.BaseTransport | None = None,
) -> httpx.Client:
    """A keep-alive client to the server. ``transport``: an httpx transport to send through
    instead of the network (tests point it at an ASGI app, or one that injects faults)."""
    headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return httpx.Client(base_url=base_url, headers=headers, timeout=timeout, transport=transport)


def json_body(response: httpx.Response) -> Any:
    """The answer's JSON, or None when it is not JSON (a proxy's page, a cut body)."""
    try:
        return response.json()
    except ValueError:
        return None


def error_of(response: httpx.Response, body: Any = None) -> str:
    """What the server said went wrong: its body's ``error``, else the start of the text."""
    if isinstance(body, dict) and "error" in body:
        return str(body["error"])
    return response.text[:200]
