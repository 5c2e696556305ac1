"""Requests the public 0.1.1 SDK can send that this server does not serve: each answered
501 with the feature it belongs to (docs/sdk-requests.md lists every request, served or
not), on its own route and inside ``/api/ingest`` alike, never a bare 404 or 405."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Request

from .responses import JSONResponse

# (methods, path template, the feature as a user knows it)
UNSUPPORTED: list[tuple[tuple[str, ...], str, str]] = [
    (("POST",), "/api/runs/{run_id}/objects", "rich objects (images, audio, video, tables)"),
    (("POST",), "/api/runs/{run_id}/artifacts", "artifacts"),
    (("POST",), "/api/runs/{run_id}/artifacts/upload", "artifacts"),
    (("POST",), "/api/runs/{run_id}/artifact-uploads", "artifacts"),
    (("POST",), "/api/runs/{run_id}/artifact-inputs", "artifacts"),
    (("POST",), "/api/artifact-uploads/{session}/renew", "artifacts"),
    (("POST",), "/api/artifact-uploads/{session}/complete", "artifacts"),
    (("POST",), "/api/artifact-uploads/{session}/abort", "artifacts"),
    (("GET",), "/api/artifact-versions/resolve", "artifacts"),
    (("GET", "DELETE"), "/api/artifact-versions/{version}", "artifacts"),
    (("GET",), "/api/artifact-versions/{version}/manifest", "artifacts"),
    (("PUT", "DELETE"), "/api/artifact-collections/{collection}/aliases/{alias}", "artifacts"),
    (("POST",), "/api/runs/{run_id}/forks", "run forks"),
    (("GET",), "/api/runs/summary", "run search (Client.list_runs; use GET /api/runs)"),
    (("POST",), "/api/imports/jobs", "run imports"),
    (("POST",), "/api/imports/jobs/{job}/chunks", "run imports"),
    (("POST",), "/api/imports/jobs/{job}/commit", "run imports"),
    (("POST",), "/api/auth/device-code/start", "device-code login (use an API key)"),
    (("POST",), "/api/auth/device-code/poll", "device-code login (use an API key)"),
]

_PATTERNS = [
    (methods, re.compile("^" + re.sub(r"\{[^}]+\}", "[^/]+", template) + "$"), feature)
    for methods, template, feature in UNSUPPORTED
]


def message(feature: str) -> str:
    return f"{feature} is not supported by this server"


def feature_of(path: str) -> str | None:
    """The unsupported feature this path belongs to (any method), or None."""
    bare = "/" + path.split("?", 1)[0].strip("/")
    for _, pattern, feature in _PATTERNS:
        if pattern.match(bare):
            return feature
    return None


router = APIRouter()


def _answer(feature: str) -> Callable[[Request], Awaitable[JSONResponse]]:
    async def answer(request: Request) -> JSONResponse:
        return JSONResponse({"error": message(feature)}, status_code=501)

    return answer


for _methods, _template, _feature in UNSUPPORTED:
    router.add_api_route(
        _template, _answer(_feature), methods=list(_methods), status_code=501,
        include_in_schema=False,
    )  # fmt: skip
