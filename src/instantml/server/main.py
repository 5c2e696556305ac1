"""``instantml server``: bootstrap the data dir, then serve until SIGTERM or Ctrl-C."""

from __future__ import annotations

import gc
import signal
import sys

import uvicorn

from ..settings import ServerSettings
from ..storage import UsagePolicy, open_store
from .app import create_app
from .bootstrap import base_url, bootstrap, credentials_path


def serve(settings: ServerSettings) -> None:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    store = open_store(settings.store_url, UsagePolicy(settings.monthly_metric_points))
    try:
        new_key = bootstrap(settings, store)
        url = base_url(settings)
        if new_key is not None:
            print(
                f"Created the admin API key (shown once; also in {settings.data_dir / 'admin-key'}):"
            )
            print(f"  {new_key}")
            if credentials_path().exists():
                print(f"Local SDK credentials: {credentials_path()}")
        admin_file = settings.data_dir / "admin-key"
        token = admin_file.read_text().strip() if admin_file.exists() else None
        print(f"InstantML server on {url}  (data: {settings.data_dir})")
        if token:
            print(f"Dashboard: {url}/?token={token}")
        sys.stdout.flush()
        app = create_app(settings, store)
        # Everything alive now (modules, the app, caches) lives as long as the process: take
        # it out of the cyclic collector's reach. An ingest batch allocates tens of thousands
        # of containers, which triggers collections; a full one would otherwise walk this
        # whole heap every few batches (measured: a third of instantml sync's throughput).
        gc.freeze()
        config = uvicorn.Config(
            app, host=settings.host, port=settings.port, log_level="warning", lifespan="on"
        )
        # uvicorn shuts down gracefully on SIGTERM/SIGINT, then re-raises the signal to
        # whatever handler was there before it. Make that a no-op, so the stores close
        # below and a stop by signal exits 0.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: None)
        uvicorn.Server(config).run()
    finally:
        store.close()
