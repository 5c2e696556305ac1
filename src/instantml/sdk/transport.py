"""HTTP to the server: one keep-alive connection, retries that are safe by Idempotency-Key."""

from __future__ import annotations

import time
from typing import Any

import httpx
import orjson

from .. import _version
from ..protocol import is_final, is_monthly_limit
from .errors import InstantMLError


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
        headers = {
            "Content-Type": "application/json",
            "User-Agent": f"instantml-python/{_version.__version__}",
        }
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self.base_url = base_url
        self._client = httpx.Client(
            base_url=base_url, headers=headers, timeout=timeout, transport=transport
        )

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
        """Send, retrying network errors and transient answers (an Idempotency-Key in flight,
        a per-second 429, 5xx); raise InstantMLError otherwise, naming the address."""
        delay = 0.2
        for attempt in range(attempts):
            wait = delay
            try:
                response = self.send(method, path, body, idempotency_key)
            except httpx.HTTPError as exc:
                error: str = f"{method} {path}: cannot reach {self.base_url} ({exc})"
                retry = True
            else:
                status = response.status_code
                if status < 300:
                    return response.json()
                answer = _body(response)  # the request's body is sent again as it was
                error = f"{method} {self.base_url}{path}: {status} {_message(response, answer)}"
                scope = response.headers.get("x-instantml-ratelimit-scope")
                retry = not is_final(status, answer) and not is_monthly_limit(status, answer, scope)
                wait = max(delay, _retry_after(response))
            if (
                not retry
                or attempt == attempts - 1
                or (idempotency_key is None and method != "GET")
            ):
                raise InstantMLError(error)
            time.sleep(wait)
            delay *= 2
        raise InstantMLError(f"{method} {path}: gave up")  # unreachable

    def close(self) -> None:
        self._client.close()


def _retry_after(response: httpx.Response, most: float = 30.0) -> float:
    """The seconds a ``Retry-After`` header asks for (0 when none), at most ``most``."""
    try:
        return min(most, max(0.0, float(response.headers.get("retry-after", 0))))
    except ValueError:
        return 0.0


def _body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _message(response: httpx.Response, body: Any = None) -> str:
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return str(body["error"])
    return response.text[:200]
