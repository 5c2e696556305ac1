"""Every error leaves the server as ``{"error": "<message naming the field>"}``."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from ..storage.records import StorageError
from .responses import JSONResponse

log = logging.getLogger(__name__)


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        headers: dict[str, str] | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers
        self.code = code  # machine-readable, where a status alone is ambiguous (protocol.py)

    def body(self) -> dict[str, str]:
        return (
            {"error": self.message}
            if self.code is None
            else {"error": self.message, "code": self.code}
        )


def bad_input(exc: Exception) -> ApiError:
    """A validation failure from :mod:`instantml.validation` as a 422 answer."""
    return ApiError(422, str(exc))


def api_error_response(exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


def storage_error_response(exc: StorageError) -> JSONResponse:
    # An engine down or refusing for now (its detail goes to the log, not the client).
    log.warning("storage unavailable: %s", exc)
    return JSONResponse({"error": "storage unavailable; retry"}, status_code=503)


def unexpected_response(request: Request, exc: Exception) -> JSONResponse:
    # A bug by definition (every input has its answer): the traceback goes to the log.
    log.error("internal error answering %s %s", request.method, request.url.path, exc_info=exc)
    return JSONResponse({"error": f"internal error ({type(exc).__name__})"}, status_code=500)


def _field_name(loc: tuple[object, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("query", "path", "body", "header")]
    return ".".join(parts) or "request"


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return api_error_response(exc)

    @app.exception_handler(HTTPException)
    async def _http_error(_: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse(
            {"error": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers
        )

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        message = f"{_field_name(tuple(first.get('loc', ())))}: {first.get('msg', 'invalid')}"
        return JSONResponse({"error": message}, status_code=422)

    @app.exception_handler(StorageError)
    async def _storage_error(_: Request, exc: StorageError) -> JSONResponse:
        return storage_error_response(exc)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        return unexpected_response(request, exc)
