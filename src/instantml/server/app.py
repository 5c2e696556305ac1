"""The ASGI application: routes, auth, the writer thread, error shapes."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from .. import dashboard
from .._version import __version__
from ..settings import ServerSettings
from ..storage import Store, UsagePolicy, open_store
from . import errors
from .auth import KeyRing
from .idempotency import InFlight
from .responses import JSONResponse
from .routes import admin, ingest, metrics, runs, summary
from .upload_order import UploadOrder
from .writer import GroupCommitter


def create_app(settings: ServerSettings, store: Store | None = None) -> FastAPI:
    """Build the app; it opens ``settings.store_url`` at startup unless given a store."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        opened = (
            store
            if store is not None
            else open_store(settings.store_url, UsagePolicy(settings.monthly_metric_points))
        )
        app.state.store = opened
        app.state.keys = KeyRing(opened)
        app.state.writer = GroupCommitter(opened)
        app.state.in_flight = InFlight()
        app.state.upload_order = UploadOrder()
        try:
            yield
        finally:
            app.state.writer.close()
            if store is None:
                opened.close()

    app = FastAPI(
        title="InstantML",
        version=__version__,
        summary="Experiment tracking with per-rank metrics for distributed training",
        default_response_class=JSONResponse,
        lifespan=lifespan,
    )
    app.state.settings = settings
    errors.install(app)
    app.include_router(runs.router)
    app.include_router(metrics.router)
    app.include_router(ingest.router)
    app.include_router(summary.router)
    app.include_router(admin.router)
    dashboard.install(app)

    @app.get("/healthz", include_in_schema=True)
    async def healthz() -> dict[str, str | int]:
        # The pid lets a launcher (the demo, the tests) tell its own child's answer from
        # another server's on the same port.
        return {"status": "ok", "version": __version__, "pid": os.getpid()}

    return app
