"""The CLI's requests to a server: where it is, which key, and every failure as one line."""

from __future__ import annotations

from typing import Any

import httpx

from ..sdk import config
from ..sdk.http import json_body, open_client

ENV_HELP = (
    "The server and key: INSTANTML_API_BASE_URL (default: ~/.instantml/credentials, else"
    f" {config.DEFAULT_BASE_URL}) and INSTANTML_API_KEY (default: ~/.instantml/credentials)."
)


class CliError(Exception):
    """What went wrong, in one line for the terminal (printed as ``error: ...``)."""

    def __init__(self, message: str, code: int = 1, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.status = status  # the server's HTTP status, when it answered one


def base_url() -> str:
    return config.resolve_base_url(None)


def call(method: str, path: str, timeout: float = 60.0, **kwargs: Any) -> dict[str, Any]:
    """One request to the server; its JSON object, or CliError saying what went wrong."""
    url = base_url()
    key = config.resolve_api_key(None)
    try:
        with open_client(url, key, timeout) as client:
            response = client.request(method, path, **kwargs)
    except httpx.InvalidURL as exc:
        raise CliError(f"INSTANTML_API_BASE_URL {url!r} is not a URL: {exc}") from None
    except httpx.HTTPError as exc:
        cause = f"{type(exc).__name__}: {exc}".rstrip(": ")
        raise CliError(
            f"cannot reach the server at {url} ({cause}); is it running, and is"
            " INSTANTML_API_BASE_URL right?"
        ) from None
    if response.status_code == 204:  # done, nothing to say (a delete)
        return {}
    body = json_body(response)
    if not isinstance(body, dict) or (response.status_code >= 300 and "error" not in body):
        kind = response.headers.get("content-type", "no content type").split(";")[0]
        raise CliError(
            f"{url} did not answer as an InstantML server (HTTP {response.status_code},"
            f" {kind}); check INSTANTML_API_BASE_URL"
        )
    if response.status_code >= 300:
        hint = "; check INSTANTML_API_KEY" if response.status_code in (401, 403) else ""
        raise CliError(
            f"{response.status_code} from {url}: {body['error']}{hint}",
            status=response.status_code,
        )
    return body
