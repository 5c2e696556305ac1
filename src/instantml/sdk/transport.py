"""HTTP to the server: one keep-alive connection, retries that are safe by Idempotency-Key."""

from __future__ import annotations

import time
from typing import Any

import httpx
import orjson

from .. import _version
from .errors import InstantMLError

RETRY_STATUSES = frozenset({409, 429, 500, 502, 503, 504})


class Transport:
    def __init__(self, base_url: str, api_key: str | None, timeout: float = 10.0) -> None:
        headers = {
            "Content-Type": "application/json",
            "User-Agent": f"instantml-python/{_version.__version__}",
        }
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self.base_url = base_url
        self._client = httpx.Client(base_url=base_url, headers=headers, timeout=timeout)

    def send(
        self, method: str, path: str, body: Any, idempotency_key: str | None = None
    ) -> httpx.Response:
        """One attempt; transport failures raise ``httpx.HTTPError``."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return self._client.request(method, path, content=orjson.dumps(body), headers=headers)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        idempotency_key: str | None = None,
        attempts: int = 4,
    ) -> dict[str, Any]:
        """Send, retrying network errors and 409/429(second)/5xx; raise InstantMLError otherwise."""
        delay = 0.2
        for attempt in range(attempts):
            try:
                response = self.send(method, path, body, idempotency_key)
            except httpx.HTTPError as exc:
                error: str = f"{method} {path}: cannot reach {self.base_url} ({exc})"
                retry = True
            else:
                if response.status_code < 300:
                    return response.json()
                error = f"{method} {path}: {response.status_code} {_message(response)}"
                monthly = response.headers.get("x-instantml-ratelimit-scope") == "monthly"
                retry = response.status_code in RETRY_STATUSES and not monthly
            if (
                not retry
                or attempt == attempts - 1
                or (idempotency_key is None and method != "GET")
            ):
                raise InstantMLError(error)
            time.sleep(delay)
            delay *= 2
        raise InstantMLError(f"{method} {path}: gave up")  # unreachable

    def close(self) -> None:
        self._client.close()


def _message(response: httpx.Response) -> str:
    try:
        payload = response.json()
    except ValueError:
        return response.text[:200]
    if isinstance(payload, dict) and isinstance(payload.get("error"), str):
        return payload["error"]
    return response.text[:200]
