"""``instantml server``: take the port and the data dir, bootstrap, then serve until SIGTERM
or Ctrl-C.

The order matters to a user: the port is bound before anything touches the disk (a busy
port creates no data dir and prints no key), and the data dir is locked before its store is
opened (a second server on it says who holds it, instead of a storage engine's traceback).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import os
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import uvicorn
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors.multiprocess import Multiprocess

from ..settings import ServerSettings
from ..storage import open_stores, safe_url
from ..storage.protocols import Stores
from ..storage.records import StorageError
from .app import create_app
from .bootstrap import base_url, bootstrap, local_credentials

LOCK_FILE = "server.lock"


class StartError(Exception):
    """Why the server cannot start, in one line."""


def _listen(settings: ServerSettings) -> socket.socket:
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((settings.host, settings.port))
    except OSError as exc:
        sock.close()
        hint = (
            " (another server on it? choose one with --port)"
            if exc.errno == errno.EADDRINUSE
            else ""
        )
        raise StartError(
            f"cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}{hint}"
        ) from None
    sock.set_inheritable(True)
    return sock


@contextlib.contextmanager
def hold_data_dir(data_dir: Path) -> Iterator[None]:
    """Create the data dir and hold its lock (with our PID in it) for the server's life;
    the kernel drops the lock however the process ends."""
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise StartError(f"cannot use data dir {data_dir}: {exc.strerror or exc}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise StartError(
                f"data dir {data_dir} is in use by another instantml server (PID {holder})"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


def serve(settings: ServerSettings) -> None:
    if settings.workers < 1:
        raise StartError(f"--workers must be at least 1, got {settings.workers}")
    if settings.workers > 1 and not settings.shared_stores:
        raise StartError(
            f"--workers {settings.workers} needs stores every process shares: metadata on"
            " PostgreSQL and points on a ClickHouse server (postgresql://... and"
            f" clickhouse://...), not {_kind(settings.metadata_url)} and"
            f" {_kind(settings.points_url)} (see docs/deploy.md)"
        )
    sock = _listen(settings)
    try:
        # An embedded store is one process's: its data dir is locked. Shared stores take
        # any number of processes; the data dir only holds the admin key's file.
        if settings.shared_stores:
            _serve(settings, sock)
        else:
            with hold_data_dir(settings.data_dir):
                _serve(settings, sock)
    finally:
        sock.close()


def _kind(url: str) -> str:
    scheme = url.split("://", 1)[0]
    kinds = {"duckdb": "an embedded DuckDB file", "chdb": "chdb (in one process)"}
    return kinds.get(scheme, f"{scheme}://")


def _open(settings: ServerSettings) -> Stores:
    """The stores, or one line saying why they cannot be opened (unreachable, refused)."""
    try:
        if settings.shared_stores:
            settings.data_dir.mkdir(parents=True, exist_ok=True)
        return open_stores(settings.metadata_url, settings.points_url)
    except (StorageError, ImportError, ValueError, OSError) as exc:
        lines = str(exc).strip().splitlines()
        raise StartError(lines[0] if lines else type(exc).__name__) from None


def _serve(settings: ServerSettings, sock: socket.socket) -> None:
    stores = _open(settings)
    try:
        new_key = bootstrap(settings, stores.tenancy)
        url = base_url(settings)
        admin_file = settings.data_dir / "admin-key"
        if new_key is not None:
            print(f"Created the admin API key (shown once; also in {admin_file}):")
            print(f"  {new_key}")
        token = admin_file.read_text().strip() if admin_file.exists() else None
        for line in local_credentials(settings, token, created=new_key is not None):
            print(line)
        where = f"data: {settings.data_dir}"
        if settings.metadata_url_setting or settings.points_url_setting:
            where = f"metadata: {safe_url(settings.metadata_url)}, points: {safe_url(settings.points_url)}"
        processes = f", {settings.workers} processes" if settings.workers > 1 else ""
        print(f"InstantML server on {url}  ({where}{processes})")
        if token:
            print(f"Dashboard: {url}/?token={token}")
        sys.stdout.flush()
        if settings.workers > 1:
            stores.close()  # each process opens its own
            _serve_processes(settings, sock)
            return
        app = create_app(settings, stores)
        config = uvicorn.Config(app, log_level="warning", lifespan="on")
        # uvicorn shuts down gracefully on SIGTERM/SIGINT, then re-raises the signal to
        # whatever handler was there before it. Make that a no-op, so the stores close
        # below and a stop by signal exits 0.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: None)
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        stores.close()


def _serve_processes(settings: ServerSettings, sock: socket.socket) -> None:
    """``--workers N``: N processes on one socket, under uvicorn's supervisor (it replaces
    one that dies, and stops them all on SIGTERM or Ctrl-C). Each builds the app and opens
    the stores itself."""
    config = uvicorn.Config(
        functools.partial(create_app, settings),
        factory=True,
        workers=settings.workers,
        log_level="warning",
        lifespan="on",
    )
    supervisor = Multiprocess(config, sockets=[sock])
    supervisor.run()
    if any(process.exitcode == STARTUP_FAILURE for process in supervisor.processes):
        raise StartError("a server process failed to start (its error is above)")
