"""The write routes answered straight from ASGI, ahead of FastAPI.

Every write route is a FastAPI route too (``routes/writes.py``), which the OpenAPI schema
documents. A request to one of them is answered here instead, by the same code
(:func:`~.context.authorize`, then :func:`~.routes.writes.write`: body, command, apply)
and with the same error answers. The app (:class:`~.app.InstantML`) asks this before its
middleware stack: FastAPI's routing across every route and its dependency solving were
most of the event loop's time per single event, and what stands in front of the router
(the telemetry check, the error and body-limit middleware) most of the rest; a
single-event writer (the public SDK's sync mode and async uploader) sends nothing else.
The route's own body limit (``body.read_body``) is the one that applies. A request this
does not take (another method, a trailing slash, a websocket) goes on to FastAPI
unchanged; an unexpected exception is answered as FastAPI's error middleware answers a
route's (:func:`~.errors.unexpected_response`).
"""

from __future__ import annotations

import re

from starlette._utils import get_route_path
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from ..storage.records import StorageError
from .context import authorize
from .errors import ApiError, api_error_response, storage_error_response, unexpected_response
from .routes.writes import write
from .write.table import ROUTES, RUN, WriteRoute

Found = tuple[WriteRoute, str]


def _pattern(route: WriteRoute) -> re.Pattern[str]:
    return re.compile("^" + re.escape(route.path).replace(re.escape(RUN), "([^/]+)") + "$")


class WriteFastPath:
    """Finds the write table's route of a request, and answers it."""

    def __init__(self) -> None:
        self._routes = [(route.method, _pattern(route), route) for route in ROUTES]

    def find(self, scope: Scope) -> Found | None:
        """The write route and run id a request is for (None: not a write route's)."""
        if scope["type"] != "http":
            return None
        method, path = scope["method"], get_route_path(scope)
        for wanted, pattern, route in self._routes:
            if method == wanted and (match := pattern.match(path)) is not None:
                return route, match.group(1) if match.groups() else ""
        return None

    async def answer(
        self, app: ASGIApp, found: Found, scope: Scope, receive: Receive, send: Send
    ) -> None:
        route, run_id = found
        scope["app"] = app  # what Starlette sets: the services are the app's state
        request = Request(scope, receive)
        try:
            key = await authorize(request, "ingest")
            response = await write(request, route, run_id, key)
        except ApiError as exc:
            response = api_error_response(exc)
        except StorageError as exc:
            response = storage_error_response(exc)
        except Exception as exc:
            response = unexpected_response(request, exc)
        # Sending may fail only when the client has gone (uvicorn's to log, as from a route).
        await response(scope, receive, send)
