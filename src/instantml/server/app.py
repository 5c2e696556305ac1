"""The ASGI application: routes, auth, the write path, error shapes."""

from __future__ import annotations

import gc
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from starlette.types import Receive, Scope, Send

from .. import dashboard
from .._version import __version__
from ..health.monitor import HealthMonitor
from ..health.webhooks import Deliverer
from ..settings import ServerSettings
from ..storage import open_stores
from ..storage.protocols import Stores
from . import errors, schemas, unsupported
from .auth import KeyRing
from .context import Services, services
from .fastpath import WriteFastPath
from .memory import HeapTrimmer
from .ratelimit import RateLimiter
from .responses import JSONResponse
from .routes import admin, health, ingest, metrics, runs, summary, writes
from .write.committer import GroupCommitter
from .write.decode_pool import BatchDecoder, default_processes
from .write.deletion import Deleter
from .write.guardrail import UsagePolicy
from .write.service import WriteService
from .write.upload_order import UploadOrder


class InstantML(FastAPI):
    """FastAPI, with the write table's routes answered ahead of its middleware and router
    (``fast_path``; None: every request goes through FastAPI, as the tests compare)."""

    fast_path: WriteFastPath | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        fast = self.fast_path
        found = None if fast is None else fast.find(scope)
        if fast is None or found is None:
            await super().__call__(scope, receive, send)
        else:
            await fast.answer(self, found, scope, receive, send)


def create_app(settings: ServerSettings, stores: Stores | None = None) -> InstantML:
    """Build the app; it opens the stores the settings name at startup unless given them."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        opened = stores or open_stores(settings.metadata_url, settings.points_url)
        service = WriteService(opened, UsagePolicy(settings.monthly_metric_points))
        deleter = Deleter(opened, settings.retention_days, settings.retention_check_seconds)
        writer = GroupCommitter(service, deleter=deleter)
        processes = settings.decode_processes
        decoder = BatchDecoder(
            default_processes() if processes is None else processes, settings.decode_min_bytes
        )
        deliverer = Deliverer(opened.health)
        monitor = HealthMonitor(
            opened, settings.health, on_opened=deliverer.wake, pause=writer.wait_quiet,
            public_url=settings.public_url,
        )  # fmt: skip
        service.on_points = monitor.touched
        deleter.on_deleted = monitor.forget
        trimmer = HeapTrimmer()
        app.state.services = Services(
            decoder=decoder,
            monitor=monitor,
            limiter=RateLimiter(settings.rate_limit),
            settings=settings,
            stores=opened,
            keys=KeyRing(opened.tenancy),
            service=service,
            writer=writer,
            upload_order=UploadOrder(opened.ledger),
        )
        # Everything alive now (modules, the app, caches) lives as long as the process: take
        # it out of the cyclic collector's reach. An ingest batch allocates tens of thousands
        # of containers, which triggers collections; a full one would otherwise walk this
        # whole heap every few batches, a large share of an upload's time.
        gc.freeze()
        try:
            yield
        finally:
            decoder.close()
            writer.close()
            monitor.close()
            deliverer.close()
            trimmer.close()
            if stores is None:
                opened.close()

    app = InstantML(
        title="InstantML",
        version=__version__,
        summary="Experiment tracking with per-rank metrics for distributed training",
        default_response_class=JSONResponse,
        lifespan=lifespan,
    )
    app.state.settings = settings  # read before startup (body limits, the dashboard)
    errors.install(app)
    app.fast_path = WriteFastPath()
    app.include_router(writes.router)
    app.include_router(runs.router)
    app.include_router(metrics.router)
    app.include_router(ingest.router)
    app.include_router(summary.router)
    app.include_router(health.router)
    app.include_router(admin.router)
    app.include_router(unsupported.router)  # last: 501s for the public SDK's other features
    dashboard.install(app)

    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = schemas.complete(generate())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.get("/healthz", include_in_schema=True)
    async def healthz(request: Request) -> dict[str, Any]:
        # The pid lets a launcher (the demo, the tests) tell its own child's answer from
        # another server's on the same port: the process it started, which is the parent
        # of this one under --workers. worker_pid is the process that answered.
        pid = os.getppid() if settings.workers > 1 else os.getpid()
        return {
            "status": "ok",
            "version": __version__,
            "pid": pid,
            "worker_pid": os.getpid(),
            "batch_decoder": services(request).decoder.health(),
        }

    return app
