"""The one sender core of async mode and the spool uploader: a batch of encoded events to
``POST /api/ingest``, and what its answer means, as a whole and for each event, by the one
retry policy (:mod:`.retry`). Async mode encodes the events it queued; the spool's lines
are already encoded and go as they are."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from ..protocol import UPLOAD_ORDER_HEADER
from .http import error_of, json_body
from .retry import Verdict, of_request

INGEST = "/api/ingest"


@dataclass(slots=True)
class Answer:
    """A batch's answer: its ``verdict`` as a whole (``DONE``: the batch was taken, and
    ``results`` holds each event's answer in order), the HTTP ``status`` (None when the
    server was not reached), what went wrong (``error``: the server's words, or the
    network's) and the server's Retry-After."""

    url: str
    verdict: Verdict
    status: int | None
    error: str = ""
    retry_after: str | None = None
    results: list[dict[str, Any]] | None = None

    @property
    def cause(self) -> str:
        """What went wrong, naming the server."""
        if self.status is None:
            return f"server unreachable at {self.url}: {self.error}"
        return f"server {self.url} answered {self.status}: {self.error}"


class IngestSender:
    def __init__(self, client: httpx.Client) -> None:
        self._client = client
        self.base_url = str(client.base_url).rstrip("/")

    def post(self, events: Sequence[bytes], position: str | None = None) -> Answer:
        """Send one batch (``position``: its place in an ordered upload session); never
        raises for what the network or the server did."""
        content = b'{"events":[' + b",".join(events) + b"]}"
        headers = {UPLOAD_ORDER_HEADER: position} if position else None
        try:
            response = self._client.post(INGEST, content=content, headers=headers)
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}".rstrip(": ")
            return Answer(self.base_url, Verdict.RETRY, None, error)
        status = response.status_code
        if status == 200:
            results = orjson.loads(response.content)["results"]
            return Answer(self.base_url, Verdict.DONE, status, results=results)
        body = json_body(response)
        verdict = of_request(status, body, response.headers.get("x-instantml-ratelimit-scope"))
        if verdict is Verdict.DONE:  # a 2xx other than 200 is not an ingest answer
            verdict = Verdict.REFUSED
        error = error_of(response, body)
        return Answer(self.base_url, verdict, status, error, response.headers.get("retry-after"))
