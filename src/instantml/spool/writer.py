"""The training side of spool mode: append one JSON line per event, never touch the network.

``submit`` is one ``orjson.dumps`` and one ``os.write`` on an ``O_APPEND`` descriptor: when it
returns, the line is in the kernel, so a SIGKILL afterwards loses nothing. ``fsync`` (which
protects against a machine crash, not a process kill) follows the policy: ``"periodic"``
(default: a background thread, once a second), ``"event"`` (every call; far slower) or
``"none"``. A full disk or an unwritable spool never raises into training: lost events are
counted and warned about once.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

import orjson

from ..sdk.records import CREATE_RUN
from . import segments

FSYNC_POLICIES = ("periodic", "event", "none")
FORMAT_VERSION = 1


class SpoolWriter:
    def __init__(
        self,
        spool_dir: str | os.PathLike[str],
        run_id: str,
        fsync: str = "periodic",
        fsync_interval: float = 1.0,
    ) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync must be one of {', '.join(FSYNC_POLICIES)}, got {fsync!r}")
        self.spool_dir = Path(spool_dir)
        self.run_id = run_id
        self.lost = 0
        self._fsync_each = fsync == "event"
        self._interval = fsync_interval if fsync == "periodic" else 0.0
        self._warned = False
        self._closed = False
        self._fd = -1
        self.path: Path | None = None
        self._open()
        self._stop = threading.Event()
        self._syncer: threading.Thread | None = None
        if self._interval and self._fd >= 0:
            self._syncer = threading.Thread(
                target=self._sync_loop, name="instantml-spool-fsync", daemon=True
            )
            self._syncer.start()
        os.register_at_fork(after_in_child=self._after_fork)

    def _open(self) -> None:
        self._prefix = uuid.uuid4().hex
        self._sequence = itertools.count(1)
        try:
            fd, path = segments.open_segment(self.spool_dir)
        except OSError as exc:
            self._fd = -1
            self._warn(f"cannot open a spool segment in {self.spool_dir}: {exc}")
            return
        self._fd, self.path = fd, path

    def _after_fork(self) -> None:
        # A forked child (a DataLoader worker, say) must not append to its parent's segment;
        # closing its copy of the descriptor leaves the parent's lock in place.
        if self._closed:
            return
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = -1
        self._syncer = None
        self._open()

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"instantml: {message}; spooled events are being lost (counted in"
                " run.dropped_events)",
                RuntimeWarning,
                stacklevel=4,
            )

    def create_run(self, body: dict[str, Any]) -> None:
        """The run's creation, the segment's first line (the wire's ``POST /runs`` event,
        as every line is an event: the uploader knows a creation by that request)."""
        self.submit(*CREATE_RUN, body)

    # ---- the hot path ----

    def submit(self, method: str, path: str, body: dict[str, Any]) -> None:
        seq = next(self._sequence)
        line = (
            orjson.dumps(
                {
                    "version": FORMAT_VERSION,
                    "event_id": f"{self._prefix}-{seq}",
                    "sequence": seq,
                    "run_id": self.run_id,
                    "timestamp": time.time(),
                    "request": {"method": method, "path": path, "body": body},
                }
            )
            + b"\n"
        )
        fd = self._fd
        if fd < 0:
            self.lost += 1
            return
        try:
            written = os.write(fd, line)
        except OSError as exc:  # ENOSPC, EFBIG (RLIMIT_FSIZE), EIO...
            self.lost += 1
            self._warn(f"cannot write to the spool ({exc})")
            return
        if written != len(line):
            # A short write (the disk filled mid-line): end the fragment so that the next
            # line starts clean; the uploader skips the fragment as torn.
            self.lost += 1
            self._warn("the spool's disk is full")
            try:
                os.write(fd, b"\n")
            except OSError:
                pass
            return
        if self._fsync_each:
            os.fsync(fd)

    # ---- durability ----

    def _sync_loop(self) -> None:
        while not self._stop.wait(self._interval):
            self._fsync()

    def _fsync(self) -> None:
        fd = self._fd
        if fd >= 0:
            try:
                os.fsync(fd)
            except OSError:
                pass

    @property
    def dropped(self) -> int:
        return self.lost

    def flush(self, timeout: float) -> bool:
        self._fsync()
        return self.lost == 0

    def close(self, timeout: float) -> bool:
        self._closed = True
        self._stop.set()
        self._fsync()
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)  # drops the writer lock: the uploader may now finish this segment
        return self.lost == 0
