"""HTTP to the server for sync calls: one keep-alive connection, retries that are safe by
Idempotency-Key."""

from __future__ import annotations

import time
from typing import Any

import httpx
import orjson

from .errors import InstantMLError
from .http import error_of, json_body, open_client
from .retry import Backoff, Verdict, of_request


class Transport:
    """``transport``: an httpx transport to send through instead of the network (tests point
    it at an ASGI app, or at one that injects faults)."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        timeout: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url
        self._client = open_client(base_url, api_key, timeout, transport)

    @property
    def client(self) -> httpx.Client:
        return self._client

    def send(
        self, method: str, path: str, body: Any, idempotency_key: str | None = None
    ) -> httpx.Response:
        """One attempt; transport failures raise ``httpx.HTTPError``."""
        return self.send_bytes(method, path, orjson.dumps(body), idempotency_key)

    def send_bytes(
        self, method: str, path: str, content: bytes, idempotency_key: str | None = None
    ) -> httpx.Response:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return self._client.request(method, path, content=content, headers=headers)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        idempotency_key: str | None = None,
        attempts: int = 4,
    ) -> dict[str, Any]:
        """Send, retrying network errors and transient answers (an Idempotency-Key in flight,
        a per-second 429, 5xx); raise InstantMLError otherwise, naming the address."""
        backoff = Backoff(first=0.2, most=30.0)
        content = orjson.dumps(body)  # a retry sends the same bytes
        for attempt in range(attempts):
            retry_after = None
            try:
                response = self.send_bytes(method, path, content, idempotency_key)
            except httpx.HTTPError as exc:
                error: str = f"{method} {path}: cannot reach {self.base_url} ({exc})"
                retry = True
            else:
                status = response.status_code
                if status < 300:
                    return response.json()
                answer = json_body(response)
                error = f"{method} {self.base_url}{path}: {status} {error_of(response, answer)}"
                scope = response.headers.get("x-instantml-ratelimit-scope")
                retry = of_request(status, answer, scope) is Verdict.RETRY
                retry_after = response.headers.get("retry-after")
            if (
                not retry
                or attempt == attempts - 1
                or (idempotency_key is None and method != "GET")
            ):
                raise InstantMLError(error)
            time.sleep(backoff.next(retry_after))
        raise InstantMLError(f"{method} {path}: gave up")  # unreachable

    def close(self) -> None:
        self._client.close()
