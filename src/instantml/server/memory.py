"""Give the C heap's free pages back to the system now and then.

Ingest and the summaries allocate and free numpy buffers of a few hundred KB to tens of MB
from several threads. glibc's malloc keeps what is freed in its arenas (its mmap threshold
rises to the largest buffer freed, so such buffers stop being mapped and unmapped), and
what it keeps stays resident: in the soak runs (docs/reliability.md) the server's C heap
held more free memory than it used, the free part growing with the run.
``malloc_trim(0)`` returns every whole free page (the arenas' insides too, since glibc
2.8); a few ms each time, off the write path. Elsewhere (musl, macOS) this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from collections.abc import Callable

TRIM_SECONDS = 10.0


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


class HeapTrimmer:
    """A thread that trims the C heap every ``seconds`` (none where libc cannot)."""

    def __init__(self, seconds: float = TRIM_SECONDS) -> None:
        self._trim = _malloc_trim()
        self._seconds = seconds
        self._stop = threading.Event()
        self.trims = 0
        self._thread: threading.Thread | None = None
        if self._trim is not None:
            self._thread = threading.Thread(target=self._run, name="instantml-trim", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        assert self._trim is not None
        while not self._stop.wait(self._seconds):
            self._trim(0)
            self.trims += 1

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
