"""Large ``/api/ingest`` batches decoded in another process.

Decoding, checking and hashing a large batch is Python work that holds the GIL. Done on
the event loop, it runs while the writer thread commits the previous batch, and the
writer, which lets go of the GIL at every DuckDB call and every large numpy operation,
waits up to a switch interval to get it back each time, so its commits stretch. In a
decoding process the work runs beside the writer instead of against it, and what comes
back is columns (int64 keys, a float64 value matrix, lists of numbers): cheap to pickle.

Only batches of at least ``min_bytes`` go there (a small one costs less to decode than
to send), only once the process is up (it starts on the first large batch, which is
decoded here meanwhile), and a batch that is not plain rank events comes back as None,
to be taken event by event here. A decoding process that dies is replaced on the next
large batch; nothing it held was acknowledged.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from .commands import RankEvents
from .rank_batch import plain_batch

log = logging.getLogger(__name__)

MIN_BYTES = 512 * 1024  # about 2,000 rank events


def default_processes() -> int:
    """One decoding process per spare core, up to two (the writer, which they feed, is one
    thread: more would wait on it)."""
    return max(0, min(2, (os.cpu_count() or 1) - 1))


def _ready() -> bool:
    return True  # the process has imported the decoder (spawn imports the module)


def _watch_parent(server: int) -> None:
    """In a decoding process: exit when the server (pid ``server``) is gone. A server
    killed with SIGKILL never shuts its pool down, and the worker would wait on its queue
    for ever. The pid comes from the server: one killed while this process was still
    starting has already made it someone else's child."""

    def watch() -> None:
        while True:
            if os.getppid() != server:  # reparented: the server died
                os._exit(0)
            time.sleep(0.5)

    threading.Thread(target=watch, name="instantml-decoder-watch", daemon=True).start()


class BatchDecoder:
    def __init__(self, processes: int, min_bytes: int = MIN_BYTES) -> None:
        self.processes = processes
        self.min_bytes = min_bytes
        self._pool: ProcessPoolExecutor | None = None
        self._started: Future[bool] | None = None
        self.batches = 0  # decoded in a decoding process (plain or not)
        self.restarts = 0  # decoding processes replaced after one died

    async def decode(self, raw: bytes, org_id: int) -> tuple[list[str], RankEvents] | None:
        """(event ids, events) of a plain batch decoded in a decoding process; None when
        the caller decodes it itself: a small batch, no process (yet), not plain."""
        if not self.processes or len(raw) < self.min_bytes:
            return None
        if self._pool is None:
            self._start()
            return None
        assert self._started is not None
        if not self._started.done():
            return None
        failed = self._started.exception()
        if failed is not None:
            log.warning("no batch-decoding process (%s): decoding batches in this one", failed)
            self.processes = 0
            self._stop()
            return None
        loop = asyncio.get_running_loop()
        try:
            decoded = await loop.run_in_executor(self._pool, plain_batch, raw, org_id)
        except BrokenProcessPool:
            log.warning("a batch-decoding process died; starting another")
            self.restarts += 1
            self._stop()
            return None
        self.batches += 1
        return decoded

    def health(self) -> dict[str, int]:
        return {"processes": self.processes, "batches": self.batches, "restarts": self.restarts}

    def _start(self) -> None:
        # spawn, not fork: this process has threads (the writer's, DuckDB's).
        self._pool = ProcessPoolExecutor(
            self.processes,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_watch_parent,
            initargs=(os.getpid(),),
        )
        self._started = self._pool.submit(_ready)

    def _stop(self) -> None:
        pool, self._pool, self._started = self._pool, None, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
