"""The write routes answered straight from ASGI, ahead of FastAPI's router.

Every write route is a FastAPI route too (``routes/writes.py``), which the OpenAPI schema
documents. A request to one of them is answered here instead, by the same code
(:func:`~.context.authorize`, then :func:`~.routes.writes.write`: body, command, apply)
and with the same error answers: FastAPI's routing across every route and its dependency
solving were most of the event loop's time per single event, and a single-event writer
(the public SDK's sync mode and async uploader) sends nothing else. A request this does
not take (another method, a trailing slash, a websocket) goes on to FastAPI unchanged;
an unexpected exception goes up to the server-error middleware, as from a route.
"""

from __future__ import annotations

import re

from starlette._utils import get_route_path
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from ..storage.records import StorageError
from .context import authorize
from .errors import ApiError, api_error_response, storage_error_response
from .routes.writes import write
from .write.table import ROUTES, RUN, WriteRoute


def _pattern(route: WriteRoute) -> re.Pattern[str]:
    return re.compile("^" + re.escape(route.path).replace(re.escape(RUN), "([^/]+)") + "$")


class WriteFastPath:
    """ASGI middleware: answers the write table's routes, passes everything else on."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._routes = [(route.method, _pattern(route), route) for route in ROUTES]

    def _find(self, scope: Scope) -> tuple[WriteRoute, str] | None:
        method, path = scope["method"], get_route_path(scope)
        for wanted, pattern, route in self._routes:
            if method == wanted and (match := pattern.match(path)) is not None:
                return route, match.group(1) if match.groups() else ""
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = self._find(scope) if scope["type"] == "http" else None
        if found is None:
            await self.app(scope, receive, send)
            return
        route, run_id = found
        request = Request(scope, receive)
        try:
            key = await authorize(request, "ingest")
            response = await write(request, route, run_id, key)
        except ApiError as exc:
            response = api_error_response(exc)
        except StorageError as exc:
            response = storage_error_response(exc)
        await response(scope, receive, send)
